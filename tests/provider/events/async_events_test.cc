// Async events from their real causes, through the public verbs API: two RC
// QPs of one process connected to each other over the emulator.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <gtest/gtest.h>
#include <rdmaemu/rdmaemu.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "tests/testing/verbs_test.h"

namespace {

class AsyncEventsTest : public rdmaemu::testing::VerbsTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        Open(256, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid_), 0);
    ASSERT_NO_FATAL_FAILURE(AsyncFdNonBlocking());
  }
  void DestroyExtras() override {
    if (srq_) {
      EXPECT_EQ(ibv_destroy_srq(srq_), 0);
    }
  }

  ibv_qp* CreateRc(ibv_cq* cq = nullptr) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq ? cq : cq_;
    a.srq = srq_;
    a.qp_type = IBV_QPT_RC;
    a.cap = {16, 16, 2, 2, 0};
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    if (qp) qps_.push_back(qp);
    return qp;
  }

  // INIT -> RTR (-> RTS) towards `peer`.
  void Connect(ibv_qp* qp, uint32_t peer, bool rts = true) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer;
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid_;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    if (!rts) return;
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 100;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }

  int PostWrite(ibv_qp* qp, uint32_t rkey, uint64_t remote, uint32_t len = 64) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &wr, &bad);
  }

  // Waits up to `ms` for the next async event.
  bool NextEvent(ibv_async_event* ev, int ms = 3000) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    return ibv_get_async_event(ctx_, ev) == 0;
  }

  std::vector<ibv_wc> Drain(ibv_cq* cq, size_t want) {
    std::vector<ibv_wc> out;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (out.size() < want && std::chrono::steady_clock::now() < until) {
      ibv_wc wc;
      if (ibv_poll_cq(cq, 1, &wc) == 1) out.push_back(wc);
    }
    return out;
  }

  ibv_srq* srq_ = nullptr;
  ibv_gid gid_{};
};

TEST_F(AsyncEventsTest, FirstPacketInRtrRaisesCommEst) {
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  Connect(a, b->qp_num);
  Connect(b, a->qp_num, /*rts=*/false);
  ASSERT_EQ(PostWrite(a, mr_->rkey, reinterpret_cast<uintptr_t>(buf_.data()) + 4096), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_COMM_EST);
  EXPECT_EQ(ev.element.qp, b);
  ibv_ack_async_event(&ev);
  auto wcs = Drain(cq_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

TEST_F(AsyncEventsTest, WriteWithBadRkeyGivesRemAccessErrAndQpAccessErrOnTheResponder) {
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  Connect(a, b->qp_num);
  Connect(b, a->qp_num);
  ASSERT_EQ(PostWrite(a, mr_->rkey ^ 0x55, reinterpret_cast<uintptr_t>(buf_.data())), 0);
  auto wcs = Drain(cq_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(ev.element.qp, b);
  ibv_ack_async_event(&ev);
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(a, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
  ASSERT_EQ(ibv_query_qp(b, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
}

TEST_F(AsyncEventsTest, QpOnSrqEnteringErrorRaisesLastWqeReached) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq_, nullptr);
  ibv_qp* a = CreateRc();
  ASSERT_NE(a, nullptr);
  Connect(a, a->qp_num);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, a);
  ibv_ack_async_event(&ev);
}

TEST_F(AsyncEventsTest, SrqLimitFiresOnceWhenCrossed) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq_, nullptr);
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  Connect(a, b->qp_num);
  Connect(b, a->qp_num);
  for (int i = 0; i < 4; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + 8192 + i * 256), 256, mr_->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    ASSERT_EQ(ibv_post_srq_recv(srq_, &wr, &bad), 0);
  }
  ibv_srq_attr limit{};
  limit.srq_limit = 3;
  ASSERT_EQ(ibv_modify_srq(srq_, &limit, IBV_SRQ_LIMIT), 0);
  for (int i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 16, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad;
    ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  }
  EXPECT_EQ(Drain(cq_, 4).size(), 4u);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq_);
  ibv_ack_async_event(&ev);
  EXPECT_FALSE(NextEvent(&ev, 300)) << "the limit is one-shot";
  ASSERT_EQ(ibv_query_srq(srq_, &limit), 0);
  EXPECT_EQ(limit.srq_limit, 0u);
}

TEST_F(AsyncEventsTest, CqOverrunRaisesCqErrAndMovesTheQpToError) {
  ibv_cq* small = ibv_create_cq(ctx_, 2, nullptr, nullptr, 0);
  ASSERT_NE(small, nullptr);
  ibv_qp* a = CreateRc(small);
  ibv_qp* b = CreateRc();
  Connect(a, b->qp_num);
  Connect(b, a->qp_num);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(PostWrite(a, mr_->rkey, reinterpret_cast<uintptr_t>(buf_.data()) + 4096), 0);
  }
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, small);
  ibv_ack_async_event(&ev);
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(a, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  qps_.erase(qps_.begin());
  EXPECT_EQ(ibv_destroy_cq(small), 0);
}

TEST_F(AsyncEventsTest, PortDownRaisesPortErrStopsTrafficAndUpRaisesPortActive) {
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  Connect(a, b->qp_num);
  Connect(b, a->qp_num);
  ASSERT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_DOWN), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(ev.element.port_num, 1);
  ibv_ack_async_event(&ev);
  ibv_port_attr port;
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);

  // No packet crosses a port that is down: the write exhausts its retries.
  ASSERT_EQ(PostWrite(a, mr_->rkey, reinterpret_cast<uintptr_t>(buf_.data()) + 4096), 0);
  auto wcs = Drain(cq_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);

  ASSERT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_ACTIVE), 0);
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
  EXPECT_EQ(ev.element.port_num, 1);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(rdmaemu_set_port_state(ctx_, 2, IBV_PORT_DOWN), EINVAL);
  EXPECT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_INIT), EINVAL);
}

TEST_F(AsyncEventsTest, EventsRaisedOnDemandReachTheHandlerWithTheirElement) {
  ibv_qp* a = CreateRc();
  ASSERT_NE(a, nullptr);
  ibv_async_event raise{};
  raise.event_type = IBV_EVENT_QP_FATAL;
  raise.element.qp = a;
  ASSERT_EQ(rdmaemu_raise_async_event(ctx_, &raise), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a);
  ibv_ack_async_event(&ev);

  raise = {};
  raise.event_type = IBV_EVENT_GID_CHANGE;
  raise.element.port_num = 1;
  ASSERT_EQ(rdmaemu_raise_async_event(ctx_, &raise), 0);
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_GID_CHANGE);
  EXPECT_EQ(ev.element.port_num, 1);
  ibv_ack_async_event(&ev);

  raise = {};
  raise.event_type = IBV_EVENT_CQ_ERR;
  raise.element.cq = nullptr;
  EXPECT_EQ(rdmaemu_raise_async_event(ctx_, &raise), EINVAL);
  raise.event_type = IBV_EVENT_LID_CHANGE;
  raise.element.port_num = 2;
  EXPECT_EQ(rdmaemu_raise_async_event(ctx_, &raise), EINVAL);
  raise.event_type = static_cast<ibv_event_type>(99);
  EXPECT_EQ(rdmaemu_raise_async_event(ctx_, &raise), EINVAL);
}

}  // namespace
