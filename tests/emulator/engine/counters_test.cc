// Counters per device, port and QP (issue 5, item 6), read through the C
// API in rdmaemu/rdmaemu.h while a fake peer sends the engine exactly known
// packets: packets and bytes each way, drops, RNR NAKs, duplicates,
// out-of-sequence requests, rkey violations, timeouts and retransmissions.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <thread>

#include "rdmaemu/rdmaemu.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::Opcode;

rdmaemu_counters Qp(ibv_qp* qp) {
  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_qp_counters(qp, &c), 0);
  return c;
}

rdmaemu_counters Port(ibv_context* ctx, uint8_t port) {
  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_counters(ctx, port, &c), 0);
  return c;
}

class CountersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok());
    buf_ = emu_.Register(16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(buf_, nullptr);
  }
  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
};

TEST_F(CountersTest, PacketsAndBytesEachWayOnTheQpAndThePort) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 1, *buf_, 0, 256), 0);
  const auto q0 = Qp(qp);
  const auto p0 = Port(emu_.ctx(), 1);
  EXPECT_EQ(q0.size, sizeof(rdmaemu_counters));
  EXPECT_EQ(q0.packets_received, 0u) << "a new QP starts at zero";

  auto sent = peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100),
                          std::vector<uint8_t>(50, 7));
  auto ack = peer_->Receive();
  ASSERT_TRUE(ack.has_value());
  ASSERT_TRUE(emu_.Poll().has_value());

  const auto q = Qp(qp);
  EXPECT_EQ(q.packets_received, 1u);
  EXPECT_EQ(q.bytes_received, sent.size());
  EXPECT_EQ(sent.size(), 12u + 52u + 4u) << "BTH, 50 bytes padded to 52, ICRC";
  EXPECT_EQ(q.packets_sent, 1u);
  EXPECT_EQ(q.bytes_sent, ack->bytes.size());
  EXPECT_EQ(ack->bytes.size(), 20u) << "BTH, AETH, ICRC";
  const auto p = Port(emu_.ctx(), 1);
  EXPECT_EQ(p.packets_received - p0.packets_received, 1u);
  EXPECT_EQ(p.bytes_received - p0.bytes_received, sent.size());
  EXPECT_EQ(p.packets_sent - p0.packets_sent, 1u);
  EXPECT_EQ(p.bytes_sent - p0.bytes_sent, 20u);
}

TEST_F(CountersTest, DropsCountOnThePortAndTheQpTheyReached) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  const auto q0 = Qp(qp);
  const auto p0 = Port(emu_.ctx(), 1);
  // A corrupted packet (ICRC wrong) for the QP: no QP can trust it.
  auto bytes = peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100),
                            std::vector<uint8_t>(16, 1));
  bytes[bytes.size() - 1] ^= 1;
  peer_->SendRaw(bytes);
  // A packet for a QP that does not exist.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, 0xfedcb, 100), std::vector<uint8_t>(16, 1));
  // Wrong P_Key: another partition (0x7fff, the limited member of the QP's
  // default partition, would match). Checked against the QP's own P_Key, so
  // the violation is the QP's too.
  auto f = FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100);
  f.bth.pkey = 0x8001;
  peer_->Send(f, std::vector<uint8_t>(16, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  const auto p = Port(emu_.ctx(), 1);
  EXPECT_EQ(p.packets_received - p0.packets_received, 3u);
  EXPECT_EQ(p.dropped_icrc - p0.dropped_icrc, 1u);
  EXPECT_EQ(p.dropped_unknown_qpn - p0.dropped_unknown_qpn, 1u);
  EXPECT_EQ(p.dropped_pkey - p0.dropped_pkey, 1u);
  const auto q = Qp(qp);
  EXPECT_EQ(q.packets_received - q0.packets_received, 1u) << "only the P_Key violation reached the QP";
  EXPECT_EQ(q.dropped_pkey - q0.dropped_pkey, 1u);
  EXPECT_EQ(q.dropped_icrc, 0u);
}

TEST_F(CountersTest, RnrNakDuplicateOutOfSequenceAndRkeyViolation) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  // No receive posted: RNR NAK.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  auto rx = peer_->Receive();
  ASSERT_TRUE(rx.has_value());
  EXPECT_EQ(rx->aeth_type(), wire::AethType::kRnrNak);
  EXPECT_EQ(Qp(qp).rnr_naks_sent, 1u);

  ASSERT_EQ(emu_.PostRecv(qp, 1, *buf_, 0, 256), 0);
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  // The same PSN again: a duplicate, acknowledged again.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  EXPECT_EQ(Qp(qp).duplicates, 1u);
  // PSN 103 when 101 is expected: out of sequence (one NAK).
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 103), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  EXPECT_EQ(Qp(qp).out_of_sequence, 1u);
  // A WRITE with an rkey no region has: remote access NAK, the QP to ERR.
  auto w = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 101);
  w.reth = {buf_->addr(), 0x123456, 8};
  peer_->Send(w, std::vector<uint8_t>(8, 1));
  rx = peer_->Receive();
  ASSERT_TRUE(rx.has_value());
  EXPECT_EQ(rx->aeth_type(), wire::AethType::kNak);
  const auto q = Qp(qp);
  EXPECT_EQ(q.rkey_violations, 1u);
  EXPECT_EQ(q.packets_received, 5u);
  EXPECT_EQ(q.packets_sent, 5u);
}

TEST_F(CountersTest, TimeoutsAndRetransmissions) {
  RcParams params;
  params.timeout = 12;  // ~16.8 ms
  params.retry_cnt = 2;
  ibv_qp* qp = emu_.ConnectedQp(params);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 9, IBV_WR_SEND, *buf_, 0, 64), 0);
  // The peer never answers: the first send and two retries, then ERR.
  auto first = peer_->Receive();
  ASSERT_TRUE(first.has_value());
  auto retry1 = peer_->Receive();
  auto retry2 = peer_->Receive();
  ASSERT_TRUE(retry1.has_value() && retry2.has_value());
  EXPECT_EQ(retry1->psn, first->psn);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_RETRY_EXC_ERR);
  const auto q = Qp(qp);
  EXPECT_EQ(q.timeouts, 3u) << "two that retried, one that gave up";
  EXPECT_EQ(q.retransmissions, 2u);
  EXPECT_EQ(q.packets_sent, 3u);
}

TEST_F(CountersTest, DeviceIsTheSumOfPortsAndSizeIsHonoured) {
  const auto dev = Port(emu_.ctx(), 0);
  const auto p1 = Port(emu_.ctx(), 1);
  EXPECT_GE(p1.packets_received, dev.packets_received) << "one port: the device is port 1";

  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_counters(emu_.ctx(), 3, &c), EINVAL) << "no port 3";
  c.size = 4;
  EXPECT_EQ(rdmaemu_query_counters(emu_.ctx(), 1, &c), EINVAL) << "size below the header";
  EXPECT_EQ(rdmaemu_query_counters(emu_.ctx(), 1, nullptr), EINVAL);

  // An older caller that knows only the first two counters gets only them.
  rdmaemu_counters old;
  std::memset(&old, 0xee, sizeof(old));
  old.size = offsetof(rdmaemu_counters, packets_received);
  ASSERT_EQ(rdmaemu_query_counters(emu_.ctx(), 1, &old), 0);
  EXPECT_EQ(old.size, offsetof(rdmaemu_counters, packets_received));
  EXPECT_EQ(old.reserved, 0u);
  EXPECT_NE(old.packets_sent, 0xeeeeeeeeeeeeeeeeull);
  EXPECT_EQ(old.packets_received, 0xeeeeeeeeeeeeeeeeull) << "nothing past `size` is written";
}

}  // namespace
}  // namespace rdmaemu::testing
