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
#include "tests/emulator/engine/requester_fixture.h"

namespace rdmaemu::testing {
namespace {

using wire::NakCode;
using wire::Opcode;
using Clock = std::chrono::steady_clock;

TEST_F(RequesterTest, SendIsRetransmittedOnTimeoutAndRetryExhaustionGoesToErrAndFlushes) {
  RcParams p;
  p.timeout = 10;  // 4 ms, floored at 5 ms by the engine
  p.retry_cnt = 3;
  ibv_qp* qp = emu_.ConnectedQp(p);
  ASSERT_NE(qp, nullptr);
  // Read before the post: the engine thread may send and start its timer
  // before PostSend returns.
  const auto posted = Clock::now();
  ASSERT_EQ(emu_.PostSend(qp, 1, IBV_WR_SEND, *buf_, 0, 64), 0);

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
  // Each retransmission waits for the timer after the previous one: the
  // QP's 4 ms are below the engine's floor for a software peer, which is
  // 5 ms and doubles with each timeout in a row (5, 10, 20 ms). Measured
  // from just before the post, so neither a slow test thread nor a fast
  // engine thread can make a gap look short.
  const std::chrono::milliseconds floor_sum[] = {0ms, 5ms, 15ms, 35ms};
  for (size_t i = 1; i < at.size(); ++i) {
    EXPECT_GE(at[i] - posted, floor_sum[i]) << "retransmission " << i << " came before the timer";
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
