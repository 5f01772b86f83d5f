// rsockets (rdma/rsocket.h): the socket-like API rdma-core builds into
// librdmacm.so.1 and librspreload.so calls. Not implemented yet: every entry
// point is exported at RDMACM_1.0, so programs that link them load and run,
// and each call fails the way a failing rsocket call does, with errno ENOSYS:
// -1 from those returning int, ssize_t or off_t (riomap), (size_t)-1 from
// riowrite. Each logs once per process, at warn level, "rsockets are not
// implemented yet: NAME fails with ENOSYS".

#include <errno.h>
#include <rdma/rsocket.h>

#include <atomic>
#include <cstddef>

#include "emulator/base/log.h"

// One warning per call site per process (the libibverbs stubs' pattern,
// verbs/abi/warn_once.h, which is not a dependency of this library).
#define RSOCKET_UNIMPLEMENTED(name)                                                  \
  do {                                                                               \
    static std::atomic<bool> warned{false};                                          \
    if (!warned.exchange(true, std::memory_order_relaxed))                           \
      ::rdmaemu::Log().warn("rsockets are not implemented yet: {} fails with ENOSYS", \
                            name);                                                   \
    errno = ENOSYS;                                                                  \
  } while (0)

extern "C" {

// ---- Sockets: creation, addresses, connections ------------------------------
int rsocket(int domain, int type, int protocol) {
  RSOCKET_UNIMPLEMENTED("rsocket");
  return -1;
}

int rbind(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  RSOCKET_UNIMPLEMENTED("rbind");
  return -1;
}

int rlisten(int socket, int backlog) {
  RSOCKET_UNIMPLEMENTED("rlisten");
  return -1;
}

int raccept(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  RSOCKET_UNIMPLEMENTED("raccept");
  return -1;
}

int rconnect(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  RSOCKET_UNIMPLEMENTED("rconnect");
  return -1;
}

int rshutdown(int socket, int how) {
  RSOCKET_UNIMPLEMENTED("rshutdown");
  return -1;
}

int rclose(int socket) {
  RSOCKET_UNIMPLEMENTED("rclose");
  return -1;
}

int rgetpeername(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  RSOCKET_UNIMPLEMENTED("rgetpeername");
  return -1;
}

int rgetsockname(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  RSOCKET_UNIMPLEMENTED("rgetsockname");
  return -1;
}

// ---- Data transfer ------------------------------------------------------------
ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  RSOCKET_UNIMPLEMENTED("rrecv");
  return -1;
}

ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, struct sockaddr* src_addr,
                  socklen_t* addrlen) {
  RSOCKET_UNIMPLEMENTED("rrecvfrom");
  return -1;
}

ssize_t rrecvmsg(int socket, struct msghdr* msg, int flags) {
  RSOCKET_UNIMPLEMENTED("rrecvmsg");
  return -1;
}

ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  RSOCKET_UNIMPLEMENTED("rsend");
  return -1;
}

ssize_t rsendto(int socket, const void* buf, size_t len, int flags,
                const struct sockaddr* dest_addr, socklen_t addrlen) {
  RSOCKET_UNIMPLEMENTED("rsendto");
  return -1;
}

ssize_t rsendmsg(int socket, const struct msghdr* msg, int flags) {
  RSOCKET_UNIMPLEMENTED("rsendmsg");
  return -1;
}

ssize_t rread(int socket, void* buf, size_t count) {
  RSOCKET_UNIMPLEMENTED("rread");
  return -1;
}

ssize_t rreadv(int socket, const struct iovec* iov, int iovcnt) {
  RSOCKET_UNIMPLEMENTED("rreadv");
  return -1;
}

ssize_t rwrite(int socket, const void* buf, size_t count) {
  RSOCKET_UNIMPLEMENTED("rwrite");
  return -1;
}

ssize_t rwritev(int socket, const struct iovec* iov, int iovcnt) {
  RSOCKET_UNIMPLEMENTED("rwritev");
  return -1;
}

// ---- Polling ------------------------------------------------------------------
int rpoll(struct pollfd* fds, nfds_t nfds, int timeout) {
  RSOCKET_UNIMPLEMENTED("rpoll");
  return -1;
}

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds,
            struct timeval* timeout) {
  RSOCKET_UNIMPLEMENTED("rselect");
  return -1;
}

// ---- Options ------------------------------------------------------------------
int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  RSOCKET_UNIMPLEMENTED("rsetsockopt");
  return -1;
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  RSOCKET_UNIMPLEMENTED("rgetsockopt");
  return -1;
}

// The optional argument is never read.
int rfcntl(int socket, int cmd, ...) {
  RSOCKET_UNIMPLEMENTED("rfcntl");
  return -1;
}

// ---- Direct data placement (rsocket(7): riomap, riounmap, riowrite) -----------
// riomap returns the mapped offset, or (off_t)-1 on failure as rdma-core's does.
off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  RSOCKET_UNIMPLEMENTED("riomap");
  return -1;
}

int riounmap(int socket, void* buf, size_t len) {
  RSOCKET_UNIMPLEMENTED("riounmap");
  return -1;
}

// Returns a size_t: rdma-core's failures are -1 converted, that is SIZE_MAX.
size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  RSOCKET_UNIMPLEMENTED("riowrite");
  return static_cast<size_t>(-1);
}

}  // extern "C"
