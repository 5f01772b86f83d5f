#include "emulator/net/udp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

namespace rdmaemu::net {
namespace {

constexpr uint16_t kTestPort = 24791;

UdpSocket OpenOrDie(const UdpSocketOptions& options) {
  auto s = UdpSocket::Open(options);
  if (!s.ok()) {
    ADD_FAILURE() << s.status().message();
    std::abort();
  }
  return std::move(s).value();
}

int GetInt(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof(v);
  EXPECT_EQ(getsockopt(fd, level, name, &v, &len), 0);
  return v;
}

uint32_t HostIp(const sockaddr_in& a) { return ntohl(a.sin_addr.s_addr); }

TEST(UdpSocketTest, DefaultsToRoceV2PortAndAutoAddress) {
  UdpSocketOptions options;
  EXPECT_EQ(options.port, 4791);
  EXPECT_EQ(options.address, "auto");
}

TEST(UdpSocketTest, AutoBindsALoopbackAddressWithTheOptionsSet) {
  UdpSocket s = OpenOrDie({.address = "auto", .port = kTestPort});
  EXPECT_GE(HostIp(s.address()), kAutoFirstAddress);
  EXPECT_LE(HostIp(s.address()), kAutoLastAddress);
  EXPECT_EQ(ntohs(s.address().sin_port), kTestPort);
  EXPECT_TRUE(fcntl(s.fd(), F_GETFL) & O_NONBLOCK);
  EXPECT_TRUE(fcntl(s.fd(), F_GETFD) & FD_CLOEXEC);
  EXPECT_EQ(GetInt(s.fd(), IPPROTO_IP, IP_PKTINFO), 1);
  EXPECT_EQ(GetInt(s.fd(), IPPROTO_IP, IP_MTU_DISCOVER), IP_PMTUDISC_DO);
  EXPECT_EQ(GetInt(s.fd(), SOL_SOCKET, SO_REUSEADDR), 0);
  EXPECT_GT(s.receive_buffer_bytes(), 0);
  EXPECT_GT(s.send_buffer_bytes(), 0);
  // SO_RCVBUFFORCE needs CAP_NET_ADMIN, which root lacks inside a sandbox's
  // user namespace; where it works, Linux reports twice what was set.
  const int probe = socket(AF_INET, SOCK_DGRAM, 0);
  const int small = 4096;
  if (probe >= 0 && setsockopt(probe, SOL_SOCKET, SO_RCVBUFFORCE, &small, sizeof(small)) == 0) {
    EXPECT_GE(s.receive_buffer_bytes(), kDefaultSocketBufferBytes);
  }
  if (probe >= 0) close(probe);
}

TEST(UdpSocketTest, AutoGivesEachSocketItsOwnAddress) {
  UdpSocket a = OpenOrDie({.address = "auto", .port = kTestPort});
  UdpSocket b = OpenOrDie({.address = "auto", .port = kTestPort});
  EXPECT_NE(HostIp(a.address()), HostIp(b.address()));
  EXPECT_EQ(ntohs(b.address().sin_port), kTestPort);
}

TEST(UdpSocketTest, AutoSkipsAnAddressSomeoneElseHolds) {
  // Learn the first free address, free it, and take it with a plain socket.
  uint32_t first_free;
  {
    UdpSocket probe = OpenOrDie({.address = "auto", .port = kTestPort});
    first_free = HostIp(probe.address());
  }
  const int other = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(other, 0);
  sockaddr_in taken{};
  taken.sin_family = AF_INET;
  taken.sin_addr.s_addr = htonl(first_free);
  taken.sin_port = htons(kTestPort);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&taken), sizeof(taken)), 0) << errno;

  UdpSocket s = OpenOrDie({.address = "auto", .port = kTestPort});
  EXPECT_NE(HostIp(s.address()), first_free);
  close(other);
}

TEST(UdpSocketTest, ConfiguredAddressIsBound) {
  UdpSocket s = OpenOrDie({.address = "127.0.0.1", .port = 0});
  EXPECT_EQ(ToString(s.address().sin_addr), "127.0.0.1");
  EXPECT_NE(s.address().sin_port, 0);  // the kernel picked a port
}

TEST(UdpSocketTest, ConfiguredAddressInUseFailsWithEaddrinuse) {
  UdpSocket a = OpenOrDie({.address = "auto", .port = kTestPort});
  const std::string ip = ToString(a.address().sin_addr);
  auto b = UdpSocket::Open({.address = ip, .port = kTestPort});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), EADDRINUSE);
  EXPECT_EQ(b.status().message(),
            "cannot bind " + ip + ":" + std::to_string(kTestPort) + ": Address already in use");
}

TEST(UdpSocketTest, NonLocalAddressFailsWithAClearMessage) {
  // 192.0.2.0/24 is TEST-NET-1: documentation only, never a local address.
  auto s = UdpSocket::Open({.address = "192.0.2.1", .port = kTestPort});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), EADDRNOTAVAIL);
  EXPECT_EQ(s.status().message(), "cannot bind 192.0.2.1:24791: Cannot assign requested address");
}

TEST(UdpSocketTest, MalformedAddressIsInvalidArgument) {
  auto s = UdpSocket::Open({.address = "127.0.0", .port = kTestPort});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), EINVAL);
  EXPECT_NE(s.status().message().find("'127.0.0' is not an IPv4 address"), std::string::npos)
      << s.status().message();
}

TEST(UdpSocketTest, MoveTransfersTheDescriptor) {
  UdpSocket a = OpenOrDie({.address = "auto", .port = kTestPort});
  const int fd = a.fd();
  UdpSocket b(std::move(a));
  EXPECT_EQ(b.fd(), fd);
  EXPECT_EQ(a.fd(), -1);  // NOLINT: checking the moved-from state on purpose
  UdpSocket c = OpenOrDie({.address = "auto", .port = kTestPort});
  c = std::move(b);
  EXPECT_EQ(c.fd(), fd);
  EXPECT_EQ(fcntl(fd, F_GETFD) >= 0, true);
}

TEST(UdpSocketTest, FormatsAddresses) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(0x7f000002);
  a.sin_port = htons(4791);
  EXPECT_EQ(ToString(a), "127.0.0.2:4791");
  EXPECT_EQ(ToString(a.sin_addr), "127.0.0.2");
}

}  // namespace
}  // namespace rdmaemu::net
