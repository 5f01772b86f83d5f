// ibv_import_device, ibv_import_pd, ibv_import_mr, ibv_import_dm and the
// unimports.
//
// The kernel finds the device behind a cmd_fd by its character device; an
// emulated context's cmd_fd is a memfd (device.cc), so the library keeps
// which open context each memfd (by inode) belongs to. A dup of it, here or
// in a fork child, is the same inode; an fd passed from another process is
// too, but that process is another emulated host whose device instance
// lives in its own memory, so it cannot be shared (docs/import.md).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "emulator/base/log.h"
#include "provider/provider.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {
namespace {

using FileKey = std::pair<dev_t, ino_t>;

struct Opened {
  ibv_context* context;
  pid_t pid;  // a fork child inherits this table, not the device instance
};

std::mutex g_mu;
auto& g_files = *new std::map<FileKey, std::vector<Opened>>();  // guarded by g_mu

bool KeyOf(int fd, FileKey* key, struct stat* st) {
  if (::fstat(fd, st) != 0) return false;
  *key = {st->st_dev, st->st_ino};
  return true;
}

// What /proc says `fd` is ("/memfd:rdmaemu-emu0 (deleted)" for one of ours).
std::string FdTarget(int fd) {
  char buf[256];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// The open context of this process behind `cmd_fd`, or NULL with errno set
// and a line saying why.
ibv_context* ContextBehind(int cmd_fd) {
  FileKey key;
  struct stat st;
  if (!KeyOf(cmd_fd, &key, &st)) {
    Log().warn("ibv_import_device: cmd_fd {} is not an open descriptor: EINVAL", cmd_fd);
    errno = EINVAL;
    return nullptr;
  }
  pid_t other_pid = 0;
  {
    std::lock_guard lock(g_mu);
    auto it = g_files.find(key);
    if (it != g_files.end()) {
      for (const Opened& o : it->second) {
        if (o.pid == ::getpid()) return o.context;
        other_pid = o.pid;
      }
    }
  }
  if (other_pid != 0) {
    Log().warn("ibv_import_device: cmd_fd {} belongs to a context process {} opened before it "
               "forked this one; the device instance and its objects live in that process (its "
               "memory and engine thread), which a fork does not share: open the device afresh "
               "here (ibv_open_device): EOPNOTSUPP", cmd_fd, other_pid);
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (FdTarget(cmd_fd).rfind("/memfd:rdmaemu-", 0) == 0) {
    Log().warn("ibv_import_device: cmd_fd {} is an rdmaemu context's, but of none open in this "
               "process: it was closed (its objects went with it), or the fd came from another "
               "process, which is another emulated host whose device instance cannot be shared: "
               "EOPNOTSUPP", cmd_fd);
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // As rdma-core: a descriptor that is no character device is EINVAL; one
  // that is no RDMA device's is ENODEV.
  const bool chr = S_ISCHR(st.st_mode);
  Log().warn("ibv_import_device: cmd_fd {} ({}) is not the cmd_fd of an rdmaemu context: {}", cmd_fd,
             FdTarget(cmd_fd), chr ? "ENODEV" : "EINVAL");
  errno = chr ? ENODEV : EINVAL;
  return nullptr;
}

}  // namespace

void RegisterCmdFd(ibv_context* context) {
  FileKey key;
  struct stat st;
  if (!KeyOf(context->cmd_fd, &key, &st)) return;
  std::lock_guard lock(g_mu);
  g_files[key].push_back({context, ::getpid()});
}

void ForgetCmdFd(ibv_context* context) {
  std::lock_guard lock(g_mu);
  for (auto it = g_files.begin(); it != g_files.end();) {
    auto& opened = it->second;
    std::erase_if(opened, [&](const Opened& o) { return o.context == context; });
    it = opened.empty() ? g_files.erase(it) : std::next(it);
  }
}

}  // namespace rdmaemu::verbs

using namespace rdmaemu;
using namespace rdmaemu::verbs;
using rdmaemu::provider::Kind;
using rdmaemu::provider::LiveHandle;

extern "C" {

// The new context owns `cmd_fd` (closed by ibv_close_device), as in rdma-core.
ibv_context* ibv_import_device(int cmd_fd) {
  ibv_context* original = ContextBehind(cmd_fd);
  if (original == nullptr) return nullptr;
  return OpenContext(original->device, cmd_fd, original);
}

ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  if (!LiveHandle(context, Kind::kContext, "ibv_import_pd")) return FailWith<ibv_pd>(kNoSuchObject);
  auto pd = provider::ImportPd(context, pd_handle);
  if (!pd.ok()) return FailWith<ibv_pd>(pd.status().code());
  return *pd;
}

ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (!LiveHandle(pd, Kind::kPd, "ibv_import_mr")) return FailWith<ibv_mr>(kNoSuchObject);
  auto mr = provider::ImportMr(pd, mr_handle);
  if (!mr.ok()) return FailWith<ibv_mr>(mr.status().code());
  return *mr;
}

ibv_dm* ibv_import_dm(ibv_context* context, uint32_t dm_handle) {
  if (!LiveHandle(context, Kind::kContext, "ibv_import_dm")) return FailWith<ibv_dm>(kNoSuchObject);
  auto dm = provider::ImportDm(context, dm_handle);
  if (!dm.ok()) return FailWith<ibv_dm>(dm.status().code());
  return *dm;
}

// Void: a bad argument is logged and ignored. A view whose object was
// destroyed through another view is still accepted here, and only here.
void ibv_unimport_pd(ibv_pd* pd) {
  if (!provider::AckableHandle(pd, Kind::kPd, "ibv_unimport_pd")) return;
  provider::UnimportPd(pd);
}

void ibv_unimport_mr(ibv_mr* mr) {
  if (!provider::AckableHandle(mr, Kind::kMr, "ibv_unimport_mr")) return;
  provider::UnimportMr(mr);
}

void ibv_unimport_dm(ibv_dm* dm) {
  if (!provider::AckableHandle(dm, Kind::kDm, "ibv_unimport_dm")) return;
  provider::UnimportDm(dm);
}

}  // extern "C"
