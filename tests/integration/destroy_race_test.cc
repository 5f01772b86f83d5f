// ibv_destroy_qp and then ibv_destroy_cq while the engine is still working
// through the QP's posted sends (qperf's teardown does exactly this). The
// engine thread may have found the QP just before the destroy unpublished
// it; once both destroys have returned it must not touch the QP's CQ, which
// is freed memory by then. Under AddressSanitizer a use shows as a
// heap-use-after-free; without a sanitizer it hung qperf (a CQ lock in freed
// memory) or wrote into reused memory.
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace rdmaemu::testing {
namespace {

constexpr uint32_t kQkey = 0x11111111;

ibv_qp* UdQpInRts(ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_UD;
  init.cap.max_send_wr = 64;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (qp == nullptr) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  bool ok = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  ok = ok && ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  ok = ok && ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
  if (!ok) {
    ibv_destroy_qp(qp);
    return nullptr;
  }
  return qp;
}

TEST(DestroyRaceTest, QpAndCqDestroyedWhileTheEngineSendsAreNeverTouchedAgain) {
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  ASSERT_NE(list[0], nullptr);
  ibv_context* ctx = ibv_open_device(list[0]);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  std::vector<uint8_t> buf(4096, 7);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = gid;
  ah_attr.grh.hop_limit = 1;
  ah_attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd, &ah_attr);
  ASSERT_NE(ah, nullptr);

  for (int round = 0; round < 300; ++round) {
    ibv_cq* cq = ibv_create_cq(ctx, 128, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp* qp = UdQpInRts(pd, cq);
    ASSERT_NE(qp, nullptr);
    for (int i = 0; i < 64; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 256, mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = static_cast<uint64_t>(i);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.ud.ah = ah;
      wr.wr.ud.remote_qpn = qp->qp_num;
      wr.wr.ud.remote_qkey = kQkey;
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
    }
    // At once, with the sends in the engine's hands.
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    ASSERT_EQ(ibv_destroy_cq(cq), 0);
  }

  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
  ibv_free_device_list(list);
}

}  // namespace
}  // namespace rdmaemu::testing
