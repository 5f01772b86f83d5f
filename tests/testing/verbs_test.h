// A base fixture for tests that drive the device through the public verbs
// API: it owns the objects nearly every such test starts from (the device
// list, one context, a PD, a CQ, one registered buffer) and the QPs the test
// creates, and destroys them in reverse order with each destroy checked. A
// destroy that fails (EBUSY: an event read and never acknowledged, a QP
// still on the CQ) then fails the test that caused it.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace rdmaemu::testing {

class VerbsTest : public ::testing::Test {
 protected:
  // Opens the first device (unless the test set ctx_ itself), then a PD, a
  // CQ of `cqe` entries and a buffer of `bytes` zeroed bytes registered with
  // `access`. Call with ASSERT_NO_FATAL_FAILURE.
  void Open(int cqe, size_t bytes, int access) {
    if (ctx_ == nullptr) {
      list_ = ibv_get_device_list(nullptr);
      ASSERT_NE(list_, nullptr);
      ASSERT_NE(list_[0], nullptr) << "no emulated device";
      ctx_ = ibv_open_device(list_[0]);
      ASSERT_NE(ctx_, nullptr);
    }
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    cq_ = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
    buf_.assign(bytes, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), access);
    ASSERT_NE(mr_, nullptr);
  }

  // The async fd stops blocking, so a test can look for an event that must
  // not be there.
  void AsyncFdNonBlocking() {
    const int flags = fcntl(ctx_->async_fd, F_GETFL);
    ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  }

  // Moves a UD QP from RESET to RTS on port 1 with `qkey`; 0 or the errno
  // of the modify that failed.
  static int UdToRts(ibv_qp* qp, uint32_t qkey, uint32_t sq_psn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = qkey;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return rc;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return rc;
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }

  // An address handle to this device itself (port 1, GID index 0), for UD
  // sends between the test's own QPs; nullptr on failure. The test
  // destroys it.
  ibv_ah* CreateSelfAh() {
    ibv_gid gid;
    if (ibv_query_gid(ctx_, 1, 0, &gid) != 0) return nullptr;
    ibv_ah_attr a{};
    a.is_global = 1;
    a.grh.dgid = gid;
    a.grh.hop_limit = 1;
    a.port_num = 1;
    return ibv_create_ah(pd_, &a);
  }

  // Keeps `qp` for TearDown to destroy.
  ibv_qp* Own(ibv_qp* qp) {
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
  }
  // The test destroyed `qp` itself: TearDown leaves it alone.
  void Forget(ibv_qp* qp) { qps_.erase(std::remove(qps_.begin(), qps_.end(), qp), qps_.end()); }

  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    qps_.clear();
    DestroyExtras();
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (cq_) {
      EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }
  // What a fixture adds between the QPs and the MR (an SRQ, ...).
  virtual void DestroyExtras() {}

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> buf_;
  std::vector<ibv_qp*> qps_;
};

}  // namespace rdmaemu::testing
