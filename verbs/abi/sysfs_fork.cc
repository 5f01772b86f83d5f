// sysfs helpers, fork helpers and Ethernet L2 resolution.
//
// sysfs: rdmaemu's devices have no sysfs entries (verbs/core answers every
// question the real library would read from sysfs), but these two exported
// helpers are generic and librdmacm and ibv_devinfo call them, so they behave
// exactly like rdma-core's: the path honours SYSFS_PATH, and reading a file
// really reads it.
//
// fork: rdma-core's fork support exists because the kernel pins registered
// memory for DMA, and after fork() a copy-on-write fault would leave the
// device writing into a page the parent no longer maps; ibv_fork_init marks
// registered ranges MADV_DONTFORK. rdmaemu's "device" reaches memory through
// the process's own virtual addresses, so whichever page the parent ends up
// with is the one it uses: nothing is pinned and nothing is needed. We answer
// as rdma-core does on a kernel that copies DMA pages on fork:
// ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, ibv_fork_init() succeeds
// without doing anything, and the (do|dont)fork_range calls succeed without
// touching the mappings, which is what rdma-core's do when fork support is not
// enabled.

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emulator/base/log.h"
#include "verbs/abi/exports.h"
#include "verbs/abi/warn_once.h"

namespace {

// SYSFS_PATH without trailing slashes, or "/sys". Like rdma-core, the
// environment is only trusted when the program is not set-uid.
struct SysfsPath {
  char path[IBV_SYSFS_PATH_MAX + 1] = "/sys";

  SysfsPath() {
    const char* env = getuid() == geteuid() ? std::getenv("SYSFS_PATH") : nullptr;
    if (env == nullptr) return;
    size_t len = strnlen(env, IBV_SYSFS_PATH_MAX);
    std::memcpy(path, env, len);
    while (len > 0 && path[len - 1] == '/') --len;
    path[len] = '\0';
  }
};

}  // namespace

extern "C" {

const char* ibv_get_sysfs_path(void) {
  // Never destroyed (trivially destructible), so the pointer stays valid even
  // in exit handlers.
  static const SysfsPath sysfs;
  return sysfs.path;
}

// Reads <dir>/<file> into buf, at most `size` bytes. A trailing newline is
// replaced by NUL and not counted. Returns the length, or -1 with errno set;
// contents that fill the whole buffer with no room for the NUL are an error
// (EOVERFLOW), since a caller would otherwise get an unterminated string.
int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (dir == nullptr || file == nullptr || (buf == nullptr && size != 0)) {
    errno = EINVAL;
    return -1;
  }
  char path[PATH_MAX];
  const int path_len = std::snprintf(path, sizeof(path), "%s/%s", dir, file);
  if (path_len < 0 || static_cast<size_t>(path_len) >= sizeof(path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len;
  do {
    len = read(fd, buf, size);
  } while (len < 0 && errno == EINTR);
  const int read_errno = errno;
  close(fd);
  if (len < 0) {
    errno = read_errno;
    return -1;
  }
  const size_t n = static_cast<size_t>(len);
  if (n > 0 && buf[n - 1] == '\n') {
    buf[n - 1] = '\0';
    return static_cast<int>(n - 1);
  }
  if (n < size) {
    buf[n] = '\0';
    return static_cast<int>(n);
  }
  if (n == 0) return 0;  // size == 0: nothing read, nothing to terminate
  errno = EOVERFLOW;
  return -1;
}

int ibv_fork_init(void) {
  rdmaemu::Log().debug("ibv_fork_init: not needed, rdmaemu pins no memory (fork is always safe)");
  return 0;
}

enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

int ibv_dontfork_range(void* base, size_t size) { return 0; }

int ibv_dofork_range(void* base, size_t size) { return 0; }

// Used by hardware providers to find the destination MAC (and VLAN) of a RoCE
// address handle through the kernel's neighbour table. rdmaemu's RoCE runs
// over UDP sockets, so there is no L2 to resolve. rdma-core reports failure
// as a negative errno value.
int ibv_resolve_eth_l2_from_gid(struct ibv_context* context, struct ibv_ah_attr* attr,
                                uint8_t eth_mac[ETHERNET_LL_SIZE], uint16_t* vid) {
  RDMAEMU_WARN_ONCE("ibv_resolve_eth_l2_from_gid is not supported by rdmaemu (no Ethernet L2)");
  errno = EOPNOTSUPP;
  return -EOPNOTSUPP;
}

}  // extern "C"
