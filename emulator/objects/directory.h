// Directory: the numbers by which the control plane names a device's
// objects (`rdmaemu list`, `rdmaemu event qp_fatal --qp 17`).
//
// The provider registers each QP and WQ (under its QPN / WQN), CQ and SRQ
// (under a small device-unique number the directory assigns) with the handle its
// events carry, and removes it when the application destroys it, before the
// object's queued events are discarded.
//
// Thread safety: every member may be called from any thread. With() runs its
// function while the object cannot be removed: Remove() waits for it, so an
// event raised from the control thread never names an object that is being
// freed (Remove returns only once no With() on it is running).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::objects {

enum class ObjectKind : uint8_t { kQp, kCq, kSrq, kWq };

// "qp", "cq", "srq", "wq": the words the control commands use.
std::string_view ToString(ObjectKind kind);

struct ObjectInfo {
  ObjectKind kind;
  uint32_t number;
  std::string details;  // what Describe said, e.g. "RC RTS"
};

class Directory {
 public:
  // Called for `rdmaemu list`, under the directory's lock: it must not call
  // back into the directory.
  using Describe = std::function<std::string()>;

  // Registers an object. With `number` (QPs and WQs: their QPN / WQN) it is registered
  // under it (EEXIST if taken); without, it gets the next free number of its
  // kind, counting from 1.
  Result<uint32_t> Add(ObjectKind kind, uint64_t handle, Describe describe = {},
                       std::optional<uint32_t> number = std::nullopt);
  // Unregisters; waits until no With() on the object is running.
  void Remove(ObjectKind kind, uint32_t number);
  // Runs fn(handle) while the object stays registered; ENOENT if it is not.
  Status With(ObjectKind kind, uint32_t number, const std::function<void(uint64_t handle)>& fn) const;
  // Every registered object, by kind then number.
  std::vector<ObjectInfo> List() const;

 private:
  struct Entry {
    uint64_t handle;
    Describe describe;
  };
  using Key = std::pair<ObjectKind, uint32_t>;

  mutable std::shared_mutex mu_;
  std::map<Key, Entry> entries_;  // guarded by mu_
  uint32_t next_[4] = {1, 1, 1, 1};  // per kind; guarded by mu_
};

}  // namespace rdmaemu::objects
