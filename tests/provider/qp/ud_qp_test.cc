// QPs through the public verbs API in one process: the state machine as
// modify_qp enforces it, capacities, posting rules, and a UD message from
// one QP to another over the emulator's own socket.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "tests/testing/verbs_test.h"

namespace {

class UdQpTest : public rdmaemu::testing::VerbsTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Open(64, 8192, IBV_ACCESS_LOCAL_WRITE)); }

  ibv_qp* CreateQp(ibv_qp_type type, uint32_t wr = 4) {
    ibv_qp_init_attr attr{};
    attr.send_cq = cq_;
    attr.recv_cq = cq_;
    attr.qp_type = type;
    attr.cap.max_send_wr = wr;
    attr.cap.max_recv_wr = wr;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &attr);
    if (qp) qps_.push_back(qp);
    return qp;
  }

  int ToRts(ibv_qp* qp) { return UdToRts(qp, 0x11111111, 7); }

};

TEST_F(UdQpTest, QueryReportsExactCapacities) {
  ibv_qp* qp = CreateQp(IBV_QPT_UD, 5);
  ASSERT_NE(qp, nullptr);
  EXPECT_GE(qp->qp_num, 2u);
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(qp, &attr, IBV_QP_CAP, &init), 0);
  EXPECT_EQ(init.cap.max_send_wr, 5u);
  EXPECT_EQ(init.cap.max_recv_wr, 5u);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RESET);
}

TEST_F(UdQpTest, UnsupportedQpTypeFailsWithEopnotsupp) {
  errno = 0;
  // IBV_QPT_DRIVER: a vendor's own QP type (mlx5's DCI/DCT), not this device's.
  EXPECT_EQ(CreateQp(IBV_QPT_DRIVER), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(UdQpTest, IllegalTransitionIsRefusedAndChangesNothing) {
  ibv_qp* qp = CreateQp(IBV_QPT_RC);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  ibv_qp_attr q;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RESET);
}

TEST_F(UdQpTest, RcPathWithoutGrhIsRefusedOnRoce) {
  ibv_qp* qp = CreateQp(IBV_QPT_RC);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x20;
  a.rq_psn = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 0;
  a.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL);
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
  a.ah_attr.grh.dgid.raw[12] = 127;
  a.ah_attr.grh.dgid.raw[15] = 1;
  a.ah_attr.grh.hop_limit = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), 0);
}

TEST_F(UdQpTest, PostingInResetFailsAndBeyondCapacityFailsWithEnomem) {
  ibv_qp* qp = CreateQp(IBV_QPT_UD, 2);
  ASSERT_NE(qp, nullptr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 64, mr_->lkey};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  ASSERT_EQ(ToRts(qp), 0);
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), ENOMEM);
}

// As libmlx5 and libmlx4 do: a QP modified to RESET takes its unpolled
// completions out of its CQs, so one brought back from ERR polls only new
// ones (rdma-core's test_mr restates QPs ERR -> RESET -> RTS and expects so).
TEST_F(UdQpTest, ResetTakesTheQpsCompletionsOutOfItsCqAndNoOthers) {
  ibv_qp* a = CreateQp(IBV_QPT_UD, 4);
  ibv_qp* b = CreateQp(IBV_QPT_UD, 4);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(ToRts(a), 0);
  ASSERT_EQ(ToRts(b), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 64, mr_->lkey};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  for (uint64_t id : {1, 2, 3}) {
    wr.wr_id = id;
    ASSERT_EQ(ibv_post_recv(id == 2 ? b : a, &wr, &bad), 0);
  }
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_modify_qp(b, &attr, IBV_QP_STATE), 0);
  attr.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE), 0);
  // The flush is done by the time modify_qp returns; b's CQE is there.
  ibv_wc wc[4];
  ASSERT_EQ(ibv_poll_cq(cq_, 4, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].qp_num, b->qp_num);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  // a works again from RESET, with its CQ empty of the old completions.
  ASSERT_EQ(ToRts(a), 0);
  ASSERT_EQ(ibv_poll_cq(cq_, 4, wc), 0);
}

TEST_F(UdQpTest, DestroyingACqOrPdInUseFailsWithEbusy) {
  ibv_qp* qp = CreateQp(IBV_QPT_UD);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq_), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
}

TEST_F(UdQpTest, UdSendArrivesWithGrhAreaSourceQpAndImmediate) {
  ibv_qp* a = CreateQp(IBV_QPT_UD);
  ibv_qp* b = CreateQp(IBV_QPT_UD);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(ToRts(a), 0);
  ASSERT_EQ(ToRts(b), 0);

  ibv_ah* ah = CreateSelfAh();
  ASSERT_NE(ah, nullptr);

  uint8_t* rx = buf_.data() + 4096;
  ibv_sge rsge{reinterpret_cast<uintptr_t>(rx), 40 + 100, mr_->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 11;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad;
  ASSERT_EQ(ibv_post_recv(b, &rwr, &rbad), 0);

  for (int i = 0; i < 100; ++i) buf_[i] = static_cast<uint8_t>(i * 3);
  ibv_sge ssge{reinterpret_cast<uintptr_t>(buf_.data()), 100, mr_->lkey};
  ibv_send_wr swr{};
  swr.wr_id = 22;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND_WITH_IMM;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.imm_data = htonl(0x1234);
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = b->qp_num;
  swr.wr.ud.remote_qkey = 0x11111111;
  ibv_send_wr* sbad;
  ASSERT_EQ(ibv_post_send(a, &swr, &sbad), 0);

  std::vector<ibv_wc> got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc;
    if (ibv_poll_cq(cq_, 1, &wc) == 1) got.push_back(wc);
  }
  ASSERT_EQ(got.size(), 2u);
  const ibv_wc* send = got[0].wr_id == 22 ? &got[0] : &got[1];
  const ibv_wc* recv = got[0].wr_id == 11 ? &got[0] : &got[1];
  EXPECT_EQ(send->status, IBV_WC_SUCCESS);
  EXPECT_EQ(send->opcode, IBV_WC_SEND);
  EXPECT_EQ(recv->status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv->opcode, IBV_WC_RECV);
  EXPECT_EQ(recv->byte_len, 140u);
  EXPECT_EQ(recv->src_qp, a->qp_num);
  EXPECT_EQ(recv->qp_num, b->qp_num);
  EXPECT_TRUE(recv->wc_flags & IBV_WC_GRH);
  EXPECT_TRUE(recv->wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(recv->imm_data), 0x1234u);
  EXPECT_EQ(rx[20], 0x45);  // the IPv4 header after 20 zero bytes
  EXPECT_EQ(std::memcmp(rx + 40, buf_.data(), 100), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST_F(UdQpTest, WrongQkeyIsDropped) {
  ibv_qp* a = CreateQp(IBV_QPT_UD);
  ibv_qp* b = CreateQp(IBV_QPT_UD);
  ASSERT_EQ(ToRts(a), 0);
  ASSERT_EQ(ToRts(b), 0);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = gid;
  ah_attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(buf_.data() + 4096), 200, mr_->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad;
  ASSERT_EQ(ibv_post_recv(b, &rwr, &rbad), 0);
  ibv_sge ssge{reinterpret_cast<uintptr_t>(buf_.data()), 10, mr_->lkey};
  ibv_send_wr swr{};
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = b->qp_num;
  swr.wr.ud.remote_qkey = 0x22222222;
  ibv_send_wr* sbad;
  ASSERT_EQ(ibv_post_send(a, &swr, &sbad), 0);
  int completions = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    ibv_wc wc;
    completions += ibv_poll_cq(cq_, 1, &wc);
  }
  EXPECT_EQ(completions, 1);  // the send only: the receive never matched
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

}  // namespace
