// One loop serving two sockets (a two-port device), on both backends: each
// datagram says which socket received it, each Send leaves from the socket
// it names, and the loop still sleeps when idle.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emulator/net/loop.h"
#include "emulator/net/udp_socket.h"
#include "tests/emulator/net/loop_test_util.h"

namespace rdmaemu::net {
namespace {

using namespace std::chrono_literals;
using testing::Clock;
using testing::FnHandler;
using testing::Iov;
using testing::kTestPort;
using testing::WaitUntil;

UdpSocket AutoSocket() {
  auto s = UdpSocket::Open({.address = "auto", .port = kTestPort});
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

bool UringWorksHere() {
  static const bool works = [] {
    FnHandler h;
    return Loop::Create(Backend::kUring, AutoSocket(), &h).ok();
  }();
  return works;
}

struct Seen {
  int socket;
  sockaddr_in src;
  in_addr dst;
  std::string payload;
};

class MultiSocketTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kUring && !UringWorksHere()) {
      GTEST_SKIP() << "io_uring is refused on this machine";
    }
  }
};

TEST_P(MultiSocketTest, EachSocketReceivesAndSendsItsOwnDatagrams) {
  FnHandler h2, h1;
  std::vector<UdpSocket> two;
  two.push_back(AutoSocket());
  two.push_back(AutoSocket());
  auto dual = Loop::Create(GetParam(), std::move(two), &h2);
  ASSERT_TRUE(dual.ok()) << dual.status().message();
  auto peer = Loop::Create(GetParam(), AutoSocket(), &h1);
  ASSERT_TRUE(peer.ok()) << peer.status().message();
  Loop& d = **dual;
  Loop& p = **peer;
  ASSERT_EQ(d.num_sockets(), 2);
  ASSERT_EQ(d.backend(), GetParam());
  ASSERT_NE(d.address(0).sin_addr.s_addr, d.address(1).sin_addr.s_addr);

  std::mutex mu;
  std::vector<Seen> at_dual, at_peer;
  bool sent = false;
  // The peer sends one datagram to each of the dual loop's sockets; the dual
  // loop answers each from the socket that received it.
  h1.on_work = [&](Clock::time_point) -> std::optional<Clock::time_point> {
    if (!sent) {
      for (int s = 0; s < 2; ++s) {
        std::string text = "to" + std::to_string(s);
        const iovec iov[] = {Iov(text.data(), text.size())};
        p.Send(d.address(s), iov);
      }
      sent = true;
    }
    return std::nullopt;
  };
  h1.on_datagrams = [&](std::span<const Datagram> batch) {
    std::lock_guard lock(mu);
    for (const Datagram& g : batch) at_peer.push_back({g.socket, g.src, g.dst, {g.data.begin(), g.data.end()}});
  };
  h2.on_datagrams = [&](std::span<const Datagram> batch) {
    for (const Datagram& g : batch) {
      std::string reply = "from" + std::to_string(g.socket);
      const iovec iov[] = {Iov(reply.data(), reply.size())};
      d.Send(g.socket, g.src, iov);
      std::lock_guard lock(mu);
      at_dual.push_back({g.socket, g.src, g.dst, {g.data.begin(), g.data.end()}});
    }
  };
  d.Start();
  p.Start();
  p.Ring();
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard lock(mu);
    return at_peer.size() == 2;
  }));
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(at_dual.size(), 2u);
    for (const Seen& s : at_dual) {
      EXPECT_EQ(s.payload, "to" + std::to_string(s.socket));
      EXPECT_EQ(s.dst.s_addr, d.address(s.socket).sin_addr.s_addr);
    }
    EXPECT_NE(at_dual[0].socket, at_dual[1].socket);
    for (const Seen& s : at_peer) {
      // The reply came from the address of the socket it names.
      const int from = s.payload == "from0" ? 0 : s.payload == "from1" ? 1 : -1;
      ASSERT_GE(from, 0) << s.payload;
      EXPECT_EQ(s.src.sin_addr.s_addr, d.address(from).sin_addr.s_addr);
      EXPECT_EQ(s.socket, 0);
    }
  }
  // Idle: the one thread sleeps on both sockets at once.
  std::this_thread::sleep_for(50ms);
  const auto cpu = d.stats().cpu_time;
  std::this_thread::sleep_for(500ms);
  EXPECT_LT(d.stats().cpu_time - cpu, 20ms) << "an idle two-socket loop must not spin";
  d.Stop();
  p.Stop();
}

TEST_P(MultiSocketTest, SendToASocketTheLoopDoesNotHaveIsCountedAndDropped) {
  FnHandler h;
  auto loop = Loop::Create(GetParam(), AutoSocket(), &h);
  ASSERT_TRUE(loop.ok());
  Loop& l = **loop;
  std::atomic<bool> done{false};
  h.on_work = [&](Clock::time_point) -> std::optional<Clock::time_point> {
    if (!done) {
      const iovec iov[] = {Iov("x", 1)};
      l.Send(1, l.address(0), iov);
      done = true;
    }
    return std::nullopt;
  };
  l.Start();
  l.Ring();
  ASSERT_TRUE(WaitUntil([&] { return done.load(); }));
  ASSERT_TRUE(WaitUntil([&] { return l.stats().send_errors == 1; }));
  EXPECT_EQ(l.stats().datagrams_sent, 0u);
  l.Stop();
}

INSTANTIATE_TEST_SUITE_P(Backends, MultiSocketTest,
                         ::testing::Values(Backend::kUring, Backend::kEpoll),
                         [](const auto& info) { return std::string(ToString(info.param)); });

TEST(MultiSocket, ALoopServesOneOrTwoSockets) {
  FnHandler h;
  std::vector<UdpSocket> none;
  auto zero = Loop::Create(Backend::kEpoll, std::move(none), &h);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), EINVAL);
  std::vector<UdpSocket> three;
  for (int i = 0; i < 3; ++i) three.push_back(AutoSocket());
  auto many = Loop::Create(Backend::kEpoll, std::move(three), &h);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("1 to 2"), std::string::npos) << many.status().message();
}

}  // namespace
}  // namespace rdmaemu::net
