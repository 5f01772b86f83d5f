// The io_uring fallback, forced through LoopOptions::simulate_uring_refusal
// on a kernel that would allow io_uring. Its own binary, because the
// fallback is logged once per process and this test counts that line.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <sstream>
#include <string>

#include "emulator/base/log.h"
#include "emulator/net/loop.h"
#include "emulator/net/udp_socket.h"
#include "tests/emulator/net/loop_test_util.h"

namespace rdmaemu::net {
namespace {

using testing::Clock;
using testing::FnHandler;
using testing::Iov;
using testing::kTestPort;
using testing::WaitUntil;

UdpSocket AutoSocket() {
  auto s = UdpSocket::Open({.address = "auto", .port = kTestPort});
  if (!s.ok()) {
    ADD_FAILURE() << s.status().message();
    std::abort();
  }
  return std::move(s).value();
}

size_t CountLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(LoopFallbackTest, RefusedUringFallsBackToEpollSaysSoOnceAndWorks) {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  Log().sinks().push_back(sink);
  const auto old_level = Log().level();
  Log().set_level(spdlog::level::info);

  const LoopOptions refuse{.simulate_uring_refusal = EPERM};
  FnHandler ha, hb;
  auto a = Loop::Create(Backend::kAuto, AutoSocket(), &ha, refuse);
  auto b = Loop::Create(Backend::kAuto, AutoSocket(), &hb, refuse);
  Log().set_level(old_level);
  Log().sinks().pop_back();
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ((*a)->backend(), Backend::kEpoll);
  EXPECT_EQ((*b)->backend(), Backend::kEpoll);

  const std::string log = captured.str();
  EXPECT_EQ(CountLines(log, "using the epoll engine"), 1u) << log;
  EXPECT_NE(log.find("Operation not permitted"), std::string::npos) << log;

  // And the fallback engine does its job.
  Loop& la = **a;
  Loop& lb = **b;
  ha.on_work = [&](Clock::time_point) -> std::optional<Clock::time_point> {
    const iovec iov[] = {Iov("hello", 5)};
    la.Send(lb.address(), iov);
    return std::nullopt;
  };
  std::atomic<int> received{0};
  hb.on_datagrams = [&](std::span<const Datagram> batch) { received += batch.size(); };
  la.Start();
  lb.Start();
  la.Ring();
  EXPECT_TRUE(WaitUntil([&] { return received.load() == 1; }));
  la.Stop();  // before `received` goes, and a before the b its handler uses
  lb.Stop();
}

TEST(LoopFallbackTest, ForcedUringReportsTheRefusal) {
  FnHandler h;
  auto loop = Loop::Create(Backend::kUring, AutoSocket(), &h,
                           LoopOptions{.simulate_uring_refusal = ENOSYS});
  ASSERT_FALSE(loop.ok());
  EXPECT_EQ(loop.status().code(), ENOSYS);
  EXPECT_NE(loop.status().message().find("io_uring"), std::string::npos)
      << loop.status().message();
}

}  // namespace
}  // namespace rdmaemu::net
