// A fixture for integration tests that connect RC QPs of one process to each
// other through the public verbs API: the objects of VerbsTest (a 1024-entry
// CQ, 1 MiB registered for local and remote access, a non-blocking async
// fd); helpers to connect, post and wait.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "tests/testing/verbs_test.h"

namespace rdmaemu::testing {

class RcPairTest : public VerbsTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        Open(1024, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
    ASSERT_NO_FATAL_FAILURE(AsyncFdNonBlocking());
  }

  ibv_qp* CreateRc(uint32_t max_send_wr = 64) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap = {max_send_wr, 64, 2, 2, 0};
    return Own(ibv_create_qp(pd_, &a));
  }

  ibv_gid Gid(uint8_t port) {
    ibv_gid gid{};
    EXPECT_EQ(ibv_query_gid(ctx_, port, 0, &gid), 0);
    return gid;
  }

  static ibv_ah_attr Av(const ibv_gid& dgid, uint8_t port) {
    ibv_ah_attr av{};
    av.is_global = 1;
    av.grh.dgid = dgid;
    av.grh.hop_limit = 1;
    av.port_num = port;
    return av;
  }

  // RESET -> INIT on `port`.
  int ToInit(ibv_qp* qp, uint8_t port = 1) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  // INIT -> RTR towards `peer` at `av`; `extra`/`mask` add attributes.
  int ToRtr(ibv_qp* qp, uint32_t peer, const ibv_ah_attr& av, ibv_qp_attr extra = {}, int mask = 0) {
    ibv_qp_attr a = extra;
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer;
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr = av;
    return ibv_modify_qp(qp, &a, mask | IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  }
  int ToRts(ibv_qp* qp, uint8_t timeout = 14, uint8_t retry_cnt = 7, ibv_qp_attr extra = {},
            int mask = 0) {
    ibv_qp_attr a = extra;
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 100;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, mask | IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  }
  // Both sides of a pair on port 1, to RTS.
  void Connect(ibv_qp* a, ibv_qp* b) {
    ibv_gid gid = Gid(1);
    for (auto [qp, peer] : {std::pair{a, b}, std::pair{b, a}}) {
      ASSERT_EQ(ToInit(qp), 0);
      ASSERT_EQ(ToRtr(qp, peer->qp_num, Av(gid, 1)), 0);
      ASSERT_EQ(ToRts(qp), 0);
    }
  }

  // An RDMA WRITE of buf_[from, from+len) to buf_[to, ...) through `qp`.
  int PostWrite(ibv_qp* qp, uint64_t wr_id, size_t from, size_t to, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + from), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf_.data() + to);
    wr.wr.rdma.rkey = mr_->rkey;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &wr, &bad);
  }

  // The next async event within `ms`, acknowledged; false if none came.
  bool NextEvent(ibv_async_event* ev, int ms = 3000) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    if (ibv_get_async_event(ctx_, ev) != 0) return false;
    ibv_ack_async_event(ev);
    return true;
  }

  // Completions until `want` arrived or `ms` passed.
  std::vector<ibv_wc> Poll(size_t want, int ms = 5000) {
    std::vector<ibv_wc> out;
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (out.size() < want && std::chrono::steady_clock::now() < until) {
      ibv_wc wc;
      if (ibv_poll_cq(cq_, 1, &wc) == 1) out.push_back(wc);
    }
    return out;
  }

  // The address of buf_[offset], and an SGE of `length` bytes there in mr_.
  uintptr_t At(size_t offset) { return reinterpret_cast<uintptr_t>(buf_.data() + offset); }
  ibv_sge Sge(size_t offset, uint32_t length) { return {At(offset), length, mr_->lkey}; }

  int PostRecv(ibv_qp* qp, uint64_t wr_id, ibv_sge sge) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
  }

  // The completion of `wr_id` on `qp` among the next ones, within `ms`;
  // others polled meanwhile are kept for later calls.
  bool Completion(ibv_qp* qp, uint64_t wr_id, ibv_wc* out, int ms = 3000) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      for (auto it = seen_.begin(); it != seen_.end(); ++it) {
        if (it->qp_num == qp->qp_num && it->wr_id == wr_id) {
          *out = *it;
          seen_.erase(it);
          return true;
        }
      }
      ibv_wc wc;
      if (ibv_poll_cq(cq_, 1, &wc) == 1) seen_.push_back(wc);
    }
    return false;
  }

  ibv_qp_attr Query(ibv_qp* qp) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE, &init), 0);
    return attr;
  }

  std::vector<ibv_wc> seen_;  // completions polled by Completion, not yet asked for
};

}  // namespace rdmaemu::testing
