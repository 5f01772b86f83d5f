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

#include "tests/testing/verbs_test.h"

namespace rdmaemu::testing {
namespace {

constexpr uint32_t kQkey = 0x11111111;

class DestroyRaceTest : public VerbsTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Open(1, 4096, IBV_ACCESS_LOCAL_WRITE)); }

  // A UD QP in RTS on `cq`, with room for 64 sends; the test destroys it.
  ibv_qp* UdQpInRts(ibv_cq* cq) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_UD;
    init.cap.max_send_wr = 64;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    if (qp != nullptr && UdToRts(qp, kQkey, 1) != 0) {
      ibv_destroy_qp(qp);
      return nullptr;
    }
    return qp;
  }
};

TEST_F(DestroyRaceTest, QpAndCqDestroyedWhileTheEngineSendsAreNeverTouchedAgain) {
  ibv_ah* ah = CreateSelfAh();
  ASSERT_NE(ah, nullptr);
  for (int round = 0; round < 300; ++round) {
    ibv_cq* cq = ibv_create_cq(ctx_, 128, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp* qp = UdQpInRts(cq);
    ASSERT_NE(qp, nullptr);
    for (int i = 0; i < 64; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 256, mr_->lkey};
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
}

}  // namespace
}  // namespace rdmaemu::testing
