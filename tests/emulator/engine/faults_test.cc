// Fault rules on the engine (issue 5, items 1-3): each rule kind against a
// fake peer or between two QPs of the device, set through rdmaemu.h's
// rdmaemu_fault_add; the forced protocol events give the requester the
// completion status a real responder's answer would; shaping slows a
// transfer down to the rate. Built twice, once per engine backend.
#include <gtest/gtest.h>

#include <poll.h>

#include <cstring>

#include "emulator/engine/engine.h"
#include "emulator/wire/psn.h"
#include "rdmaemu/rdmaemu.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::AethType;
using wire::NakCode;
using wire::Opcode;
using Clock = std::chrono::steady_clock;

class FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok()) << "cannot bind the fake peer";
    buf_ = emu_.Register(1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    ASSERT_NE(buf_, nullptr);
    engine_ = engine::AcquireEngine(0).value();
    ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
  }
  void TearDown() override {
    if (emu_.ok()) rdmaemu_fault_clear(emu_.ctx());
  }

  void Faults(const char* rules) { ASSERT_EQ(rdmaemu_fault_add(emu_.ctx(), rules), 0) << rules; }
  engine::CounterValues Counters() { return engine_->counters(); }
  fault::FaultCounters FaultCounters() { return engine_->fault_counters(); }

  void SendOnly(ibv_qp* qp, uint32_t psn, size_t bytes = 32) {
    std::vector<uint8_t> data(bytes, 0x42);
    peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, psn), data);
  }
  RxPacket Next(std::chrono::milliseconds timeout = 2000ms) {
    auto rx = peer_->Receive(timeout);
    EXPECT_TRUE(rx.has_value()) << "nothing from the engine";
    return rx.value_or(RxPacket{});
  }

  // Two RC QPs of the device connected to each other (the device talks to
  // itself on its own address).
  std::pair<ibv_qp*, ibv_qp*> Loopback(RcParams p = {}) {
    ibv_qp* a = emu_.CreateQp(64);
    ibv_qp* b = emu_.CreateQp(64);
    if (!a || !b) return {nullptr, nullptr};
    p.peer_ip = emu_.ip();
    RcParams pa = p, pb = p;
    pa.dest_qpn = b->qp_num;
    pb.dest_qpn = a->qp_num;
    pa.sq_psn = pb.rq_psn = 1000;
    pb.sq_psn = pa.rq_psn = 2000;
    for (auto [qp, params] : {std::pair{a, pa}, std::pair{b, pb}}) {
      if (emu_.ToInit(qp, params) || emu_.ToRtr(qp, params) || emu_.ToRts(qp, params)) {
        return {nullptr, nullptr};
      }
    }
    return {a, b};
  }

  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
  std::shared_ptr<engine::Engine> engine_;
};

TEST_F(FaultsTest, BadRulesAreRefusedAndChangeNothing) {
  EXPECT_EQ(rdmaemu_fault_add(emu_.ctx(), "dorp=0.1"), EINVAL);
  EXPECT_EQ(rdmaemu_fault_add(emu_.ctx(), "drop@port=2"), EINVAL) << "emu0 has one port";
  EXPECT_EQ(rdmaemu_fault_add(emu_.ctx(), nullptr), EINVAL);
  char list[256];
  ASSERT_EQ(rdmaemu_fault_list(emu_.ctx(), list, sizeof list), 0);
  EXPECT_STREQ(list, "");
  Faults("drop=0.25,seed=3;rnr=#1@qpn=17");
  ASSERT_EQ(rdmaemu_fault_list(emu_.ctx(), list, sizeof list), 0);
  EXPECT_STREQ(list, "seed=3\ndrop=0.25  (matched 0 packets)\nrnr=#1@qpn=0x11  (matched 0 packets)\n");
  char small[8];
  EXPECT_EQ(rdmaemu_fault_list(emu_.ctx(), small, sizeof small), ERANGE);
  EXPECT_STREQ(small, "seed=3\n");
  ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
  ASSERT_EQ(rdmaemu_fault_list(emu_.ctx(), list, sizeof list), 0);
  EXPECT_STREQ(list, "");
}

TEST_F(FaultsTest, DroppedRequestIsRetransmitted) {
  RcParams p;
  p.timeout = 1;  // the engine's floor: 5 ms
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  Faults("drop=#1@op=SEND");
  const uint64_t retransmissions = Counters().retransmissions;
  const auto posted = Clock::now();
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 32), 0);
  RxPacket rx = Next();
  EXPECT_GE(Clock::now() - posted, 4ms) << "the first copy was not dropped";
  EXPECT_EQ(rx.psn, 500u);
  EXPECT_EQ(rx.opcode, Opcode::RC_SEND_ONLY);
  EXPECT_GT(Counters().retransmissions, retransmissions);
  EXPECT_EQ(FaultCounters().dropped, 1u);
  peer_->Send(FakePeer::Ack(qp->qp_num, 500, wire::AckSyndrome(), 1));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(FaultsTest, DuplicatedRequestIsDetected) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 7, *buf_, 0, 4096), 0);
  Faults("dup@dir=rx,op=SEND_ONLY");
  const uint64_t duplicates = Counters().duplicates;
  SendOnly(qp, 100);
  // Executed once, acknowledged twice (the copy is a duplicate: re-ACKed).
  RxPacket a = Next(), b = Next();
  EXPECT_EQ(a.opcode, Opcode::RC_ACKNOWLEDGE);
  EXPECT_EQ(a.psn, 100u);
  EXPECT_EQ(b.psn, 100u);
  EXPECT_EQ(Counters().duplicates, duplicates + 1);
  EXPECT_EQ(FaultCounters().duplicated, 1u);
  auto wcs = emu_.PollAll(50ms);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 7u);
}

TEST_F(FaultsTest, CorruptedPacketsFailTheIcrcBothWays) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 7, *buf_, 0, 4096), 0);
  // Received: the engine drops it for its ICRC and counts it.
  Faults("corrupt=#1@dir=rx");
  const uint64_t icrc = Counters().dropped_icrc;
  SendOnly(qp, 100);
  EXPECT_FALSE(peer_->Receive(100ms).has_value()) << "a corrupt request was answered";
  EXPECT_EQ(Counters().dropped_icrc, icrc + 1);
  SendOnly(qp, 100);  // the requester's retry gets through
  EXPECT_EQ(Next().psn, 100u);
  EXPECT_EQ(FaultCounters().corrupted, 1u);
  // Sent: the peer sees a packet whose ICRC does not match.
  ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
  Faults("corrupt=#1@op=ACK");
  ASSERT_EQ(emu_.PostRecv(qp, 8, *buf_, 0, 4096), 0);
  SendOnly(qp, 101);
  RxPacket rx = Next();
  EXPECT_EQ(rx.opcode, Opcode::RC_ACKNOWLEDGE);
  EXPECT_FALSE(rx.icrc_ok);
}

TEST_F(FaultsTest, DelayedPacketsLeaveLate) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  Faults("delay=40ms@op=SEND");
  // Before the post: the posting thread may send (and start the delay)
  // before ibv_post_send returns.
  const auto posted = Clock::now();
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 32), 0);
  RxPacket rx = Next();
  EXPECT_GE(Clock::now() - posted, 38ms);
  EXPECT_EQ(rx.psn, 500u);
  EXPECT_EQ(FaultCounters().delayed, 1u);
  // Received packets too.
  ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
  Faults("delay=40ms@dir=rx");
  ASSERT_EQ(emu_.PostRecv(qp, 7, *buf_, 0, 4096), 0);
  const auto sent = Clock::now();
  SendOnly(qp, 100);
  Next();
  EXPECT_GE(Clock::now() - sent, 38ms);
}

TEST_F(FaultsTest, ReorderedRequestsAreNakedAndResent) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  // A held packet goes out after kReorderMaxHold (1 ms) if nothing follows
  // it; a test thread a loaded machine (or a sanitizer) stalls that long
  // between two sends sees them in order. Such a round is tried again.
  std::vector<RxPacket> answers;
  uint32_t first = 100;
  for (int round = 0; round < 5; ++round, first += 4) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(emu_.PostRecv(qp, 10 + i, *buf_, i * 64, 64), 0);
    ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
    Faults("reorder=#1@dir=rx");
    const uint64_t oos = Counters().out_of_sequence;
    const uint64_t reordered = FaultCounters().reordered;
    for (uint32_t psn = first; psn < first + 4; ++psn) SendOnly(qp, psn);
    answers = peer_->ReceiveAll(300ms);
    ASSERT_FALSE(answers.empty());
    if (answers[0].aeth_type() == AethType::kAck && Counters().out_of_sequence == oos) continue;
    // `first` was held back: the later ones arrived first, out of sequence.
    EXPECT_EQ(answers[0].aeth_type(), AethType::kNak);
    EXPECT_EQ(answers[0].aeth_value(), static_cast<uint8_t>(NakCode::kPsnSequenceError));
    EXPECT_EQ(answers[0].psn, first);
    EXPECT_GT(Counters().out_of_sequence, oos);
    EXPECT_EQ(FaultCounters().reordered, reordered + 1);
    return;
  }
  ADD_FAILURE() << "5 rounds, and the held packet never went out after a later one";
}

TEST_F(FaultsTest, CountTriggerWithOpcodeFilterDropsExactlyTheSecondAck) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostRecv(qp, 10 + i, *buf_, i * 64, 64), 0);
  Faults("drop=#2@op=ACK");
  for (uint32_t psn = 100; psn < 103; ++psn) SendOnly(qp, psn);
  auto acks = peer_->ReceiveAll(200ms);
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_EQ(acks[0].psn, 100u);
  EXPECT_EQ(acks[1].psn, 102u);
}

TEST_F(FaultsTest, ForcedRnrNakThenTheRetryIsAccepted) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 7, *buf_, 0, 4096), 0);
  Faults(("rnr=#1@qpn=" + std::to_string(qp->qp_num)).c_str());
  SendOnly(qp, 100);
  RxPacket rx = Next();
  EXPECT_EQ(rx.aeth_type(), AethType::kRnrNak) << "a receive was posted, but the rule forces RNR";
  EXPECT_EQ(rx.psn, 100u);
  EXPECT_TRUE(emu_.PollAll(20ms).empty());
  SendOnly(qp, 100);
  rx = Next();
  EXPECT_EQ(rx.aeth_type(), AethType::kAck);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 7u);
  EXPECT_EQ(FaultCounters().rnr_forced, 1u);
}

TEST_F(FaultsTest, ForcedSequenceNakMakesTheRequesterGoBack) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 7, *buf_, 0, 4096), 0);
  Faults("nak=seq/#1");
  SendOnly(qp, 100);
  RxPacket rx = Next();
  EXPECT_EQ(rx.aeth_type(), AethType::kNak);
  EXPECT_EQ(rx.aeth_value(), static_cast<uint8_t>(NakCode::kPsnSequenceError));
  SendOnly(qp, 100);
  EXPECT_EQ(Next().aeth_type(), AethType::kAck);
}

TEST_F(FaultsTest, ForcedErrorMovesTheQpToErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 7, *buf_, 0, 4096), 0);
  Faults(("error=#1@qpn=" + std::to_string(qp->qp_num)).c_str());
  SendOnly(qp, 100);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 7u);
  EXPECT_EQ(wc->status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
  pollfd pfd{emu_.ctx()->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 2000), 1) << "no async event";
  ibv_async_event event;
  ASSERT_EQ(ibv_get_async_event(emu_.ctx(), &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(event.element.qp, qp);
  ibv_ack_async_event(&event);
  EXPECT_EQ(FaultCounters().errors_forced, 1u);
}

// The requester's view: its WR completes with the status the forced NAK
// stands for (the responder QP is on the same device).
struct NakCase {
  const char* rule;
  ibv_wc_status status;
};

std::string fmt_rule(const char* rule, uint32_t qpn) {
  return std::string(rule) + "@qpn=" + std::to_string(qpn);
}

class ForcedNakTest : public FaultsTest, public ::testing::WithParamInterface<NakCase> {};

TEST_P(ForcedNakTest, RequesterCompletesWithTheMatchingStatus) {
  RcParams p;
  p.rnr_retry = 0;
  auto [a, b] = Loopback(p);
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(emu_.PostRecv(b, 9, *buf_, 4096, 4096), 0);
  Faults(fmt_rule(GetParam().rule, b->qp_num).c_str());
  ASSERT_EQ(emu_.PostSend(a, 1, IBV_WR_SEND, *buf_, 0, 64), 0);
  std::optional<ibv_wc> mine;
  for (const ibv_wc& wc : emu_.PollAll(300ms)) {
    if (wc.qp_num == a->qp_num) mine = wc;
  }
  ASSERT_TRUE(mine.has_value());
  EXPECT_EQ(mine->wr_id, 1u);
  EXPECT_EQ(mine->status, GetParam().status) << ibv_wc_status_str(mine->status);
  EXPECT_EQ(emu_.State(a), IBV_QPS_ERR);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, ForcedNakTest,
    ::testing::Values(NakCase{"rnr=#1", IBV_WC_RNR_RETRY_EXC_ERR},
                      NakCase{"nak=invalid/#1", IBV_WC_REM_INV_REQ_ERR},
                      NakCase{"nak=access/#1", IBV_WC_REM_ACCESS_ERR},
                      NakCase{"nak=operational/#1", IBV_WC_REM_OP_ERR}));

TEST_F(FaultsTest, LossDuplicationReorderAndCorruptionStillDeliverEveryMessageOnce) {
  RcParams p;
  p.timeout = 1;
  auto [a, b] = Loopback(p);
  ASSERT_NE(a, nullptr);
  Faults("drop=0.1,dup=0.05,reorder=0.1,corrupt=0.05,seed=11");
  constexpr int kMessages = 64;
  for (int i = 0; i < kMessages; ++i) ASSERT_EQ(emu_.PostRecv(b, 1000 + i, *buf_, 65536 + i * 4096, 4096), 0);
  for (int i = 0; i < kMessages; ++i) {
    std::memset(buf_->data.data() + i * 1024, i, 1024);
    ASSERT_EQ(emu_.PostSend(a, i, IBV_WR_SEND, *buf_, i * 1024, 1024), 0);
  }
  int sends = 0, recvs = 0;
  const auto deadline = Clock::now() + 5s;
  while ((sends < kMessages || recvs < kMessages) && Clock::now() < deadline) {
    for (const ibv_wc& wc : emu_.PollAll(20ms)) {
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
      if (wc.opcode == IBV_WC_RECV) {
        EXPECT_EQ(wc.wr_id, 1000u + recvs) << "out of order or twice";
        const uint8_t* got = buf_->data.data() + 65536 + recvs * 4096;
        EXPECT_EQ(got[0], recvs);
        EXPECT_EQ(got[1023], recvs);
        ++recvs;
      } else {
        EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(sends));
        ++sends;
      }
    }
  }
  EXPECT_EQ(sends, kMessages);
  EXPECT_EQ(recvs, kMessages);
  const fault::FaultCounters c = FaultCounters();
  EXPECT_GT(c.dropped + c.duplicated + c.reordered + c.corrupted, 0u);
}

TEST_F(FaultsTest, ShapingSlowsATransferToTheRate) {
  auto [a, b] = Loopback();
  ASSERT_NE(a, nullptr);
  auto transfer = [&](uint64_t wr_id) {
    const auto start = Clock::now();
    if (emu_.PostSend(a, wr_id, IBV_WR_RDMA_WRITE, *buf_, 0, 256 * 1024, buf_->addr() + 512 * 1024,
                      buf_->mr->rkey) != 0) {
      return Clock::duration::max();
    }
    auto wc = emu_.Poll(5000ms);
    if (!wc || wc->status != IBV_WC_SUCCESS) return Clock::duration::max();
    return Clock::now() - start;
  };
  const auto unshaped = transfer(1);
  // 256 KiB plus framing at 40 Mb/s: about 54 ms.
  Faults("rate=40mbps");
  const auto shaped = transfer(2);
  EXPECT_GE(shaped, 45ms);
  EXPECT_LT(shaped, 2000ms);
  // (No comparison with the unshaped time: on a loaded machine that varies
  // more than the shaped one.)
  EXPECT_LT(unshaped, 5000ms);
  EXPECT_GT(FaultCounters().shaped, 0u);
  // Latency adds to every packet's trip.
  ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
  Faults("latency=20ms");
  ASSERT_EQ(emu_.PostSend(a, 3, IBV_WR_RDMA_WRITE, *buf_, 0, 8, buf_->addr() + 512 * 1024, buf_->mr->rkey), 0);
  const auto start = Clock::now();
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_GE(Clock::now() - start, 38ms) << "the request and its ACK each wait 20 ms";
}

}  // namespace
}  // namespace rdmaemu::testing
