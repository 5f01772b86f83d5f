// UdpSocket: the one IPv4 UDP socket a port sends and receives RoCEv2 on.
//
// A port binds (address, 4791). With the address "auto" it takes the first
// address of 127.0.0.0/8 that nobody on this machine has bound to that port
// yet, so every process is its own host on loopback and two processes talk
// with no configuration. On a real network the address is a configured
// interface address.
//
// The socket is non-blocking and close-on-exec, reports each datagram's
// destination address (IP_PKTINFO), never fragments (IP_PMTUDISC_DO: a packet
// larger than the path MTU fails to send, as it would on a NIC), and asks for
// large kernel buffers so a burst of packets is not dropped on arrival.
//
// Thread safety: a UdpSocket is a value owned by one thread at a time; the
// engine loop takes it over when it is created.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "emulator/base/status.h"

namespace rdmaemu::net {

// The UDP destination port IANA assigned to RoCEv2.
inline constexpr uint16_t kRoceV2Port = 4791;

// The addresses "auto" tries, in order: 127.0.0.1 .. 127.0.3.255.
inline constexpr uint32_t kAutoFirstAddress = 0x7f000001;  // host byte order
inline constexpr uint32_t kAutoLastAddress = 0x7f0003ff;

// Kernel buffer size asked for in each direction. As root SO_RCVBUFFORCE gets
// it; otherwise the kernel caps it at net.core.rmem_max / wmem_max.
inline constexpr int kDefaultSocketBufferBytes = 32 << 20;

struct UdpSocketOptions {
  // A dotted IPv4 address, or "auto".
  std::string address = "auto";
  // Port 0 binds an ephemeral port (tests only: peers expect 4791).
  uint16_t port = kRoceV2Port;
  int buffer_bytes = kDefaultSocketBufferBytes;
};

class UdpSocket {
 public:
  // Opens and binds the socket. Errors carry the errno of the failing call
  // and say which address was tried, e.g. "cannot bind 10.0.0.5:4791: Cannot
  // assign requested address"; "auto" with every address taken fails with
  // EADDRINUSE.
  static Result<UdpSocket> Open(const UdpSocketOptions& options);
  // A socket that receives an IPv4 multicast group: bound to (group, port)
  // with SO_REUSEADDR, so every process on the host that joined gets its own
  // copy, and a member of the group on the interface of `interface` (a
  // port's address). It only receives; a port sends to the group from its
  // own socket. EINVAL if `group` is not in 224.0.0.0/4.
  static Result<UdpSocket> OpenGroup(in_addr group, uint16_t port, in_addr interface,
                                     int buffer_bytes = kDefaultSocketBufferBytes);

  UdpSocket(UdpSocket&& other) noexcept;
  UdpSocket& operator=(UdpSocket&& other) noexcept;
  UdpSocket(const UdpSocket&) = delete;
  UdpSocket& operator=(const UdpSocket&) = delete;
  ~UdpSocket();

  int fd() const { return fd_; }
  // The address and port actually bound (the port is real even if 0 was asked).
  const sockaddr_in& address() const { return address_; }
  // What the kernel granted (it reports twice the requested size, as Linux does).
  int receive_buffer_bytes() const { return rcvbuf_; }
  int send_buffer_bytes() const { return sndbuf_; }

 private:
  UdpSocket(int fd, const sockaddr_in& address, int rcvbuf, int sndbuf)
      : fd_(fd), address_(address), rcvbuf_(rcvbuf), sndbuf_(sndbuf) {}

  int fd_ = -1;
  sockaddr_in address_{};
  int rcvbuf_ = 0;
  int sndbuf_ = 0;
};

// "127.0.0.2:4791".
std::string ToString(const sockaddr_in& address);
// "127.0.0.2".
std::string ToString(const in_addr& address);

}  // namespace rdmaemu::net
