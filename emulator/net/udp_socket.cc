#include "emulator/net/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "emulator/base/log.h"

namespace rdmaemu::net {
namespace {

std::string ErrnoText(int err) {
  const char* text = strerrordesc_np(err);
  return text != nullptr ? text : "errno " + std::to_string(err);
}

Status Failed(int err, std::string what) {
  return Status::Error(err, std::move(what) + ": " + ErrnoText(err));
}

sockaddr_in MakeAddress(uint32_t host_order_ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(host_order_ip);
  a.sin_port = htons(port);
  return a;
}

int SetInt(int fd, int level, int name, int value) {
  return setsockopt(fd, level, name, &value, sizeof(value)) == 0 ? 0 : -errno;
}

int GetInt(int fd, int level, int name) {
  int value = 0;
  socklen_t len = sizeof(value);
  return getsockopt(fd, level, name, &value, &len) == 0 ? value : -errno;
}

// Asks for `bytes` of kernel buffer: the FORCE variant ignores rmem_max/wmem_max
// but needs CAP_NET_ADMIN; without it the plain option gets what the limit allows.
void SetBuffer(int fd, int force_name, int name, int bytes) {
  if (SetInt(fd, SOL_SOCKET, force_name, bytes) == 0) return;
  if (int err = SetInt(fd, SOL_SOCKET, name, bytes); err != 0) {
    Log().debug("setsockopt buffer {}: {}", name, ErrnoText(-err));
  }
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

std::string ToString(const in_addr& address) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address, text, sizeof(text));
  return text;
}

std::string ToString(const sockaddr_in& address) {
  return ToString(address.sin_addr) + ":" + std::to_string(ntohs(address.sin_port));
}

Result<UdpSocket> UdpSocket::Open(const UdpSocketOptions& options) {
  const bool automatic = options.address == "auto";
  uint32_t first = kAutoFirstAddress;
  uint32_t last = kAutoLastAddress;
  if (!automatic) {
    in_addr parsed{};
    if (inet_pton(AF_INET, options.address.c_str(), &parsed) != 1) {
      return InvalidArgument("'" + options.address +
                             "' is not an IPv4 address (a.b.c.d) or \"auto\"");
    }
    first = last = ntohl(parsed.s_addr);
  }

  Fd fd(socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Failed(errno, "cannot create a UDP socket");

  // No SO_REUSEADDR: for UDP it would let two processes bind the same
  // address and port, which is exactly what "auto" relies on failing.
  if (int err = SetInt(fd.get(), IPPROTO_IP, IP_PKTINFO, 1); err != 0) {
    return Failed(-err, "cannot enable IP_PKTINFO");
  }
  // The traffic class of RoCE v2 travels in the IP header's TOS byte.
  if (int err = SetInt(fd.get(), IPPROTO_IP, IP_RECVTOS, 1); err != 0) {
    return Failed(-err, "cannot enable IP_RECVTOS");
  }
  if (int err = SetInt(fd.get(), IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO); err != 0) {
    return Failed(-err, "cannot set IP_MTU_DISCOVER");
  }
  // UDP GRO: the datagrams of a GSO send (the packets of one message, loop.h)
  // arrive in one receive where the kernel can keep them together, as on
  // loopback; the loops cut them apart. A kernel without it (before 5.0)
  // hands them over one by one.
  if (int err = SetInt(fd.get(), SOL_UDP, UDP_GRO, 1); err != 0) {
    Log().debug("UDP_GRO: {}", ErrnoText(-err));
  }
  SetBuffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, options.buffer_bytes);
  SetBuffer(fd.get(), SO_SNDBUFFORCE, SO_SNDBUF, options.buffer_bytes);

  for (uint32_t ip = first;; ++ip) {
    const sockaddr_in want = MakeAddress(ip, options.port);
    if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&want), sizeof(want)) == 0) break;
    const int err = errno;
    if (!automatic || err != EADDRINUSE) return Failed(err, "cannot bind " + ToString(want));
    if (ip == last) {
      return Status::Error(
          EADDRINUSE, "cannot bind an automatic address: every address from " +
                          ToString(MakeAddress(first, options.port).sin_addr) + " to " +
                          ToString(MakeAddress(last, options.port).sin_addr) + " has port " +
                          std::to_string(options.port) + " in use");
    }
  }

  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return Failed(errno, "getsockname");
  }
  // Multicast leaves by the port's own interface (on loopback, lo), where
  // the groups the port's QPs joined are; the kernel's default would be the
  // interface of the default route.
  in_addr interface = bound.sin_addr;
  if (setsockopt(fd.get(), IPPROTO_IP, IP_MULTICAST_IF, &interface, sizeof(interface)) != 0) {
    return Failed(errno, "cannot set IP_MULTICAST_IF to " + ToString(interface));
  }
  const int rcvbuf = GetInt(fd.get(), SOL_SOCKET, SO_RCVBUF);
  const int sndbuf = GetInt(fd.get(), SOL_SOCKET, SO_SNDBUF);
  Log().debug("udp socket bound to {} (rcvbuf {} sndbuf {})", ToString(bound), rcvbuf, sndbuf);
  return UdpSocket(fd.release(), bound, rcvbuf, sndbuf);
}

Result<UdpSocket> UdpSocket::OpenGroup(in_addr group, uint16_t port, in_addr interface,
                                       int buffer_bytes) {
  if (!IN_MULTICAST(ntohl(group.s_addr))) {
    return InvalidArgument(ToString(group) + " is not an IPv4 multicast address");
  }
  Fd fd(socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Failed(errno, "cannot create a UDP socket");
  // Every process whose QPs joined the group binds (group, port): each
  // gets its own copy of each datagram, which only SO_REUSEADDR allows.
  if (int err = SetInt(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1); err != 0) {
    return Failed(-err, "cannot set SO_REUSEADDR");
  }
  if (int err = SetInt(fd.get(), IPPROTO_IP, IP_PKTINFO, 1); err != 0) {
    return Failed(-err, "cannot enable IP_PKTINFO");
  }
  // The traffic class of RoCE v2 travels in the IP header's TOS byte.
  if (int err = SetInt(fd.get(), IPPROTO_IP, IP_RECVTOS, 1); err != 0) {
    return Failed(-err, "cannot enable IP_RECVTOS");
  }
  // Only the groups this socket joined, not every group some socket of the
  // host joined (Linux's default, IP_MULTICAST_ALL).
  if (int err = SetInt(fd.get(), IPPROTO_IP, IP_MULTICAST_ALL, 0); err != 0) {
    return Failed(-err, "cannot clear IP_MULTICAST_ALL");
  }
  SetBuffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, buffer_bytes);
  const sockaddr_in want = MakeAddress(ntohl(group.s_addr), port);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&want), sizeof(want)) != 0) {
    return Failed(errno, "cannot bind " + ToString(want));
  }
  ip_mreq join{};
  join.imr_multiaddr = group;
  join.imr_interface = interface;
  if (setsockopt(fd.get(), IPPROTO_IP, IP_ADD_MEMBERSHIP, &join, sizeof(join)) != 0) {
    return Failed(errno, "cannot join " + ToString(group) + " on the interface of " +
                             ToString(interface));
  }
  const int rcvbuf = GetInt(fd.get(), SOL_SOCKET, SO_RCVBUF);
  Log().debug("udp socket joined {} on {}", ToString(want), ToString(interface));
  return UdpSocket(fd.release(), want, rcvbuf, 0);
}

UdpSocket::UdpSocket(UdpSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      address_(other.address_),
      rcvbuf_(other.rcvbuf_),
      sndbuf_(other.sndbuf_) {}

UdpSocket& UdpSocket::operator=(UdpSocket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    address_ = other.address_;
    rcvbuf_ = other.rcvbuf_;
    sndbuf_ = other.sndbuf_;
  }
  return *this;
}

UdpSocket::~UdpSocket() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace rdmaemu::net
