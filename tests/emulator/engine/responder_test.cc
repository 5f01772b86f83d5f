// The RC responder against a fake requester: a UDP socket in the test that
// crafts RoCEv2 requests and reads the engine's ACKs, NAKs, read responses
// and atomic ACKs (issue 3, items 2, 5 and 6).
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "emulator/engine/engine.h"
#include "emulator/wire/psn.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::AethType;
using wire::NakCode;
using wire::Opcode;

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

class ResponderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok()) << "cannot bind the fake peer";
    recv_ = emu_.Register(16384, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(recv_, nullptr);
  }

  // The engine's counters (the engine is shared while our context is open).
  engine::CounterValues Counters() {
    if (!engine_) engine_ = engine::AcquireEngine(0).value();
    return engine_->counters();
  }

  // Sends a SEND_ONLY with `data` at `psn`.
  void SendOnly(ibv_qp* qp, uint32_t psn, std::span<const uint8_t> data, bool ack_req = true) {
    peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, psn, ack_req), data);
  }

  // Expects the next packet to be an ACKNOWLEDGE with this PSN and syndrome.
  void ExpectAck(uint32_t psn, uint8_t syndrome, std::optional<uint32_t> msn = std::nullopt) {
    auto rx = peer_->Receive();
    ASSERT_TRUE(rx.has_value()) << "no answer; expected an ACKNOWLEDGE for PSN " << psn;
    EXPECT_TRUE(rx->icrc_ok);
    EXPECT_EQ(rx->opcode, Opcode::RC_ACKNOWLEDGE);
    EXPECT_EQ(rx->dest_qpn, kPeerQpn);
    EXPECT_EQ(rx->pkey, wire::kDefaultPkey);
    EXPECT_EQ(rx->psn, psn);
    EXPECT_EQ(static_cast<int>(rx->syndrome), static_cast<int>(syndrome))
        << "type " << wire::ToString(rx->aeth_type()) << " value " << int(rx->aeth_value());
    if (msn) {
      EXPECT_EQ(rx->msn, *msn);
    }
  }

  void ExpectSilence(std::chrono::milliseconds window = 150ms) {
    auto rx = peer_->Receive(window);
    EXPECT_FALSE(rx.has_value()) << "unexpected packet opcode "
                                 << static_cast<int>(rx->opcode) << " PSN " << rx->psn;
  }

  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* recv_ = nullptr;
  std::shared_ptr<engine::Engine> engine_;
};

TEST_F(ResponderTest, InOrderSendOnlyIsAckedWithPsnAndMsnAndDelivered) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 41, *recv_, 0, 256), 0);
  auto data = Pattern(50, 3);
  SendOnly(qp, 100, data);
  ExpectAck(100, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_RECV);
  EXPECT_EQ(wc->wr_id, 41u);
  EXPECT_EQ(wc->byte_len, 50u);
  EXPECT_EQ(wc->qp_num, qp->qp_num);
  EXPECT_EQ(std::memcmp(recv_->data.data(), data.data(), data.size()), 0);

  // A second message: the MSN counts messages.
  ASSERT_EQ(emu_.PostRecv(qp, 42, *recv_, 1024, 256), 0);
  SendOnly(qp, 101, Pattern(8, 9));
  ExpectAck(101, wire::AckSyndrome(), 2);
  wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 42u);
}

TEST_F(ResponderTest, SendFirstMiddleLastAcrossMtuPacketsIsReassembled) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 7, *recv_, 0, 4096), 0);
  auto data = Pattern(2500, 1);
  std::span<const uint8_t> all(data);
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_FIRST, qp->qp_num, 100, false), all.subspan(0, 1024));
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_MIDDLE, qp->qp_num, 101, false),
              all.subspan(1024, 1024));
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_LAST, qp->qp_num, 102, true), all.subspan(2048));
  // One ACK, for the LAST packet; none for FIRST and MIDDLE.
  ExpectAck(102, wire::AckSyndrome(), 1);
  ExpectSilence(50ms);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->wr_id, 7u);
  EXPECT_EQ(wc->byte_len, 2500u);
  EXPECT_EQ(std::memcmp(recv_->data.data(), data.data(), data.size()), 0);
}

TEST_F(ResponderTest, PsnAheadGivesExactlyOneSequenceNakThenInOrderResumes) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostRecv(qp, 10 + i, *recv_, i * 1024, 1024), 0);
  const uint64_t oos_before = Counters().out_of_sequence;
  // 100 is lost: 101, 102, 103 arrive.
  for (uint32_t psn = 101; psn <= 103; ++psn) SendOnly(qp, psn, Pattern(16, psn));
  ExpectAck(100, wire::NakSyndrome(NakCode::kPsnSequenceError));
  ExpectSilence();  // one NAK per gap, not one per packet
  EXPECT_EQ(Counters().out_of_sequence - oos_before, 3u);
  EXPECT_TRUE(emu_.PollAll(20ms).empty()) << "nothing may be delivered out of order";

  // The requester goes back to 100.
  for (uint32_t psn = 100; psn <= 102; ++psn) {
    SendOnly(qp, psn, Pattern(16, psn));
    ExpectAck(psn, wire::AckSyndrome(), psn - 99);
  }
  for (int i = 0; i < 3; ++i) {
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, 10u + i);
    auto want = Pattern(16, 100 + i);
    EXPECT_EQ(std::memcmp(recv_->data.data() + i * 1024, want.data(), 16), 0);
  }
  // A new gap gets a new NAK.
  ASSERT_EQ(emu_.PostRecv(qp, 20, *recv_, 4096, 64), 0);
  SendOnly(qp, 105, Pattern(4, 0));
  ExpectAck(103, wire::NakSyndrome(NakCode::kPsnSequenceError));
}

TEST_F(ResponderTest, DuplicateSendIsReackedNotDeliveredTwice) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 1, *recv_, 0, 256), 0);
  ASSERT_EQ(emu_.PostRecv(qp, 2, *recv_, 256, 256), 0);
  const uint64_t dup_before = Counters().duplicates;
  SendOnly(qp, 100, Pattern(32, 1));
  ExpectAck(100, wire::AckSyndrome(), 1);
  // The ACK was "lost": the requester sends 100 again.
  SendOnly(qp, 100, Pattern(32, 1));
  ExpectAck(100, wire::AckSyndrome(), 1);
  EXPECT_EQ(Counters().duplicates - dup_before, 1u);
  auto wcs = emu_.PollAll(150ms);
  ASSERT_EQ(wcs.size(), 1u) << "the duplicate consumed a second receive";
  EXPECT_EQ(wcs[0].wr_id, 1u);
  // The second receive is still there for the next message.
  SendOnly(qp, 101, Pattern(32, 2));
  ExpectAck(101, wire::AckSyndrome(), 2);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 2u);
}

TEST_F(ResponderTest, SendWithoutReceiveGetsRnrNakWithMinRnrTimerThenRetryIsAccepted) {
  RcParams p;
  p.min_rnr_timer = 14;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  auto data = Pattern(40, 5);
  SendOnly(qp, 100, data);
  ExpectAck(100, wire::RnrNakSyndrome(14));
  EXPECT_TRUE(emu_.PollAll(20ms).empty());
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
  ASSERT_EQ(emu_.PostRecv(qp, 3, *recv_, 0, 64), 0);
  SendOnly(qp, 100, data);  // the requester's retry
  ExpectAck(100, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->byte_len, 40u);
  EXPECT_EQ(std::memcmp(recv_->data.data(), data.data(), data.size()), 0);
}

// The packets a requester pipelined behind an RNR NAKed one are silently
// dropped: the RNR NAK already sends the requester back to its PSN, and a
// sequence NAK on top would cost it a transport retry for every RNR round,
// failing a QP with rnr_retry=7 (forever) with RETRY_EXC_ERR instead (the
// soak test found this while the receiver was slow to repost).
TEST_F(ResponderTest, PacketsBehindAnRnrNakGetNoSequenceNak) {
  RcParams p;
  p.min_rnr_timer = 14;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  const uint64_t oos_before = Counters().out_of_sequence;
  for (int round = 0; round < 3; ++round) {
    for (uint32_t psn = 100; psn <= 102; ++psn) SendOnly(qp, psn, Pattern(16, psn));
    ExpectAck(100, wire::RnrNakSyndrome(14));
    ExpectSilence(100ms);
  }
  EXPECT_EQ(Counters().out_of_sequence - oos_before, 6u);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostRecv(qp, 30 + i, *recv_, i * 64, 64), 0);
  for (uint32_t psn = 100; psn <= 102; ++psn) {
    SendOnly(qp, psn, Pattern(16, psn));
    ExpectAck(psn, wire::AckSyndrome(), psn - 99);
  }
  auto wcs = emu_.PollAll(100ms);
  ASSERT_EQ(wcs.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(wcs[i].wr_id, 30u + i);
  // A later gap still gets its sequence NAK.
  ASSERT_EQ(emu_.PostRecv(qp, 40, *recv_, 0, 64), 0);
  SendOnly(qp, 104, Pattern(4, 0));
  ExpectAck(103, wire::NakSyndrome(NakCode::kPsnSequenceError));
}

// ---------------------------------------------------------------- protection

class WriteProtectionTest : public ResponderTest {
 protected:
  // A WRITE_ONLY of 64 bytes that must be refused with `nak`; memory stays
  // as it was and the QP goes to ERR.
  void ExpectRefusedWrite(ibv_qp* qp, uint64_t va, uint32_t rkey, uint32_t length, NakCode nak) {
    wire::PacketFields f = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 100);
    f.reth = {va, rkey, length};
    auto data = Pattern(length, 0x33);
    peer_->Send(f, data);
    ExpectAck(100, wire::NakSyndrome(nak));
    for (auto* b : {writable_, readonly_}) {
      EXPECT_TRUE(std::all_of(b->data.begin(), b->data.end(), [](uint8_t c) { return c == 0x5a; }))
          << "memory was written";
    }
    EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
    // A QP in ERR answers nothing.
    f.bth.psn = 101;
    f.reth = {writable_->addr(), writable_->mr->rkey, 8};
    peer_->Send(f, std::span<const uint8_t>(data).first(8));
    ExpectSilence();
    EXPECT_EQ(writable_->data[0], 0x5a);
  }

  void SetUp() override {
    ResponderTest::SetUp();
    writable_ = emu_.Register(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x5a);
    readonly_ = emu_.Register(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0x5a);
    ASSERT_NE(writable_, nullptr);
    ASSERT_NE(readonly_, nullptr);
  }
  EmuRc::Buffer* writable_ = nullptr;
  EmuRc::Buffer* readonly_ = nullptr;
};

TEST_F(WriteProtectionTest, ValidWriteLandsAndIsAcked) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  wire::PacketFields f = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 100);
  f.reth = {writable_->addr() + 100, writable_->mr->rkey, 64};
  auto data = Pattern(64, 1);
  peer_->Send(f, data);
  ExpectAck(100, wire::AckSyndrome(), 1);
  EXPECT_EQ(std::memcmp(writable_->data.data() + 100, data.data(), 64), 0);
  EXPECT_EQ(writable_->data[99], 0x5a);
  EXPECT_EQ(writable_->data[164], 0x5a);
}

TEST_F(WriteProtectionTest, BadRkeyIsNakedRemoteAccessAndQpGoesToErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ExpectRefusedWrite(qp, writable_->addr(), writable_->mr->rkey ^ 0x00ff0000, 64,
                     NakCode::kRemoteAccessError);
}

TEST_F(WriteProtectionTest, OutOfBoundsIsNakedRemoteAccessAndQpGoesToErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ExpectRefusedWrite(qp, writable_->addr() + 4096 - 10, writable_->mr->rkey, 64,
                     NakCode::kRemoteAccessError);
}

TEST_F(WriteProtectionTest, MrWithoutRemoteWriteIsNakedRemoteAccessAndQpGoesToErr) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ExpectRefusedWrite(qp, readonly_->addr(), readonly_->mr->rkey, 64, NakCode::kRemoteAccessError);
}

TEST_F(WriteProtectionTest, QpWithoutRemoteWriteIsNakedInvalidRequestAndQpGoesToErr) {
  RcParams p;
  p.access = IBV_ACCESS_REMOTE_READ;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ExpectRefusedWrite(qp, writable_->addr(), writable_->mr->rkey, 64, NakCode::kInvalidRequest);
}

TEST_F(WriteProtectionTest, MrOfAnotherPdIsNakedRemoteAccess) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ibv_pd* other = ibv_alloc_pd(emu_.ctx());
  ASSERT_NE(other, nullptr);
  std::vector<uint8_t> mem(4096, 0x5a);
  ibv_mr* mr = ibv_reg_mr(other, mem.data(), mem.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  wire::PacketFields f = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 100);
  f.reth = {reinterpret_cast<uintptr_t>(mem.data()), mr->rkey, 64};
  peer_->Send(f, Pattern(64, 1));
  ExpectAck(100, wire::NakSyndrome(NakCode::kRemoteAccessError));
  EXPECT_TRUE(std::all_of(mem.begin(), mem.end(), [](uint8_t c) { return c == 0x5a; }));
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// An RDMA WRITE with immediate needs a receive: without one it is RNR NAKed
// and must leave the responder exactly as before, so that the requester's
// retry of the same packet is accepted (the soak test found an ONLY packet
// refused as "out of the opcode sequence" on its retry).
TEST_F(WriteProtectionTest, WriteOnlyWithImmWithoutReceiveGetsRnrNakThenRetryLands) {
  RcParams p;
  p.min_rnr_timer = 14;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  wire::PacketFields f =
      FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, qp->qp_num, 100);
  f.reth = {writable_->addr() + 16, writable_->mr->rkey, 64};
  f.imm = 0x1234;
  auto data = Pattern(64, 9);
  peer_->Send(f, data);
  ExpectAck(100, wire::RnrNakSyndrome(14));
  EXPECT_EQ(writable_->data[16], 0x5a) << "an RNR NAKed WRITE must not have written";
  EXPECT_TRUE(emu_.PollAll(20ms).empty());
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);

  ASSERT_EQ(emu_.PostRecv(qp, 8, *recv_, 0, 64), 0);
  peer_->Send(f, data);  // the requester's retry, the same packet
  ExpectAck(100, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc->wr_id, 8u);
  EXPECT_EQ(wc->byte_len, 64u);
  EXPECT_EQ(ntohl(wc->imm_data), 0x1234u);
  EXPECT_EQ(std::memcmp(writable_->data.data() + 16, data.data(), 64), 0);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
}

// The same with a multi-packet WRITE: the RNR NAK comes at the LAST packet,
// and the retried LAST completes the message.
TEST_F(WriteProtectionTest, WriteLastWithImmWithoutReceiveGetsRnrNakThenRetryLands) {
  RcParams p;
  p.min_rnr_timer = 14;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  auto data = Pattern(1500, 4);
  std::span<const uint8_t> all(data);
  wire::PacketFields first = FakePeer::Request(Opcode::RC_RDMA_WRITE_FIRST, qp->qp_num, 100, false);
  first.reth = {writable_->addr(), writable_->mr->rkey, 1500};
  peer_->Send(first, all.first(1024));
  wire::PacketFields last =
      FakePeer::Request(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, qp->qp_num, 101);
  last.imm = 0x77;
  peer_->Send(last, all.subspan(1024));
  ExpectAck(101, wire::RnrNakSyndrome(14));
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);

  ASSERT_EQ(emu_.PostRecv(qp, 9, *recv_, 0, 64), 0);
  peer_->Send(last, all.subspan(1024));
  ExpectAck(101, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc->opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc->byte_len, 1500u);
  EXPECT_EQ(ntohl(wc->imm_data), 0x77u);
  EXPECT_EQ(std::memcmp(writable_->data.data(), data.data(), data.size()), 0);
}

// ---------------------------------------------------------------- READ

TEST_F(ResponderTest, ReadIsAnsweredFirstMiddleLastAndDuplicateIsReplayed) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  auto* src = emu_.Register(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(src, nullptr);
  auto data = Pattern(3000, 11);
  std::memcpy(src->data.data() + 8, data.data(), data.size());

  wire::PacketFields f = FakePeer::Request(Opcode::RC_RDMA_READ_REQUEST, qp->qp_num, 100);
  f.reth = {src->addr() + 8, src->mr->rkey, 3000};
  auto check_responses = [&](uint32_t from_psn) {
    const Opcode want_op[] = {Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                              Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                              Opcode::RC_RDMA_READ_RESPONSE_LAST};
    std::vector<uint8_t> got;
    for (uint32_t psn = from_psn; psn <= 102; ++psn) {
      auto rx = peer_->Receive();
      ASSERT_TRUE(rx.has_value()) << "missing read response PSN " << psn;
      EXPECT_TRUE(rx->icrc_ok);
      EXPECT_EQ(rx->opcode, want_op[psn - 100]);
      EXPECT_EQ(rx->psn, psn);
      EXPECT_EQ(rx->dest_qpn, kPeerQpn);
      if (psn != 101) {
        ASSERT_TRUE(rx->has_aeth);
        EXPECT_EQ(rx->aeth_type(), AethType::kAck);
      }
      EXPECT_EQ(rx->payload.size(), psn == 102 ? 3000u - 2048u : 1024u);
      got.insert(got.end(), rx->payload.begin(), rx->payload.end());
    }
    const size_t off = (from_psn - 100) * 1024;
    ASSERT_EQ(got.size(), data.size() - off);
    EXPECT_EQ(std::memcmp(got.data(), data.data() + off, got.size()), 0);
  };
  peer_->Send(f);
  check_responses(100);
  ExpectSilence(50ms);

  // The responses were lost: the same request again is answered again.
  peer_->Send(f);
  check_responses(100);
  ExpectSilence(50ms);
  // A retry asking from the middle (as a requester resumes a partial read).
  f.bth.psn = 101;
  f.reth = {src->addr() + 8 + 1024, src->mr->rkey, 3000 - 1024};
  peer_->Send(f);
  check_responses(101);

  // The responder moved on to PSN 103.
  ASSERT_EQ(emu_.PostRecv(qp, 5, *recv_, 0, 64), 0);
  SendOnly(qp, 103, Pattern(8, 0));
  ExpectAck(103, wire::AckSyndrome(), 2);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
}

TEST_F(ResponderTest, ReadWithoutRemoteReadRightIsNakedRemoteAccess) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  auto* src = emu_.Register(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  wire::PacketFields f = FakePeer::Request(Opcode::RC_RDMA_READ_REQUEST, qp->qp_num, 100);
  f.reth = {src->addr(), src->mr->rkey, 100};
  peer_->Send(f);
  ExpectAck(100, wire::NakSyndrome(NakCode::kRemoteAccessError));
  ExpectSilence(50ms);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

// A duplicate READ is answered from memory as it is now, so it is checked
// as a new one: after ibv_rereg_mr took the region's REMOTE_READ right away
// or moved it to another PD, the same rkey reads nothing (the model check
// of the protection boundary found the duplicate answered from the old
// rights).
TEST_F(ResponderTest, DuplicateReadAfterReregistrationIsCheckedAgainstTheNewRights) {
  auto data = Pattern(1500, 21);
  for (int change : {IBV_REREG_MR_CHANGE_ACCESS, IBV_REREG_MR_CHANGE_PD}) {
    RcParams p;
    p.rq_psn = 100;
    ibv_qp* qp = emu_.ConnectedQp(p);
    ASSERT_NE(qp, nullptr);
    ibv_pd* other = ibv_alloc_pd(emu_.ctx());
    ASSERT_NE(other, nullptr);
    std::vector<uint8_t> mem(data);
    ibv_mr* mr = ibv_reg_mr(emu_.pd(), mem.data(), mem.size(),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr, nullptr);
    wire::PacketFields f = FakePeer::Request(Opcode::RC_RDMA_READ_REQUEST, qp->qp_num, 100);
    f.reth = {reinterpret_cast<uintptr_t>(mem.data()), mr->rkey, 1500};
    peer_->Send(f);
    auto first = peer_->Receive();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    ASSERT_TRUE(peer_->Receive().has_value());  // the LAST

    ASSERT_EQ(ibv_rereg_mr(mr, change, other, nullptr, 0, IBV_ACCESS_LOCAL_WRITE), 0);
    EXPECT_EQ(mr->rkey, f.reth.rkey) << "the key stays: the duplicate names the same region";
    peer_->Send(f);  // the responses were "lost": the same READ again
    ExpectAck(100, wire::NakSyndrome(NakCode::kRemoteAccessError));
    ExpectSilence(50ms);
    EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
    EXPECT_EQ(ibv_dealloc_pd(other), 0);
  }
}

// ---------------------------------------------------------------- atomics

TEST_F(ResponderTest, AtomicsReturnOriginalValueAndDuplicatesAreNotExecutedTwice) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  auto* mem = emu_.Register(64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(mem, nullptr);
  uint64_t* target = reinterpret_cast<uint64_t*>(mem->data.data() + 8);
  *target = 10;

  auto expect_atomic_ack = [&](uint32_t psn, uint64_t orig) {
    auto rx = peer_->Receive();
    ASSERT_TRUE(rx.has_value()) << "no ATOMIC_ACKNOWLEDGE for PSN " << psn;
    EXPECT_TRUE(rx->icrc_ok);
    EXPECT_EQ(rx->opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    EXPECT_EQ(rx->psn, psn);
    EXPECT_EQ(rx->aeth_type(), AethType::kAck);
    ASSERT_TRUE(rx->has_atomic_ack);
    EXPECT_EQ(rx->orig_data, orig);
  };

  wire::PacketFields add = FakePeer::Request(Opcode::RC_FETCH_ADD, qp->qp_num, 100);
  add.atomic_eth = {mem->addr() + 8, mem->mr->rkey, 5, 0};
  peer_->Send(add);
  expect_atomic_ack(100, 10);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 15u);
  peer_->Send(add);  // duplicate
  expect_atomic_ack(100, 10);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 15u) << "the duplicate added again";

  wire::PacketFields cas = FakePeer::Request(Opcode::RC_COMPARE_SWAP, qp->qp_num, 101);
  cas.atomic_eth = {mem->addr() + 8, mem->mr->rkey, 99, 15};
  peer_->Send(cas);
  expect_atomic_ack(101, 15);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 99u);
  peer_->Send(cas);  // duplicate: the original value, not a second compare
  expect_atomic_ack(101, 15);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 99u);
  // An older duplicate still finds its own answer.
  peer_->Send(add);
  expect_atomic_ack(100, 10);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 99u);

  // A failing compare leaves memory alone and still returns the original.
  cas.bth.psn = 102;
  cas.atomic_eth = {mem->addr() + 8, mem->mr->rkey, 1, 12345};
  peer_->Send(cas);
  expect_atomic_ack(102, 99);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), 99u);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);
}

// ATOMIC WRITE and FLUSH are answered, as rxe answers them, by a zero-length
// RDMA READ RESPONSE ONLY; a duplicate is answered again and never executed
// again (a late duplicate ATOMIC WRITE must not undo a later WRITE).
TEST_F(ResponderTest, PlacementOpsAreAnsweredByEmptyReadResponsesAndDuplicatesAreNotExecutedTwice) {
  RcParams p;
  p.access = IBV_ACCESS_REMOTE_WRITE | (1 << 8);  // IBV_ACCESS_FLUSH_GLOBAL
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  auto* mem = emu_.Register(64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | (1 << 8));
  ASSERT_NE(mem, nullptr);
  auto* target = reinterpret_cast<uint64_t*>(mem->data.data() + 16);
  auto expect_empty_read_response = [&](uint32_t psn) {
    auto rx = peer_->Receive();
    ASSERT_TRUE(rx.has_value()) << "no answer for PSN " << psn;
    EXPECT_TRUE(rx->icrc_ok);
    EXPECT_EQ(rx->opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    EXPECT_EQ(rx->psn, psn);
    ASSERT_TRUE(rx->has_aeth);
    EXPECT_EQ(rx->aeth_type(), AethType::kAck);
    EXPECT_TRUE(rx->payload.empty());
  };

  wire::PacketFields aw = FakePeer::Request(Opcode::RC_ATOMIC_WRITE, qp->qp_num, 100);
  aw.reth = {mem->addr() + 16, mem->mr->rkey, 8};
  const uint64_t value = 0x1122334455667788ULL;
  peer_->Send(aw, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&value), 8));
  expect_empty_read_response(100);
  EXPECT_EQ(__atomic_load_n(target, __ATOMIC_SEQ_CST), value);

  // A WRITE after it, then the ATOMIC WRITE again (its answer was "lost").
  wire::PacketFields w = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 101);
  w.reth = {mem->addr() + 16, mem->mr->rkey, 8};
  peer_->Send(w, Pattern(8, 3));
  ExpectAck(101, wire::AckSyndrome());
  peer_->Send(aw, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&value), 8));
  expect_empty_read_response(100);
  auto later = Pattern(8, 3);
  EXPECT_EQ(std::memcmp(target, later.data(), 8), 0) << "the duplicate ATOMIC WRITE was executed again";

  wire::PacketFields fl = FakePeer::Request(Opcode::RC_FLUSH, qp->qp_num, 102);
  fl.feth = {1, 0};  // GLOBAL, RANGE
  fl.reth = {mem->addr(), mem->mr->rkey, 64};
  peer_->Send(fl);
  expect_empty_read_response(102);
  peer_->Send(fl);
  expect_empty_read_response(102);
  ExpectSilence(50ms);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_RTS);

  // An unknown placement type is an invalid request.
  fl.bth.psn = 103;
  fl.feth = {4, 0};
  peer_->Send(fl);
  ExpectAck(103, wire::NakSyndrome(NakCode::kInvalidRequest));
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

TEST_F(ResponderTest, AtomicWithoutRemoteAtomicRightIsNakedRemoteAccess) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  auto* mem = emu_.Register(64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  *reinterpret_cast<uint64_t*>(mem->data.data()) = 7;
  wire::PacketFields add = FakePeer::Request(Opcode::RC_FETCH_ADD, qp->qp_num, 100);
  add.atomic_eth = {mem->addr(), mem->mr->rkey, 5, 0};
  peer_->Send(add);
  ExpectAck(100, wire::NakSyndrome(NakCode::kRemoteAccessError));
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(mem->data.data()), 7u);
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);
}

// ---------------------------------------------------------------- drops

TEST_F(ResponderTest, BadIcrcWrongPkeyUnknownQpnAndResetOrInitQpAreDroppedAndCounted) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ibv_qp* reset_qp = emu_.CreateQp();
  ASSERT_NE(reset_qp, nullptr);
  ibv_qp* init_qp = emu_.CreateQp();
  ASSERT_NE(init_qp, nullptr);
  ASSERT_EQ(emu_.ToInit(init_qp, RcParams{}), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(emu_.PostRecv(qp, 60 + i, *recv_, i * 64, 64), 0);
  ASSERT_EQ(emu_.PostRecv(init_qp, 70, *recv_, 1024, 64), 0);
  const auto c0 = Counters();
  const uint64_t icrc0 = c0.dropped_icrc, pkey0 = c0.dropped_pkey, qpn0 = c0.dropped_unknown_qpn,
                 state0 = c0.dropped_bad_state;

  auto data = Pattern(16, 1);
  // Bad ICRC.
  auto bytes = peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), data);
  bytes[bytes.size() - 1] ^= 0x01;
  peer_->SendRaw(bytes);
  // A correct ICRC over a payload changed in flight.
  bytes = peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), data);
  bytes[20] ^= 0x80;
  peer_->SendRaw(bytes);
  // Wrong P_Key (another partition; 0x7fff, the limited member of the QP's
  // default partition, would match it), ICRC right.
  wire::PacketFields f = FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100);
  f.bth.pkey = 0x8001;
  peer_->Send(f, data);
  // Unknown QPN.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, 0xfedcb, 100), data);
  // QPs in RESET and INIT.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, reset_qp->qp_num, 100), data);
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, init_qp->qp_num, 100), data);
  ExpectSilence(200ms);
  EXPECT_TRUE(emu_.PollAll(20ms).empty());
  const auto c = Counters();
  EXPECT_EQ(c.dropped_icrc - icrc0, 2u);
  EXPECT_EQ(c.dropped_pkey - pkey0, 1u);
  EXPECT_EQ(c.dropped_unknown_qpn - qpn0, 1u);
  EXPECT_EQ(c.dropped_bad_state - state0, 2u);

  // Nothing was acted on: PSN 100 is still expected and the QP works.
  SendOnly(qp, 100, data);
  ExpectAck(100, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 60u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(emu_.State(reset_qp), IBV_QPS_RESET);
  EXPECT_EQ(emu_.State(init_qp), IBV_QPS_INIT);
}

TEST_F(ResponderTest, PacketFromAnotherAddressThanThePeerIsDropped) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 1, *recv_, 0, 64), 0);
  FakePeer stranger(emu_.ip(), emu_.udp_port(), kPeerIp + 1);
  ASSERT_TRUE(stranger.ok());
  stranger.Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), Pattern(8, 0));
  EXPECT_FALSE(stranger.Receive(150ms).has_value());
  ExpectSilence(10ms);
  EXPECT_TRUE(emu_.PollAll(20ms).empty());
  SendOnly(qp, 100, Pattern(8, 0));
  ExpectAck(100, wire::AckSyndrome(), 1);
}

// ---------------------------------------------------------------- robustness

TEST_F(ResponderTest, MalformedAndMutatedPacketsNeverCrashTheEngine) {
  auto* mem = emu_.Register(8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(mem, nullptr);
  std::mt19937 rng(20240611);
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(emu_.PostRecv(qp, 100 + i, *recv_, i * 1024, 1024), 0);

  std::vector<std::vector<uint8_t>> seeds;
  auto payload = Pattern(300, 1);
  auto mtu_payload = Pattern(1024, 2);
  seeds.push_back(peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), payload));
  seeds.push_back(peer_->Build(FakePeer::Request(Opcode::RC_SEND_FIRST, qp->qp_num, 100), mtu_payload));
  seeds.push_back(peer_->Build(FakePeer::Request(Opcode::RC_SEND_LAST_WITH_IMMEDIATE, qp->qp_num, 101), payload));
  wire::PacketFields w = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 100);
  w.reth = {mem->addr(), mem->mr->rkey, 300};
  seeds.push_back(peer_->Build(w, payload));
  wire::PacketFields r = FakePeer::Request(Opcode::RC_RDMA_READ_REQUEST, qp->qp_num, 100);
  r.reth = {mem->addr(), mem->mr->rkey, 4000};
  seeds.push_back(peer_->Build(r));
  wire::PacketFields a = FakePeer::Request(Opcode::RC_FETCH_ADD, qp->qp_num, 100);
  a.atomic_eth = {mem->addr() + 16, mem->mr->rkey, 1, 0};
  seeds.push_back(peer_->Build(a));
  seeds.push_back(peer_->Build(FakePeer::Ack(qp->qp_num, 500, wire::AckSyndrome())));
  for (const auto& s : seeds) ASSERT_FALSE(s.empty());

  const uint64_t received0 = Counters().packets_received;
  constexpr int kMutations = 400;
  for (int i = 0; i < kMutations; ++i) {
    std::vector<uint8_t> p = seeds[rng() % seeds.size()];
    switch (rng() % 5) {
      case 0:  // truncate
        p.resize(rng() % (p.size() + 1));
        break;
      case 1:  // extend with garbage
        for (int n = rng() % 64; n > 0; --n) p.push_back(static_cast<uint8_t>(rng()));
        break;
      case 2:  // one random opcode byte
        p[0] = static_cast<uint8_t>(rng());
        break;
      default:  // flip a few bytes
        for (int n = 1 + rng() % 4; n > 0; --n) p[rng() % p.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
        break;
    }
    // Most keep a valid ICRC, so that they reach the transport's checks.
    if (p.size() >= 16 && rng() % 4 != 0) peer_->FixIcrc(p);
    peer_->SendRaw(p);
    if (i % 50 == 49) peer_->Drain();
  }
  // Everything arrived and was looked at.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (Counters().packets_received - received0 < kMutations &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_GE(Counters().packets_received - received0, static_cast<uint64_t>(kMutations));
  peer_->ReceiveAll(100ms);
  emu_.PollAll(20ms);

  // The engine still answers: a fresh QP works.
  RcParams p;
  p.rq_psn = 7000;
  ibv_qp* fresh = emu_.ConnectedQp(p);
  ASSERT_NE(fresh, nullptr);
  ASSERT_EQ(emu_.PostRecv(fresh, 999, *recv_, 8192, 64), 0);
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, fresh->qp_num, 7000), Pattern(20, 4));
  ExpectAck(7000, wire::AckSyndrome(), 1);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 999u);
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace rdmaemu::testing
