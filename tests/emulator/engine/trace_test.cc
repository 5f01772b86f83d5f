// Tracing (issue 5, item 5): at RDMAEMU_LOG=trace the emulator writes one
// line per packet (each way), work request, completion, state change and
// async event, each naming its device and object; a state change the engine
// makes says why. Lines a remote peer causes are rate-limited, with a line
// saying how many were left out, so a bad peer cannot flood the log.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "rdmaemu/rdmaemu.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::Opcode;

std::vector<std::string> Matching(const std::string& log, const std::string& re) {
  const std::regex r(re);
  std::istringstream in(log);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, r)) out.push_back(line);
  }
  return out;
}

int CountMatches(const std::string& log, const std::string& re) {
  return static_cast<int>(Matching(log, re).size());
}

// The sum of N over the lines "... N <what> lines suppressed ...".
uint64_t Suppressed(const std::string& log, const std::string& what) {
  const std::regex r("emu0: ([0-9]+) " + what + " lines suppressed");
  uint64_t sum = 0;
  for (const std::string& line : Matching(log, what + " lines suppressed")) {
    std::smatch m;
    if (std::regex_search(line, m, r)) sum += std::stoull(m[1]);
  }
  return sum;
}

rdmaemu_counters QpCounters(ibv_qp* qp) {
  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_qp_counters(qp, &c), 0);
  return c;
}

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok());
    buf_ = emu_.Register(16384, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(buf_, nullptr);
  }
  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
};

TEST_F(TraceTest, OneLinePerPacketWorkRequestCompletionStateChangeAndEvent) {
  ::testing::internal::CaptureStderr();
  const RcParams p;
  ibv_qp* qp = emu_.CreateQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.ToInit(qp, p), 0);
  ASSERT_EQ(emu_.PostRecv(qp, 41, *buf_, 0, 256), 0);
  ASSERT_EQ(emu_.ToRtr(qp, p), 0);
  // The first packet in RTR establishes communication (COMM_EST).
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(50, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  ASSERT_TRUE(emu_.Poll().has_value());
  ASSERT_EQ(emu_.ToRts(qp, p), 0);
  ASSERT_EQ(emu_.PostSend(qp, 9, IBV_WR_SEND, *buf_, 1024, 64), 0);
  ASSERT_TRUE(peer_->Receive().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string q = "emu0 qp#" + std::to_string(qp->qp_num);
  // The fake peer's address (this process's own, fake_peer.h), as a regex.
  const std::string peer = std::to_string(kPeerIp >> 24) + "\\." + std::to_string((kPeerIp >> 16) & 0xff) +
                           "\\." + std::to_string((kPeerIp >> 8) & 0xff) + "\\." +
                           std::to_string(kPeerIp & 0xff);
  EXPECT_EQ(CountMatches(log, q + " RESET→INIT \\(ibv_modify_qp\\)"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " INIT→RTR"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " RTR→RTS"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " recv WR 41 256 bytes"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " event COMM_EST"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " rx RC_SEND_ONLY psn 100 len 50 ← " + peer + ":"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " tx RC_ACKNOWLEDGE psn 100 len 0 ACK msn 1 → " + peer + " qp#43981"), 1)
      << log;
  EXPECT_EQ(CountMatches(log, q + " completion WR 41 RECV success, 50 bytes"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " WR 9 SEND 64 bytes, psn 500\\.\\.500"), 1) << log;
  EXPECT_EQ(CountMatches(log, q + " tx RC_SEND_ONLY psn 500 len 64 → " + peer + " qp#43981"), 1) << log;
  // Every debug and trace line of this run names the device, and those
  // about an object name it too (the socket's line is the port's).
  int object_lines = 0;
  for (const std::string& line : Matching(log, "rdmaemu\\[[0-9]+\\] (debug|trace): ")) {
    object_lines += std::regex_search(line, std::regex(": emu0 (qp|cq|srq|wq)#[0-9]+[ :]"));
    EXPECT_TRUE(std::regex_search(line, std::regex("emu0[ :]|emu0 \\(|udp socket bound"))) << line;
  }
  EXPECT_GE(object_lines, 11) << log;
}

TEST_F(TraceTest, AStateChangeTheEngineMakesSaysWhy) {
  RcParams p;
  p.timeout = 10;  // 4 ms
  p.retry_cnt = 2;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(emu_.PostSend(qp, 7, IBV_WR_SEND, *buf_, 0, 32), 0);
  // The fake peer never answers: the first sending and two retries time out.
  auto wc = emu_.Poll(std::chrono::milliseconds(5000));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string log = ::testing::internal::GetCapturedStderr();
  peer_->Drain();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_RETRY_EXC_ERR);
  const std::string q = "emu0 qp#" + std::to_string(qp->qp_num);
  EXPECT_EQ(CountMatches(log, q + ": transport timeout, retransmitting from psn 500 \\(1 retries left\\)"), 1)
      << log;
  EXPECT_EQ(CountMatches(log, q + ": transport timeout, retransmitting from psn 500 \\(0 retries left\\)"), 1)
      << log;
  EXPECT_EQ(CountMatches(log, q + " tx RC_SEND_ONLY psn 500 len 32 "), 3) << log;
  // The peer never answered, and the line says so.
  EXPECT_EQ(CountMatches(log, q + " RTS→ERR: retry count exceeded after 2 retries: no answer came; the last "
                                   "packet for this QP arrived never, the device's last datagram "
                                   "(never|[0-9]+ ms ago) \\(transport retry counter exceeded\\)"),
            1)
      << log;
  EXPECT_EQ(CountMatches(log, q + " completion WR 7 SEND transport retry counter exceeded, "), 1) << log;
}

TEST_F(TraceTest, ABadPeerCannotFloodTheLog) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 1, *buf_, 0, 256), 0);
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // fresh rate-limit windows

  const auto before = QpCounters(qp);
  ::testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  constexpr int kFlood = 3000;
  for (int i = 0; i < kFlood; ++i) {
    // Duplicates of an executed SEND (each is ACKed again), packets for a
    // QP that does not exist, and packets whose ICRC is wrong.
    peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
    peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, 0xfedcb, 100), std::vector<uint8_t>(8, 1));
    auto bad = peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100),
                            std::vector<uint8_t>(8, 1));
    bad.back() ^= 1;
    peer_->SendRaw(bad);
    if (i % 500 == 0) peer_->Drain();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // A second later, one more duplicate: its lines come after a summary of
  // what the flood's windows left out.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto after = QpCounters(qp);
  const std::string log = ::testing::internal::GetCapturedStderr();
  peer_->Drain();

  // Each per-second window lets at most 200 packet lines through each way
  // (10 for each drop line); the flood spans at most ceil(seconds) + 1
  // windows, plus the window of the last duplicate.
  const int windows = static_cast<int>(seconds) + 2 + 1;
  const uint64_t received = after.packets_received - before.packets_received;
  const uint64_t sent = after.packets_sent - before.packets_sent;
  ASSERT_GT(received, 1000u) << "the flood reached the QP";
  const int rx = CountMatches(log, " rx RC_SEND_ONLY psn 100 len 8 ");
  const int tx = CountMatches(log, " tx RC_ACKNOWLEDGE psn 100 ");
  EXPECT_GT(rx, 0);
  EXPECT_LE(rx, 200 * windows) << "receive lines are limited to 200 a second";
  EXPECT_GT(tx, 0);
  EXPECT_LE(tx, 200 * windows) << "send lines are limited to 200 a second";
  // Nothing is lost silently: every packet has its line or is counted in a
  // summary line.
  EXPECT_EQ(rx + Suppressed(log, "rx packet"), received) << log.substr(0, 4000);
  EXPECT_EQ(tx + Suppressed(log, "tx packet"), sent);
  const int unknown = CountMatches(log, "emu0: dropped a RC_SEND_ONLY for unknown qp#1043915 ");
  const int icrc = CountMatches(log, "emu0: dropped a packet from .*ICRC");
  const int duplicate = CountMatches(log, "emu0 qp#[0-9]+: duplicate RC_SEND_ONLY psn 100 ");
  EXPECT_GT(unknown, 0);
  EXPECT_LE(unknown, 10 * windows) << "drop lines are limited to 10 a second";
  EXPECT_GT(icrc, 0);
  EXPECT_LE(icrc, 10 * windows);
  EXPECT_GT(duplicate, 0);
  EXPECT_LE(duplicate, 10 * windows);
  EXPECT_GE(CountMatches(log, "similar lines suppressed"), 1);
  EXPECT_LT(CountMatches(log, "."), 2 * 200 * windows + 3 * 10 * windows + 50)
      << "3 x " << kFlood << " bad packets";
}

}  // namespace
}  // namespace rdmaemu::testing
