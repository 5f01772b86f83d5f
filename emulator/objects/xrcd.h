// XRC domains (IBA 11.2.11): the scope in which an XRC target QP may deliver
// into an XRC SRQ. A domain opened with a file is found again by the file's
// inode, as the kernel's uverbs finds it (ibv_open_xrcd(3)): every open of
// the same file on the same device instance gives the same domain, until the
// last holder lets go. Here a device instance is a process's engine, so the
// file shares a domain between the contexts of one process; another process
// is another emulated host with domains of its own, as two hosts are.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "emulator/base/status.h"

namespace rdmaemu::objects {

// A domain, alive while anyone holds it (an XRCD handle, an XRC SRQ, an XRC
// target QP: each holds a reference, as each holds a use count in the kernel).
struct XrcDomain {
  uint32_t number = 0;  // device-unique, never 0
};

class XrcdTable {
 public:
  // The file that names a shared domain: its inode.
  struct FileKey {
    dev_t dev = 0;
    ino_t ino = 0;
    auto operator<=>(const FileKey&) const = default;
  };
  // The kernel's rules (ib_uverbs_open_xrcd): without a file, a new private
  // domain; with one, its domain, created only with `create` (O_CREAT: else
  // EAGAIN), and refused if it exists and `exclusive` (O_EXCL: EINVAL). The
  // errors carry a sentence.
  Result<std::shared_ptr<const XrcDomain>> Open(std::optional<FileKey> file, bool create,
                                                bool exclusive);

 private:
  std::mutex mu_;
  std::map<FileKey, std::weak_ptr<const XrcDomain>> by_file_;  // guarded by mu_
  uint32_t next_ = 1;                                          // guarded by mu_
};

}  // namespace rdmaemu::objects
