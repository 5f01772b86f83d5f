// ibv_create_qp_ex's init attributes as the kernel judges them: a comp_mask
// bit that names a field is not a request for a feature, the field's value
// is (rdma-core's pyverbs suite sets IBV_QP_INIT_ATTR_CREATE_FLAGS with no
// flags on every device that is not a Mellanox one).
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include "tests/testing/verbs_test.h"

namespace {

class CreateQpTest : public rdmaemu::testing::VerbsTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Open(16, 64, IBV_ACCESS_LOCAL_WRITE)); }

  ibv_qp* CreateEx(ibv_qp_type type, uint32_t comp_mask, uint32_t create_flags) {
    ibv_qp_init_attr_ex attr{};
    attr.qp_type = type;
    attr.send_cq = cq_;
    attr.recv_cq = cq_;
    attr.cap.max_send_wr = 2;
    attr.cap.max_recv_wr = 2;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | comp_mask;
    attr.pd = pd_;
    attr.create_flags = create_flags;
    errno = 0;
    return Own(ibv_create_qp_ex(ctx_, &attr));
  }
};

TEST_F(CreateQpTest, CreateFlagsBitWithNoFlagsCreatesTheQp) {
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
    ibv_qp* qp = CreateEx(type, IBV_QP_INIT_ATTR_CREATE_FLAGS, 0);
    ASSERT_NE(qp, nullptr) << "type " << type << ": errno " << errno;
    EXPECT_EQ(qp->state, IBV_QPS_RESET);
  }
}

TEST_F(CreateQpTest, KnownCreateFlagsAreNotSupported) {
  // As rxe: every flag of ibv_qp_create_flags is a feature it lacks.
  for (uint32_t flag : {IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, IBV_QP_CREATE_SCATTER_FCS,
                        IBV_QP_CREATE_CVLAN_STRIPPING, IBV_QP_CREATE_SOURCE_QPN,
                        IBV_QP_CREATE_PCI_WRITE_END_PADDING}) {
    EXPECT_EQ(CreateEx(IBV_QPT_UD, IBV_QP_INIT_ATTR_CREATE_FLAGS, flag), nullptr) << flag;
    EXPECT_EQ(errno, EOPNOTSUPP) << flag;
  }
}

TEST_F(CreateQpTest, UnknownCreateFlagsAreInvalid) {
  EXPECT_EQ(CreateEx(IBV_QPT_RC, IBV_QP_INIT_ATTR_CREATE_FLAGS, 1u << 30), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CreateQpTest, FlagsWithoutTheBitAreIgnored) {
  // create_flags is only read when comp_mask says it is set.
  EXPECT_NE(CreateEx(IBV_QPT_RC, 0, IBV_QP_CREATE_SCATTER_FCS), nullptr) << errno;
}

}  // namespace
