// A hostile peer floods the device (issue 16, item 3): unknown QPNs, stale
// PSNs, huge READ lengths, replayed atomics, corrupted and random datagrams,
// for a few seconds. Memory and log volume stay bounded, every kind of drop
// is counted where `rdmaemu stats` reads it, and the device still carries
// traffic afterwards. (CPU per packet is printed, not asserted: performance
// is measured by tools/bench, not by a timed unit test.)
#include <arpa/inet.h>
#include <sys/resource.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/wire/psn.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::Opcode;

// Counts the lines the emulator logs.
class CountingSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::atomic<size_t> lines{0};

 protected:
  void sink_it_(const spdlog::details::log_msg&) override { ++lines; }
  void flush_() override {}
};

size_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  std::fclose(f);
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST(HostilePeerTest, AFloodOfBadPacketsStaysBoundedAndCountedAndTheDeviceStillWorks) {
  EmuRc emu;
  ASSERT_TRUE(emu.ok());
  FakePeer peer(emu.ip(), emu.udp_port());
  ASSERT_TRUE(peer.ok());
  EmuRc::Buffer* mem = emu.Register(16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(mem, nullptr);
  RcParams params;
  ibv_qp* qp = emu.ConnectedQp(params);
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(emu.PostRecv(qp, i, *mem, 0, 4096), 0);
  auto engine = engine::AcquireEngine(0).value();

  auto sink = std::make_shared<CountingSink>();
  Log().sinks().push_back(sink);
  const spdlog::level::level_enum level = Log().level();
  Log().set_level(spdlog::level::debug);  // the most a user would turn on

  const engine::CounterValues before = engine->counters();
  const size_t rss_before = ResidentBytes();
  const double cpu_before = CpuSeconds();
  std::mt19937 rng(7);
  uint64_t sent = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::vector<uint8_t> junk;
  while (std::chrono::steady_clock::now() < until) {
    for (int round = 0; round < 64; ++round, sent += 6) {
      // A QP that does not exist.
      peer.Send(FakePeer::Request(Opcode::RC_SEND_ONLY, 0x100000 + (rng() & 0xffff), rng() & 0xffffff),
                std::vector<uint8_t>(64, 0x11));
      // A stale PSN: a duplicate, answered with an ACK and never executed.
      peer.Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, wire::PsnAdd(params.rq_psn, -500)),
                std::vector<uint8_t>(64, 0x22));
      // A READ of 2 GiB, far past the MR (and past the expected PSN).
      wire::PacketFields read = FakePeer::Request(Opcode::RC_RDMA_READ_REQUEST, qp->qp_num,
                                                  wire::PsnAdd(params.rq_psn, 1 + (rng() & 0xfff)));
      read.reth = {mem->addr(), mem->mr->rkey, 0x80000000u};
      peer.Send(read);
      // A replayed atomic (an old PSN).
      wire::PacketFields atomic = FakePeer::Request(Opcode::RC_FETCH_ADD, qp->qp_num,
                                                    wire::PsnAdd(params.rq_psn, -3));
      atomic.atomic_eth = {mem->addr(), mem->mr->rkey, 1, 0};
      peer.Send(atomic);
      // A corrupted packet (bad ICRC).
      std::vector<uint8_t> bad = peer.Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, params.rq_psn),
                                            std::vector<uint8_t>(32, 0x33));
      bad[bad.size() / 2] ^= 0x5a;
      peer.SendRaw(bad);
      // Random bytes of a random length.
      junk.resize(rng() % 1500);
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      peer.SendRaw(junk);
    }
    peer.Drain();  // the answers to the duplicates
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the engine catch up
  const double cpu = CpuSeconds() - cpu_before;
  const size_t rss_after = ResidentBytes();
  const engine::CounterValues after = engine->counters();
  const size_t lines = sink->lines.load();
  Log().set_level(level);
  Log().sinks().pop_back();

  const uint64_t received = after.packets_received - before.packets_received;
  std::printf("flood: %llu datagrams sent, %llu received by the device, %zu log lines, RSS %+lld KiB, "
              "%.1f us CPU (both sides) per datagram sent\n",
              static_cast<unsigned long long>(sent), static_cast<unsigned long long>(received), lines,
              (static_cast<long long>(rss_after) - static_cast<long long>(rss_before)) / 1024,
              sent ? cpu * 1e6 / static_cast<double>(sent) : 0.0);
  ASSERT_GT(sent, 6000u) << "the flood was too small to mean anything";
  // Memory: nothing is kept per bad packet (a few MiB of slack for the
  // allocator and the socket buffers).
  EXPECT_LT(rss_after, rss_before + (16u << 20)) << "RSS grew under the flood";
  // Log volume: rate-limited, not one line per packet.
  EXPECT_LT(lines, 2000u) << "the log grew with the flood";
  // Every kind of bad packet is counted.
  EXPECT_GT(after.dropped_unknown_qpn, before.dropped_unknown_qpn);
  EXPECT_GT(after.duplicates, before.duplicates);
  EXPECT_GT(after.dropped_icrc, before.dropped_icrc);
  EXPECT_GT(after.dropped_malformed, before.dropped_malformed);
  EXPECT_GT(after.out_of_sequence + after.dropped_bad_state,
            before.out_of_sequence + before.dropped_bad_state);
  // The atomic replays were never executed again.
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(mem->data.data()), 0u);

  // The device still carries traffic: two fresh QPs exchange a SEND.
  auto [a, b] = emu.ConnectedPair();
  ASSERT_TRUE(a && b);
  EmuRc::Buffer* data = emu.Register(4096, IBV_ACCESS_LOCAL_WRITE, 0x5c);
  ASSERT_NE(data, nullptr);
  ASSERT_EQ(emu.PostRecv(b, 100, *data, 2048, 1024), 0);
  ASSERT_EQ(emu.PostSend(a, 101, IBV_WR_SEND, *data, 0, 512), 0);
  int got = 0;
  for (int i = 0; i < 2; ++i) {
    auto wc = emu.Poll(std::chrono::milliseconds(5000));
    if (!wc) continue;
    if (wc->wr_id == 100 || wc->wr_id == 101) {
      EXPECT_EQ(wc->status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc->status);
      ++got;
    } else {
      --i;  // a flushed receive of the flooded QP
    }
  }
  EXPECT_EQ(got, 2);
}

}  // namespace
}  // namespace rdmaemu::testing
