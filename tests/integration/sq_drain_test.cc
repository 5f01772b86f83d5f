// RTS -> SQD through the verbs API (IBA 10.3.1.3, ibv_modify_qp(3)): the
// requester starts no new work request, finishes those it started, and then
// reports IBV_EVENT_SQ_DRAINED once, if asked to with en_sqd_async_notify.
#include <chrono>
#include <cstring>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

class SqDrainTest : public RcPairTest {
 protected:
  // `a` in RTS towards `b`, which stays in INIT: nothing `a` sends is
  // acknowledged until StartPeer() (so a started WR keeps the queue draining;
  // `a` retransmits every 0.54 s).
  void SetUpStalledPair() {
    a_ = CreateRc();
    b_ = CreateRc();
    ASSERT_TRUE(a_ && b_);
    ibv_gid gid = Gid(1);
    ASSERT_EQ(ToInit(a_), 0);
    ASSERT_EQ(ToRtr(a_, b_->qp_num, Av(gid, 1)), 0);
    ASSERT_EQ(ToRts(a_, /*timeout=*/17, /*retry_cnt=*/7), 0);  // 0.54 s
    ASSERT_EQ(ToInit(b_), 0);
  }
  void StartPeer() {
    ASSERT_EQ(ToRtr(b_, a_->qp_num, Av(Gid(1), 1)), 0);
    ASSERT_EQ(ToRts(b_), 0);
  }
  int ToSqd(ibv_qp* qp, bool notify) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_SQD;
    a.en_sqd_async_notify = notify ? 1 : 0;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
  }
  // The next async event but b's COMM_EST, which b raises when a packet of
  // a's arrives between StartPeer's RTR and RTS (as a NIC does): timing,
  // and the sanitizers' slowness, decide whether it comes.
  bool NextDrainEvent(ibv_async_event* ev, int ms = 3000) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now()).count();
      if (left <= 0 || !NextEvent(ev, static_cast<int>(left))) return false;
      if (ev->event_type != IBV_EVENT_COMM_EST || ev->element.qp != b_) return true;
    }
  }
  void Fill(size_t at, size_t len, uint8_t seed) {
    for (size_t i = 0; i < len; ++i) buf_[at + i] = static_cast<uint8_t>(seed + i * 7);
  }

  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
};

TEST_F(SqDrainTest, StartedWorkFinishesThenSqDrainedOnceAndNewWorkWaitsForRts) {
  SetUpStalledPair();
  Fill(0, 3000, 1);
  Fill(8192, 3000, 50);
  ASSERT_EQ(PostWrite(a_, 1, 0, 1 << 16, 3000), 0);
  ASSERT_EQ(ToSqd(a_, true), 0);
  ibv_qp_attr attr = Query(a_);
  EXPECT_EQ(attr.qp_state, IBV_QPS_SQD);
  EXPECT_EQ(attr.sq_draining, 1) << "WR 1 was started and is not acknowledged";
  EXPECT_EQ(attr.en_sqd_async_notify, 1);

  // Posting is allowed in SQD; the WR waits in the queue.
  ASSERT_EQ(PostWrite(a_, 2, 8192, (1 << 16) + 8192, 3000), 0);
  // The path may not change while started WRs are still in flight on it.
  ibv_qp_attr t{};
  t.qp_state = IBV_QPS_SQD;
  t.timeout = 13;
  EXPECT_EQ(ibv_modify_qp(a_, &t, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL);

  ibv_async_event ev;
  EXPECT_FALSE(NextDrainEvent(&ev, 200)) << "not drained while WR 1 is unacknowledged; got " << ibv_event_type_str(ev.event_type);
  StartPeer();
  auto wcs = Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  ASSERT_TRUE(NextDrainEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(ev.element.qp, a_);
  attr = Query(a_);
  EXPECT_EQ(attr.qp_state, IBV_QPS_SQD);
  EXPECT_EQ(attr.sq_draining, 0);
  EXPECT_EQ(std::memcmp(buf_.data(), buf_.data() + (1 << 16), 3000), 0);

  // WR 2 stays queued while the QP is in SQD, and the event came once.
  EXPECT_TRUE(Poll(1, 300).empty()) << "a WR posted in SQD must not start";
  EXPECT_FALSE(NextDrainEvent(&ev, 100)) << "SQ_DRAINED is raised once; got " << ibv_event_type_str(ev.event_type);
  // Drained: the attributes SQD -> SQD allows may change now.
  EXPECT_EQ(ibv_modify_qp(a_, &t, IBV_QP_STATE | IBV_QP_TIMEOUT), 0);
  EXPECT_EQ(Query(a_).timeout, 13);

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(a_, &rts, IBV_QP_STATE), 0);
  wcs = Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf_.data() + 8192, buf_.data() + (1 << 16) + 8192, 3000), 0);
  EXPECT_EQ(Query(a_).qp_state, IBV_QPS_RTS);
}

TEST_F(SqDrainTest, WithoutNotifyTheQueueDrainsSilently) {
  SetUpStalledPair();
  ASSERT_EQ(PostWrite(a_, 1, 0, 1 << 16, 64), 0);
  ASSERT_EQ(ToSqd(a_, false), 0);
  EXPECT_EQ(Query(a_).sq_draining, 1);
  StartPeer();
  auto wcs = Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  ibv_async_event ev;
  EXPECT_FALSE(NextDrainEvent(&ev, 300)) << "no SQ_DRAINED without en_sqd_async_notify; got " << ibv_event_type_str(ev.event_type);
  EXPECT_EQ(Query(a_).sq_draining, 0);
}

TEST_F(SqDrainTest, AnIdleQueueIsDrainedAtOnce) {
  a_ = CreateRc();
  b_ = CreateRc();
  ASSERT_TRUE(a_ && b_);
  Connect(a_, b_);
  ASSERT_EQ(ToSqd(a_, true), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextDrainEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(ev.element.qp, a_);
  EXPECT_EQ(Query(a_).sq_draining, 0);
  // Back to RTS and again to SQD: a second drain, a second event.
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(a_, &rts, IBV_QP_STATE), 0);
  ASSERT_EQ(PostWrite(a_, 7, 0, 4096, 128), 0);
  ASSERT_EQ(Poll(1).size(), 1u);
  ASSERT_EQ(ToSqd(a_, true), 0);
  ASSERT_TRUE(NextDrainEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED);
}

}  // namespace
}  // namespace rdmaemu::testing
