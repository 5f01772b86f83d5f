// IBVERBS_PRIVATE_34: every stub fails cleanly, in the real function's
// convention, without touching its (here: NULL or garbage) arguments; the
// provider registration hook is harmless; the data symbol is a 1-byte bool.

#include <errno.h>
#include <infiniband/verbs.h>

#include <type_traits>

#include "gtest/gtest.h"
#include "verbs/abi/exports.h"

namespace {

static_assert(std::is_same_v<decltype(verbs_allow_disassociate_destroy), bool>);
static_assert(sizeof(verbs_allow_disassociate_destroy) == 1);

TEST(PrivateAbi, DisassociateDestroyIsFalse) { EXPECT_FALSE(verbs_allow_disassociate_destroy); }

// What libmlx5's and libefa's ELF constructors pass: a verbs_device_ops whose
// first member is the provider's name.
struct FakeDeviceOps {
  const char* name;
  unsigned rest[64];
};

TEST(PrivateAbi, RegisterDriverIgnoresProviders) {
  static const FakeDeviceOps mlx5 = {"mlx5", {}};
  static const FakeDeviceOps unnamed = {nullptr, {}};
  verbs_register_driver_34(reinterpret_cast<const verbs_device_ops*>(&mlx5));
  verbs_register_driver_34(reinterpret_cast<const verbs_device_ops*>(&unnamed));
  verbs_register_driver_34(nullptr);
  // A registered provider never becomes a device: nothing else to observe
  // here (the device list is verbs/core's; see tests of ibv_get_device_list).
}

TEST(PrivateAbi, ContextFunctionsFail) {
  errno = 0;
  EXPECT_EQ(_verbs_init_and_alloc_context(nullptr, -1, 4096, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(verbs_open_device(nullptr, nullptr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  verbs_uninit_context(nullptr);
  verbs_set_ops(nullptr, nullptr);
  verbs_init_cq(nullptr, nullptr, nullptr, nullptr);
  char buf[16];
  errno = 0;
  EXPECT_EQ(ibv_read_ibdev_sysfs_file(buf, sizeof(buf), nullptr, "ports/%d/gids/%d", 1, 0), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST(PrivateAbi, IoctlHelpers) {
  EXPECT_EQ(execute_ioctl(nullptr, nullptr), EOPNOTSUPP);
  EXPECT_EQ(__ioctl_final_num_attrs(7, nullptr), 7u);
  EXPECT_EQ(__ioctl_final_num_attrs(0, nullptr), 0u);
}

TEST(PrivateAbi, VerbsLogKeepsErrno) {
  errno = EAGAIN;
  __verbs_log(nullptr, 1, "%s: %d", "provider test line", 42);
  __verbs_log(nullptr, 4, "debug %u", 1u);
  __verbs_log(nullptr, 0, "none");
  EXPECT_EQ(errno, EAGAIN);
}

TEST(PrivateAbi, CommandsReturnEopnotsupp) {
  ibv_device_attr_ex attr_ex;
  size_t resp_size = 0;
  uint64_t counters[2];
  EXPECT_EQ(ibv_cmd_get_context(nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_query_context(nullptr, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_query_device_any(nullptr, nullptr, &attr_ex, sizeof(attr_ex), nullptr,
                                     &resp_size),
            EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_query_port(nullptr, 1, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_alloc_pd(nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_dealloc_pd(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_open_xrcd(nullptr, nullptr, 0, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_close_xrcd(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_reg_mr(nullptr, nullptr, 0, 0, 0, nullptr, nullptr, 0, nullptr, 0),
            EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_rereg_mr(nullptr, 0, nullptr, 0, 0, 0, nullptr, nullptr, 0, nullptr, 0),
            EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_dereg_mr(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_query_mr(nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_advise_mr(nullptr, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_reg_dmabuf_mr(nullptr, 0, 0, 0, -1, 0, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_alloc_mw(nullptr, IBV_MW_TYPE_1, nullptr, nullptr, 0, nullptr, 0),
            EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_dealloc_mw(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_cq(nullptr, 1, nullptr, 0, nullptr, nullptr, 0, nullptr, 0),
            EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_cq_ex(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0, 0),
            EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_req_notify_cq(nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_resize_cq(nullptr, 1, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_cq(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_modify_cq(nullptr, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_srq(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_srq_ex(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_modify_srq(nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_query_srq(nullptr, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_srq(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_qp(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_qp_ex(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_qp_ex2(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_open_qp(nullptr, nullptr, 0, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_query_qp(nullptr, nullptr, 0, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_modify_qp(nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_modify_qp_ex(nullptr, nullptr, 0, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_qp(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_ah(nullptr, nullptr, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_ah(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_attach_mcast(nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_detach_mcast(nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_flow(nullptr, nullptr, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_flow(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_flow_action_esp(nullptr, nullptr, nullptr, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_modify_flow_action_esp(nullptr, nullptr, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_flow_action(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_wq(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_modify_wq(nullptr, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_wq(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_rwq_ind_table(nullptr, nullptr, nullptr, nullptr, 0), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_rwq_ind_table(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_create_counters(nullptr, nullptr, nullptr, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_destroy_counters(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_read_counters(nullptr, counters, 2, 0, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_alloc_dm(nullptr, nullptr, nullptr, nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_free_dm(nullptr), EOPNOTSUPP);
  EXPECT_EQ(ibv_cmd_reg_dm_mr(nullptr, nullptr, 0, 0, 0, nullptr, nullptr), EOPNOTSUPP);
}

TEST(PrivateAbi, PollCqFailsNegative) {
  ibv_wc wc[2];
  errno = 0;
  EXPECT_LT(ibv_cmd_poll_cq(nullptr, 2, wc), 0);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST(PrivateAbi, PostVerbsReportTheFirstWr) {
  ibv_send_wr swr = {};
  ibv_send_wr* bad_swr = nullptr;
  EXPECT_EQ(ibv_cmd_post_send(nullptr, &swr, &bad_swr), EOPNOTSUPP);
  EXPECT_EQ(bad_swr, &swr);
  ibv_recv_wr rwr = {};
  ibv_recv_wr* bad_rwr = nullptr;
  EXPECT_EQ(ibv_cmd_post_recv(nullptr, &rwr, &bad_rwr), EOPNOTSUPP);
  EXPECT_EQ(bad_rwr, &rwr);
  bad_rwr = nullptr;
  EXPECT_EQ(ibv_cmd_post_srq_recv(nullptr, &rwr, &bad_rwr), EOPNOTSUPP);
  EXPECT_EQ(bad_rwr, &rwr);
  EXPECT_EQ(ibv_cmd_post_send(nullptr, &swr, nullptr), EOPNOTSUPP);
}

}  // namespace
