// ACK coalescing (Engine::HoldAck) against a fake peer: the ACK of a QP
// that talks both ways leaves right behind its next request, or alone by
// its deadline; a QP that only receives ACKs at once; and a response that
// reaches the device together with a request completes first.
#include <infiniband/verbs.h>

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/engine/engine.h"
#include "emulator/wire/packet.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using namespace std::chrono_literals;
using wire::Opcode;

constexpr size_t kBytes = 8;

class AckHoldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok()) << "cannot bind the fake peer";
    buf_ = emu_.Register(4096, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(buf_, nullptr);
    qp_ = emu_.ConnectedQp();
    ASSERT_NE(qp_, nullptr);
  }

  // The next completion, polled as a program that spins on its CQ does.
  std::optional<ibv_wc> SpinPoll() { return emu_.Poll(2000ms, /*spin=*/true); }

  // The device sends a SEND at `psn` and the peer acknowledges it: the QP
  // has sent a request of its own.
  void DeviceSends(uint32_t psn, uint64_t wr_id) {
    ASSERT_EQ(emu_.PostSend(qp_, wr_id, IBV_WR_SEND, *buf_, 0, kBytes), 0);
    auto rx = peer_->Receive();
    // The ACK of the peer's last SEND may come first (not held).
    if (rx && rx->opcode == Opcode::RC_ACKNOWLEDGE) rx = peer_->Receive();
    ASSERT_TRUE(rx.has_value());
    ASSERT_EQ(rx->opcode, Opcode::RC_SEND_ONLY);
    ASSERT_EQ(rx->psn, psn);
    peer_->Send(FakePeer::Ack(qp_->qp_num, psn, wire::AckSyndrome(), psn - 499));
    auto wc = SpinPoll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_SEND);
  }

  // The peer sends a SEND at `psn` to a posted receive; its completion is
  // polled.
  void PeerSends(uint32_t psn) {
    ASSERT_EQ(emu_.PostRecv(qp_, 7, *buf_, 1024, 1024), 0);
    std::vector<uint8_t> data(kBytes, static_cast<uint8_t>(psn));
    peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp_->qp_num, psn), data);
    auto wc = SpinPoll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_RECV);
  }

  // The next two packets the peer receives: their opcodes and PSNs.
  std::vector<std::pair<Opcode, uint32_t>> NextTwo() {
    std::vector<std::pair<Opcode, uint32_t>> out;
    for (int i = 0; i < 2; ++i) {
      auto rx = peer_->Receive();
      if (!rx) break;
      EXPECT_TRUE(rx->icrc_ok);
      out.emplace_back(rx->opcode, rx->psn);
    }
    return out;
  }

  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
  ibv_qp* qp_ = nullptr;
};

TEST_F(AckHoldTest, InAPingPongTheAckLeavesBehindTheAnswer) {
  // A program answering each message. Once the exchange is a sustained
  // ping-pong (kAckHoldAfter), the peer's SEND is acknowledged right behind
  // the answer; before, ahead of it. The hold lasts 100 us (kAckHold): a
  // thread descheduled between its poll and its post lets it go alone
  // (and turns holding off for 10 ms), so not every round shows it.
  uint32_t request_psn = 500;
  DeviceSends(request_psn++, 1);
  int behind = 0;
  for (uint32_t round = 0; round < 48; ++round) {
    const uint32_t peer_psn = 100 + round;
    PeerSends(peer_psn);
    ASSERT_EQ(emu_.PostSend(qp_, 2, IBV_WR_SEND, *buf_, 0, kBytes), 0);
    const auto two = NextTwo();
    ASSERT_EQ(two.size(), 2u) << "round " << round;
    const auto answer = std::pair(Opcode::RC_SEND_ONLY, request_psn);
    const auto ack = std::pair(Opcode::RC_ACKNOWLEDGE, peer_psn);
    if (two[0] == answer) {
      EXPECT_EQ(two[1], ack) << "round " << round;
      // Each round is a message received and one sent.
      EXPECT_GE(2 * round + 1, engine::kAckHoldAfter) << "held before the exchange was a ping-pong";
      ++behind;
    } else {
      EXPECT_EQ(two[0], ack) << "round " << round;
      EXPECT_EQ(two[1], answer) << "round " << round;
    }
    peer_->Send(FakePeer::Ack(qp_->qp_num, request_psn, wire::AckSyndrome(), round + 2));
    auto wc = SpinPoll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->opcode, IBV_WC_SEND);
    ++request_psn;
  }
  EXPECT_GE(behind, 1) << "no ACK left behind its answer in 48 rounds";
}

TEST_F(AckHoldTest, AHeldAckLeavesAloneWhenNoAnswerFollows) {
  uint32_t request_psn = 500;
  DeviceSends(request_psn++, 1);
  for (uint32_t peer_psn = 100; peer_psn < 100 + engine::kAckHoldAfter + 4; ++peer_psn) {
    PeerSends(peer_psn);
    DeviceSends(request_psn++, 1);
    peer_->Drain();  // the ACK, wherever it went
  }
  const uint32_t last = 100 + engine::kAckHoldAfter + 4;
  PeerSends(last);
  // Nothing is posted: the ACK leaves by its deadline, long before a
  // requester's transport timer.
  const auto start = std::chrono::steady_clock::now();
  auto rx = peer_->Receive(2000ms);
  ASSERT_TRUE(rx.has_value());
  EXPECT_EQ(rx->opcode, Opcode::RC_ACKNOWLEDGE);
  EXPECT_EQ(rx->psn, last);
  EXPECT_EQ(rx->msn, last - 99);
  EXPECT_EQ(rx->syndrome, wire::AckSyndrome());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);
}

TEST_F(AckHoldTest, AQpThatHasSentNothingAcksAtOnce) {
  PeerSends(100);
  ASSERT_EQ(emu_.PostSend(qp_, 2, IBV_WR_SEND, *buf_, 0, kBytes), 0);
  const auto two = NextTwo();
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], std::pair(Opcode::RC_ACKNOWLEDGE, 100u));
  EXPECT_EQ(two[1], std::pair(Opcode::RC_SEND_ONLY, 500u));
}

TEST_F(AckHoldTest, AResponseThatArrivesWithARequestCompletesFirst) {
  // The device's SEND, not yet acknowledged.
  ASSERT_EQ(emu_.PostSend(qp_, 1, IBV_WR_SEND, *buf_, 0, kBytes), 0);
  auto rx = peer_->Receive();
  ASSERT_TRUE(rx.has_value());
  ASSERT_EQ(rx->opcode, Opcode::RC_SEND_ONLY);
  ASSERT_EQ(emu_.PostRecv(qp_, 7, *buf_, 1024, 1024), 0);
  // The peer's answer and then its ACK, as one datagram of two segments
  // (what a held ACK behind a request looks like on the wire).
  std::vector<uint8_t> data(kBytes, 0x5a);
  const std::vector<std::vector<uint8_t>> together = {
      peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp_->qp_num, 100), data),
      peer_->Build(FakePeer::Ack(qp_->qp_num, 500, wire::AckSyndrome(), 1))};
  ASSERT_GE(together[0].size(), together[1].size());
  ASSERT_TRUE(peer_->SendTogether(together)) << "UDP GSO refused";
  auto first = SpinPoll();
  auto second = SpinPoll();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(second.has_value());
  // The send completes first, as the ACK that a NIC sends ahead of the
  // answer would make it.
  EXPECT_EQ(first->opcode, IBV_WC_SEND);
  EXPECT_EQ(first->wr_id, 1u);
  EXPECT_EQ(second->opcode, IBV_WC_RECV);
  EXPECT_EQ(second->wr_id, 7u);
  EXPECT_EQ(second->byte_len, kBytes);
}

}  // namespace
}  // namespace rdmaemu::testing
