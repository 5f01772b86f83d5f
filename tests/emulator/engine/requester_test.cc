// The RC requester and completer against a fake responder: a UDP socket in
// the test that reads the engine's requests and answers with crafted ACKs,
// NAKs and read responses (issue 3, item 5).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "emulator/engine/engine.h"
#include "emulator/wire/psn.h"
#include "tests/emulator/engine/fake_peer.h"
#include "tests/emulator/engine/requester_fixture.h"

namespace rdmaemu::testing {
namespace {

using wire::NakCode;
using wire::Opcode;
using Clock = std::chrono::steady_clock;

TEST_F(RequesterTest, RnrNakIsRetriedAfterTheRnrDelay) {
  RcParams p;
  p.rnr_retry = 3;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 32), 0);
  RxPacket rx = NextRequest();
  ASSERT_EQ(rx.psn, 500u);
  // Timer code 18: 5.12 ms.
  const auto nak_at = Clock::now();
  Ack(qp, 500, wire::RnrNakSyndrome(18));
  rx = NextRequest();
  const auto retry_at = Clock::now();
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(rx.psn, 500u);
  EXPECT_EQ(rx.opcode, Opcode::RC_SEND_ONLY);
  EXPECT_GE(retry_at - nak_at, 4ms) << "retried before the RNR delay";
  EXPECT_TRUE(emu_.PollAll(5ms).empty()) << "an RNR NAK must not complete the WR";
  // A second RNR NAK, then the peer has a receive.
  Ack(qp, 500, wire::RnrNakSyndrome(1));
  rx = NextRequest();
  EXPECT_EQ(rx.psn, 500u);
  Ack(qp, 500, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 1u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_SEND);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
}

TEST_F(RequesterTest, RnrRetryZeroFailsOnTheFirstRnrNak) {
  RcParams p;
  p.rnr_retry = 0;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 32), 0);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 32, 32), 0);
  EXPECT_EQ(NextRequest().psn, 500u);
  EXPECT_EQ(NextRequest().psn, 501u);
  Ack(qp, 500, wire::RnrNakSyndrome(1));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 1u);
  EXPECT_EQ(wc->status, IBV_WC_RNR_RETRY_EXC_ERR);
  wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 2u);
  EXPECT_EQ(wc->status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_FALSE(peer_->Receive(100ms).has_value()) << "retried with rnr_retry 0";
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

TEST_F(RequesterTest, RnrNakImplicitlyAcknowledgesEarlierPsns) {
  RcParams p;
  p.rnr_retry = 7;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 32), 0);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 32, 32), 0);
  EXPECT_EQ(NextRequest().psn, 500u);
  EXPECT_EQ(NextRequest().psn, 501u);
  Ack(qp, 501, wire::RnrNakSyndrome(1));  // 500 arrived; 501 found no receive
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 1u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  RxPacket rx = NextRequest();
  EXPECT_EQ(rx.psn, 501u) << "only the RNR-NAKed PSN is resent";
  Ack(qp, 501);
  wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 2u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

// A peer that is not an emulated process (a NIC, rxe) numbers its QPs as it
// likes: bits 20-23 that name no host slot of its address (hosts.h) must
// not keep the packets from its UDP port, the service port.
TEST_F(RequesterTest, APeerQpnWhoseSlotBitsNameNoProcessIsReachedOnTheServicePort) {
  RcParams p;
  p.dest_qpn = 0x50abcd;  // bits 20-23: slot 5
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 32), 0);
  auto rx = peer_->Receive(2000ms);
  ASSERT_TRUE(rx.has_value()) << "the request never reached the peer's port";
  EXPECT_TRUE(rx->icrc_ok);
  EXPECT_EQ(rx->dest_qpn, 0x50abcdu);
  peer_->Send(FakePeer::Ack(qp->qp_num, rx->psn, wire::AckSyndrome(), 1));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(RequesterTest, SequenceNakRetransmitsFromThatPsn) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostSend(qp, 1 + i, IBV_WR_SEND, *buf_, i * 100, 100), 0);
  for (uint32_t psn = 500; psn <= 502; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  // 500 arrived, 501 was lost.
  Ack(qp, 501, wire::NakSyndrome(NakCode::kPsnSequenceError));
  for (uint32_t psn = 501; psn <= 502; ++psn) {
    RxPacket rx = NextRequest();
    EXPECT_EQ(rx.psn, psn);
    EXPECT_EQ(rx.opcode, Opcode::RC_SEND_ONLY);
    ASSERT_EQ(rx.payload.size(), 100u);
    EXPECT_EQ(std::memcmp(rx.payload.data(), buf_->data.data() + (psn - 500) * 100, 100), 0)
        << "a retransmission must carry the same bytes";
  }
  EXPECT_FALSE(peer_->Receive(50ms).has_value());
  Ack(qp, 502);
  for (int i = 0; i < 3; ++i) {
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->wr_id, 1u + i);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  }
}

// The responder NAKs a gap once (IBA 9.7.5.1.2), so a second sequence NAK
// for the PSN the requester is already going back to is a duplicate (the
// network duplicated it, or it was overtaken): it must neither cost a
// transport retry nor start a second go-back-N. With retry_cnt 1 the first
// NAK spends the only retry; a duplicate counted as a new one would fail the
// QP with RETRY_EXC_ERR.
TEST_F(RequesterTest, DuplicateSequenceNakIsIgnored) {
  RcParams p;
  p.retry_cnt = 1;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostSend(qp, 1 + i, IBV_WR_SEND, *buf_, i * 100, 100), 0);
  for (uint32_t psn = 500; psn <= 502; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  Ack(qp, 501, wire::NakSyndrome(NakCode::kPsnSequenceError));
  for (uint32_t psn = 501; psn <= 502; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  // The NAK acknowledged 500.
  auto first = emu_.Poll();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->wr_id, 1u);
  EXPECT_EQ(first->status, IBV_WC_SUCCESS);
  // The same NAK again, twice: nothing is resent and nothing fails.
  Ack(qp, 501, wire::NakSyndrome(NakCode::kPsnSequenceError));
  Ack(qp, 501, wire::NakSyndrome(NakCode::kPsnSequenceError));
  auto rx = peer_->Receive(50ms);
  EXPECT_FALSE(rx.has_value()) << "a duplicate NAK started another go-back-N from PSN " << rx->psn;
  EXPECT_TRUE(emu_.PollAll(5ms).empty()) << "a duplicate NAK completed a WR (retries spent?)";
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
  Ack(qp, 502);
  for (int i = 1; i < 3; ++i) {
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->wr_id, 1u + i);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  }
}

// A NAK for a later PSN is a new gap, even right after a go-back-N: 501 was
// resent and arrived, 502 was lost again.
TEST_F(RequesterTest, SequenceNakForALaterPsnIsANewGap) {
  RcParams p;
  p.retry_cnt = 1;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostSend(qp, 1 + i, IBV_WR_SEND, *buf_, i * 100, 100), 0);
  for (uint32_t psn = 500; psn <= 502; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  Ack(qp, 501, wire::NakSyndrome(NakCode::kPsnSequenceError));
  for (uint32_t psn = 501; psn <= 502; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  Ack(qp, 502, wire::NakSyndrome(NakCode::kPsnSequenceError));
  EXPECT_EQ(NextRequest().psn, 502u);
  EXPECT_FALSE(peer_->Receive(50ms).has_value());
  // The NAK acknowledged 501: two sends complete, the third waits.
  auto wcs = emu_.PollAll(20ms);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  Ack(qp, 502);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 3u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

TEST_F(RequesterTest, MultiPacketSendIsSegmentedAndRetransmittedFromTheNakedPsn) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 2500), 0);
  const Opcode ops[] = {Opcode::RC_SEND_FIRST, Opcode::RC_SEND_MIDDLE, Opcode::RC_SEND_LAST};
  for (uint32_t i = 0; i < 3; ++i) {
    RxPacket rx = NextRequest();
    EXPECT_EQ(rx.psn, 500 + i);
    EXPECT_EQ(rx.opcode, ops[i]);
    EXPECT_EQ(rx.ack_req, i == 2);
    EXPECT_EQ(rx.payload.size(), i == 2 ? 452u : 1024u);
  }
  Ack(qp, 501, wire::NakSyndrome(NakCode::kPsnSequenceError));
  RxPacket rx = NextRequest();
  EXPECT_EQ(rx.psn, 501u);
  EXPECT_EQ(rx.opcode, Opcode::RC_SEND_MIDDLE);
  EXPECT_EQ(NextRequest().psn, 502u);
  EXPECT_TRUE(emu_.PollAll(5ms).empty());
  Ack(qp, 502);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->byte_len, 2500u);
}

// A transport timeout says the responder is not keeping up: the requester
// goes back to one packet in flight (asking for its ACK) and each
// acknowledged PSN opens the window by one, up to half the window that timed
// out, then by one per window. Without it, every timeout resent the whole
// window and a slowed peer never caught up (congestion.h).
TEST_F(RequesterTest, TimeoutShrinksTheWindowToOnePacketAndAcksReopenIt) {
  RcParams p;
  // 537 ms: each round is answered well within it, even under ThreadSanitizer
  // (with 14, 67 ms, a slowed round timed out and 501 came again).
  p.timeout = 17;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 16384), 0);  // 16 packets
  for (uint32_t psn = 500; psn <= 515; ++psn) {
    RxPacket rx = NextRequest();
    ASSERT_EQ(rx.psn, psn);
    EXPECT_EQ(rx.ack_req, psn == 515) << psn;
  }
  // Nothing is acknowledged: the timer fires and only the first PSN goes.
  RxPacket rx = NextRequest();
  ASSERT_EQ(rx.psn, 500u);
  EXPECT_TRUE(rx.ack_req) << "the packet at the window's edge asks for an ACK";
  EXPECT_FALSE(peer_->Receive(20ms).has_value()) << "more than one packet in flight after a timeout";
  // Each round sends the next window; the last packet of each asks for the
  // ACK. Slow start doubles the window up to 8 (half of the 16 that timed
  // out), then it grows by one.
  const std::vector<std::pair<uint32_t, uint32_t>> rounds = {
      {501, 502}, {503, 506}, {507, 514}, {515, 515}};
  uint32_t acked = 500;
  for (auto [first, last] : rounds) {
    Ack(qp, acked);
    for (uint32_t psn = first; psn <= last; ++psn) {
      rx = NextRequest();
      ASSERT_EQ(rx.psn, psn);
      EXPECT_EQ(rx.ack_req, psn == last) << psn;
    }
    EXPECT_FALSE(peer_->Receive(20ms).has_value()) << "sent past the window ending at " << last;
    acked = last;
  }
  Ack(qp, 515);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->byte_len, 16384u);
}

TEST_F(RequesterTest, RemoteAccessNakCompletesWithRemAccessErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_RDMA_WRITE, *buf_, 0, 64, 0x10000, 0x1234), 0);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 0, 8), 0);
  RxPacket rx = NextRequest();
  EXPECT_EQ(rx.opcode, Opcode::RC_RDMA_WRITE_ONLY);
  EXPECT_EQ(rx.psn, 500u);
  ASSERT_TRUE(rx.has_reth);
  EXPECT_EQ(rx.reth_va, 0x10000u);
  EXPECT_EQ(rx.reth_rkey, 0x1234u);
  EXPECT_EQ(rx.reth_length, 64u);
  NextRequest();
  Ack(qp, 500, wire::NakSyndrome(NakCode::kRemoteAccessError));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 1u);
  EXPECT_EQ(wc->status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc->opcode, IBV_WC_RDMA_WRITE);
  wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 2u);
  EXPECT_EQ(wc->status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

TEST_F(RequesterTest, InvalidRequestNakCompletesWithRemInvReqErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 64), 0);
  EXPECT_EQ(NextRequest().psn, 500u);
  Ack(qp, 500, wire::NakSyndrome(NakCode::kInvalidRequest));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 1u);
  EXPECT_EQ(wc->status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

TEST_F(RequesterTest, RemoteOperationalNakCompletesWithRemOpErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 64), 0);
  EXPECT_EQ(NextRequest().psn, 500u);
  Ack(qp, 500, wire::NakSyndrome(NakCode::kRemoteOperationalError));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_REM_OP_ERR);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

// A WQE whose local SGE is outside every region fails at once with a local
// protection error when nothing is ahead of it: no packet, no waiting for an
// ACK that can never come (it used to time out into RETRY_EXC_ERR after
// every retry; rdma-core's test_atomic_invalid_lkey saw that).
TEST_F(RequesterTest, LocalProtectionErrorAtTheFrontCompletesAtOnce) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  const auto start = Clock::now();
  ASSERT_EQ(emu_.PostSend(qp, 7, IBV_WR_SEND, *buf_, buf_->data.size(), 64), 0);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 7u);
  EXPECT_EQ(wc->status, IBV_WC_LOC_PROT_ERR);
  EXPECT_LT(Clock::now() - start, 1s) << "not after the transport timer";
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
  EXPECT_FALSE(peer_->Receive(50ms).has_value()) << "nothing goes out";
}

// Behind a sent WQE it waits for that one's ACK: completions stay in order.
TEST_F(RequesterTest, LocalProtectionErrorBehindASendCompletesAfterItsAck) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 64), 0);
  EXPECT_EQ(NextRequest().psn, 500u);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_RDMA_WRITE, *buf_, buf_->data.size(), 64, 0x10000, 0x1234),
            0);
  EXPECT_TRUE(emu_.PollAll(20ms).empty()) << "completed before the first one's ACK";
  Ack(qp, 500);
  auto wcs = emu_.PollAll(100ms);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

// A READ's local buffer is where its response goes: a NIC finds it bad when
// the response arrives, so the request is sent and the WQE fails then.
TEST_F(RequesterTest, ReadWithABadLocalBufferIsSentAndFailsWhenItsResponseArrives) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 3, IBV_WR_RDMA_READ, *buf_, buf_->data.size(), 64, 0x10000, 0x1234), 0);
  RxPacket rx = NextRequest();
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(rx.opcode, Opcode::RC_RDMA_READ_REQUEST);
  EXPECT_EQ(rx.psn, 500u);
  EXPECT_TRUE(emu_.PollAll(20ms).empty()) << "failed before the response";
  std::vector<uint8_t> remote(64, 0xee);
  wire::PacketFields f;
  f.bth.dest_qpn = qp->qp_num;
  f.aeth.syndrome = wire::AckSyndrome();
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
  f.bth.psn = 500;
  peer_->Send(f, std::span<const uint8_t>(remote));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 3u);
  EXPECT_EQ(wc->status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

TEST_F(RequesterTest, OneAckForTheLastOfSeveralSendsCompletesThemAllInOrder) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(emu_.PostSend(qp, 10 + i, IBV_WR_SEND, *buf_, i * 16, 16), 0);
  for (uint32_t psn = 500; psn <= 504; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  EXPECT_TRUE(emu_.PollAll(20ms).empty()) << "completed before any ACK";
  Ack(qp, 504);
  for (int i = 0; i < 5; ++i) {
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->wr_id, 10u + i);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->opcode, IBV_WC_SEND);
  }
  // A stale (duplicate) ACK changes nothing.
  Ack(qp, 502);
  EXPECT_TRUE(emu_.PollAll(20ms).empty());
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
}

TEST_F(RequesterTest, PartialAckCompletesOnlyTheAcknowledgedSends) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(emu_.PostSend(qp, 10 + i, IBV_WR_SEND, *buf_, i * 16, 16), 0);
  for (uint32_t psn = 500; psn <= 503; ++psn) EXPECT_EQ(NextRequest().psn, psn);
  Ack(qp, 501);
  auto wcs = emu_.PollAll(50ms);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 10u);
  EXPECT_EQ(wcs[1].wr_id, 11u);
  Ack(qp, 503);
  wcs = emu_.PollAll(50ms);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 12u);
  EXPECT_EQ(wcs[1].wr_id, 13u);
}

TEST_F(RequesterTest, RdmaReadResponsesLandInTheLocalBufferAndComplete) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  std::fill(buf_->data.begin() + 4096, buf_->data.begin() + 8192, 0);
  ASSERT_EQ(emu_.PostSend(qp, 77, IBV_WR_RDMA_READ, *buf_, 4096, 2500, 0x7000, 0x4321), 0);
  RxPacket rx = NextRequest();
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(rx.opcode, Opcode::RC_RDMA_READ_REQUEST);
  EXPECT_EQ(rx.psn, 500u);
  ASSERT_TRUE(rx.has_reth);
  EXPECT_EQ(rx.reth_va, 0x7000u);
  EXPECT_EQ(rx.reth_rkey, 0x4321u);
  EXPECT_EQ(rx.reth_length, 2500u);
  EXPECT_TRUE(rx.payload.empty());

  std::vector<uint8_t> remote(2500);
  for (size_t i = 0; i < remote.size(); ++i) remote[i] = static_cast<uint8_t>(0xa0 ^ (i * 5));
  std::span<const uint8_t> r(remote);
  wire::PacketFields f;
  f.bth.dest_qpn = qp->qp_num;
  f.aeth.syndrome = wire::AckSyndrome();
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_FIRST;
  f.bth.psn = 500;
  peer_->Send(f, r.subspan(0, 1024));
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_MIDDLE;
  f.bth.psn = 501;
  peer_->Send(f, r.subspan(1024, 1024));
  EXPECT_TRUE(emu_.PollAll(10ms).empty());
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_LAST;
  f.bth.psn = 502;
  peer_->Send(f, r.subspan(2048));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 77u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc->byte_len, 2500u);
  EXPECT_EQ(std::memcmp(buf_->data.data() + 4096, remote.data(), remote.size()), 0);
  EXPECT_EQ(buf_->data[4096 + 2500], 0);

  // The read took PSNs 500-502: the next request is 503.
  ASSERT_EQ(emu_.PostSend(qp, 78, IBV_WR_SEND, *buf_, 0, 8), 0);
  EXPECT_EQ(NextRequest().psn, 503u);
  Ack(qp, 503);
  wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 78u);
}

TEST_F(RequesterTest, LostReadResponseIsRequestedAgainForWhatIsMissing) {
  RcParams p;
  // 268 ms: the FIRST response must arrive before the timer fires (4 ms,
  // timeout 10, was too short for a TSan build on a loaded machine).
  p.timeout = 16;
  p.retry_cnt = 7;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 5, IBV_WR_RDMA_READ, *buf_, 4096, 2048, 0x9000, 0x55), 0);
  RxPacket rx = NextRequest();
  EXPECT_EQ(rx.psn, 500u);
  std::vector<uint8_t> remote(2048, 0xc3);
  wire::PacketFields f;
  f.bth.dest_qpn = qp->qp_num;
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_FIRST;
  f.bth.psn = 500;
  peer_->Send(f, std::span<const uint8_t>(remote).first(1024));
  // LAST is lost: after the timeout the engine asks for the rest only.
  rx = NextRequest();
  EXPECT_EQ(rx.opcode, Opcode::RC_RDMA_READ_REQUEST);
  EXPECT_EQ(rx.psn, 501u);
  EXPECT_EQ(rx.reth_va, 0x9000u + 1024);
  EXPECT_EQ(rx.reth_length, 1024u);
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
  f.bth.psn = 501;
  peer_->Send(f, std::span<const uint8_t>(remote).subspan(1024));
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_RDMA_READ);
  EXPECT_TRUE(std::all_of(buf_->data.begin() + 4096, buf_->data.begin() + 4096 + 2048,
                          [](uint8_t c) { return c == 0xc3; }));
}

// A READ response lost in the middle: the rest of the stream arrives out of
// sequence. Only the READ is asked for again, from the missing PSN, and only
// once for the gap: the SEND behind it reached the responder (a response,
// not a request, was lost), so going back N would resend it as a duplicate,
// once per out-of-sequence response.
TEST_F(RequesterTest, ReadResponseGapReRequestsOnlyTheReadOnce) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_RDMA_READ, *buf_, 4096, 3072, 0x7000, 0x4321), 0);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 0, 64), 0);
  EXPECT_EQ(NextRequest().opcode, Opcode::RC_RDMA_READ_REQUEST);
  RxPacket send = NextRequest();
  EXPECT_EQ(send.opcode, Opcode::RC_SEND_ONLY);
  EXPECT_EQ(send.psn, 503u);
  ASSERT_FALSE(HasFailure());

  std::vector<uint8_t> remote(3072, 0x5a);
  std::span<const uint8_t> r(remote);
  wire::PacketFields f;
  f.bth.dest_qpn = qp->qp_num;
  f.aeth.syndrome = wire::AckSyndrome();
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_FIRST;
  f.bth.psn = 500;
  peer_->Send(f, r.subspan(0, 1024));
  // 501 is lost; 502 and a copy of it arrive out of sequence.
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_LAST;
  f.bth.psn = 502;
  peer_->Send(f, r.subspan(2048));
  peer_->Send(f, r.subspan(2048));
  RxPacket again = NextRequest();
  EXPECT_EQ(again.opcode, Opcode::RC_RDMA_READ_REQUEST);
  EXPECT_EQ(again.psn, 501u);
  EXPECT_EQ(again.reth_va, 0x7000u + 1024);
  EXPECT_EQ(again.reth_length, 2048u);
  auto extra = peer_->Receive(50ms);
  EXPECT_FALSE(extra.has_value()) << "sent again: opcode " << static_cast<int>(extra->opcode)
                                  << " PSN " << extra->psn;

  // The responder answers the re-request; then the SEND's ACK.
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_FIRST;
  f.bth.psn = 501;
  peer_->Send(f, r.subspan(1024, 1024));
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_LAST;
  f.bth.psn = 502;
  peer_->Send(f, r.subspan(2048));
  Ack(qp, 503);
  for (uint64_t id = 1; id <= 2; ++id) {
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->wr_id, id);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  }
  EXPECT_TRUE(std::all_of(buf_->data.begin() + 4096, buf_->data.begin() + 4096 + 3072,
                          [](uint8_t c) { return c == 0x5a; }));
}

// An ACK past a READ whose response never came says the response was lost
// (IBA 9.7.5.1.1): the READ alone is asked for again, once, however many
// such ACKs arrive (a responder re-acknowledges every duplicate request).
TEST_F(RequesterTest, AckPastAnUnansweredReadReRequestsOnlyTheReadOnce) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_RDMA_READ, *buf_, 4096, 1024, 0x7000, 0x4321), 0);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 0, 64), 0);
  EXPECT_EQ(NextRequest().psn, 500u);
  EXPECT_EQ(NextRequest().psn, 501u);
  ASSERT_FALSE(HasFailure());
  for (int i = 0; i < 3; ++i) Ack(qp, 501);
  RxPacket again = NextRequest();
  EXPECT_EQ(again.opcode, Opcode::RC_RDMA_READ_REQUEST);
  EXPECT_EQ(again.psn, 500u);
  auto extra = peer_->Receive(50ms);
  EXPECT_FALSE(extra.has_value()) << "sent again: opcode " << static_cast<int>(extra->opcode)
                                  << " PSN " << extra->psn;
  std::vector<uint8_t> remote(1024, 0x3c);
  wire::PacketFields f;
  f.bth.dest_qpn = qp->qp_num;
  f.aeth.syndrome = wire::AckSyndrome();
  f.opcode = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
  f.bth.psn = 500;
  peer_->Send(f, remote);
  for (uint64_t id = 1; id <= 2; ++id) {
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->wr_id, id);
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  }
}

}  // namespace
}  // namespace rdmaemu::testing
