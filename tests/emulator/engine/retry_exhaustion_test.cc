// Transport retry exhaustion of the RC requester against a fake responder
// that never answers: retransmission on the QP's timeout, retry_cnt,
// IBV_WC_RETRY_EXC_ERR, the QP to ERR and every outstanding WR flushed
// (issue 3, item 5).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "emulator/engine/engine.h"
#include "emulator/wire/psn.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::NakCode;
using wire::Opcode;
using Clock = std::chrono::steady_clock;

class RequesterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok()) << "cannot bind the fake peer";
    buf_ = emu_.Register(16384, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(buf_, nullptr);
    for (size_t i = 0; i < buf_->data.size(); ++i) buf_->data[i] = static_cast<uint8_t>(i * 13);
  }

  // The next request packet; fails the test if none comes.
  RxPacket NextRequest(std::chrono::milliseconds timeout = 2000ms) {
    auto rx = peer_->Receive(timeout);
    EXPECT_TRUE(rx.has_value()) << "no request from the engine";
    if (!rx) return {};
    EXPECT_TRUE(rx->icrc_ok);
    EXPECT_EQ(rx->dest_qpn, kPeerQpn);
    return *rx;
  }

  void Ack(ibv_qp* qp, uint32_t psn, uint8_t syndrome = wire::AckSyndrome(), uint32_t msn = 0) {
    peer_->Send(FakePeer::Ack(qp->qp_num, psn, syndrome, msn));
  }

  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
};

TEST_F(RequesterTest, SendIsRetransmittedOnTimeoutAndRetryExhaustionGoesToErrAndFlushes) {
  RcParams p;
  p.timeout = 10;  // 4 ms, floored at 5 ms by the engine
  p.retry_cnt = 3;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 64), 0);

  const auto posted = Clock::now();
  std::vector<Clock::time_point> at;
  for (int i = 0; i < 1 + 3; ++i) {
    RxPacket rx = NextRequest();
    if (HasFailure()) return;
    at.push_back(Clock::now());
    EXPECT_EQ(rx.opcode, Opcode::RC_SEND_ONLY);
    EXPECT_EQ(rx.psn, 500u) << "transmission " << i;
    EXPECT_TRUE(rx.ack_req);
    ASSERT_EQ(rx.payload.size(), 64u);
    EXPECT_EQ(std::memcmp(rx.payload.data(), buf_->data.data(), 64), 0);
  }
  // Each retransmission waits for the timeout (5 ms) after the previous one.
  for (size_t i = 1; i < at.size(); ++i) {
    EXPECT_GE(at[i] - posted, i * 4ms) << "retransmission " << i << " came before the timeout";
  }
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 1u);
  EXPECT_EQ(wc->status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wc->qp_num, qp->qp_num);
  // No more than retry_cnt retransmissions.
  EXPECT_FALSE(peer_->Receive(100ms).has_value());
  EXPECT_EQ(emu_.State(qp), IBV_QPS_ERR);

  // WRs posted to a QP in ERR are flushed.
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 0, 8), 0);
  wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 2u);
  EXPECT_EQ(wc->status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_FALSE(peer_->Receive(50ms).has_value());
}

TEST_F(RequesterTest, OutstandingWrsAndReceivesAreFlushedWhenRetriesRunOut) {
  RcParams p;
  p.timeout = 10;
  p.retry_cnt = 1;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 30, *buf_, 8192, 64), 0);
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 64), 0);
  ASSERT_EQ(emu_.PostSend(qp, 2, IBV_WR_SEND, *buf_, 64, 64), 0);
  std::vector<ibv_wc> wcs;
  const auto deadline = Clock::now() + 3s;
  while (wcs.size() < 3 && Clock::now() < deadline) {
    if (auto wc = emu_.Poll(10ms)) wcs.push_back(*wc);
  }
  ASSERT_EQ(wcs.size(), 3u);
  std::map<uint64_t, ibv_wc_status> by_id;
  for (auto& w : wcs) by_id[w.wr_id] = w.status;
  EXPECT_EQ(by_id[1], IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(by_id[2], IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(by_id[30], IBV_WC_WR_FLUSH_ERR);
  // The send queue's completions keep their order.
  std::vector<uint64_t> send_order;
  for (auto& w : wcs) if (w.wr_id < 30) send_order.push_back(w.wr_id);
  EXPECT_EQ(send_order, (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace rdmaemu::testing
