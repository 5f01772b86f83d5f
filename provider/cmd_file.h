// What a context's cmd_fd stands for: the kernel's per-file table of
// object handles. A context opened with ibv_open_device has a file of its
// own; one made by ibv_import_device(cmd_fd) shares the file of the context
// that fd came from, and so its PDs, MRs and DMs: ibv_import_pd,
// ibv_import_mr and ibv_import_dm look their handles up here.
//
// A PD, MR or DM can be named by several ibv_* structs at once (the one that
// created it and each import of it): its views. Destroying it through any
// view destroys it for all, as the kernel destroys the object behind the
// handle; releasing one view (ibv_unimport_*) leaves the object alone.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace rdmaemu::provider {

struct Pd;
struct Mr;
struct Dm;

// Views by handle; T has `ibv` (with a context) as its first member.
template <typename T>
class Views {
 public:
  void Add(uint32_t handle, T* view) {
    std::lock_guard lock(mu_);
    by_handle_.emplace(handle, view);
  }
  // One view goes (unimported, or destroyed with its context).
  void Remove(uint32_t handle, T* view) {
    std::lock_guard lock(mu_);
    auto [first, last] = by_handle_.equal_range(handle);
    for (auto it = first; it != last; ++it) {
      if (it->second == view) {
        by_handle_.erase(it);
        return;
      }
    }
  }
  // The object is destroyed: every view of it goes.
  std::vector<T*> TakeAll(uint32_t handle) {
    std::lock_guard lock(mu_);
    std::vector<T*> out;
    auto [first, last] = by_handle_.equal_range(handle);
    for (auto it = first; it != last; ++it) out.push_back(it->second);
    by_handle_.erase(first, last);
    return out;
  }
  // Runs `use` on a view of `handle` under the table's lock (so that no
  // destroy frees it meanwhile); false if there is none.
  bool With(uint32_t handle, const std::function<void(T&)>& use) {
    std::lock_guard lock(mu_);
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) return false;
    use(*it->second);
    return true;
  }
  // The views `context` holds go with it (its ibv_close_device).
  void Forget(ibv_context* context) {
    std::lock_guard lock(mu_);
    for (auto it = by_handle_.begin(); it != by_handle_.end();) {
      it = it->second->ibv.context == context ? by_handle_.erase(it) : std::next(it);
    }
  }

 private:
  std::mutex mu_;
  std::unordered_multimap<uint32_t, T*> by_handle_;  // guarded by mu_
};

struct CmdFile {
  Views<Pd> pds;  // PDs only: a parent domain is no kernel object and has no handle of its own
  Views<Mr> mrs;  // by ibv_mr.handle (the lkey)
  Views<Dm> dms;  // by ibv_dm.handle
};

}  // namespace rdmaemu::provider
