// Every object limit ibv_query_device reports holds: that many objects can
// be created, and one more fails with ENOMEM (issue 14, item 3). Destroying
// one makes room again. The limits are the device's, over all its contexts.
#include <errno.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "tests/testing/verbs_test.h"

namespace {

using rdmaemu::testing::VerbsTest;

class LimitsTest : public VerbsTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open(16, 4096, IBV_ACCESS_LOCAL_WRITE));
    ASSERT_EQ(ibv_query_device(ctx_, &attr_), 0);
  }

  // Creates objects until `max` exist in all (`existing` of them made by
  // the fixture), checks that one more fails with ENOMEM and that one fits
  // again after a destroy, then destroys what it made.
  template <typename T>
  void Fill(const char* what, int max, int existing, const std::function<T*()>& create,
            const std::function<int(T*)>& destroy) {
    std::vector<T*> made;
    made.reserve(max);
    for (int i = existing; i < max; ++i) {
      T* o = create();
      if (o == nullptr) {
        ADD_FAILURE() << what << ": creating number " << i + 1 << " of " << max << " failed: errno " << errno;
        break;
      }
      made.push_back(o);
    }
    if (static_cast<int>(made.size()) == max - existing) {
      errno = 0;
      T* extra = create();
      EXPECT_EQ(extra, nullptr) << what << ": one past the reported limit " << max << " was created";
      EXPECT_EQ(errno, ENOMEM) << what;
      if (extra != nullptr) made.push_back(extra);
      ASSERT_FALSE(made.empty());
      EXPECT_EQ(destroy(made.back()), 0);
      made.pop_back();
      T* again = create();
      EXPECT_NE(again, nullptr) << what << ": no room after a destroy";
      if (again != nullptr) made.push_back(again);
    }
    for (T* o : made) EXPECT_EQ(destroy(o), 0) << what;
  }

  ibv_device_attr attr_{};
};

TEST_F(LimitsTest, MaxPd) {
  // The fixture's PD is one of them.
  Fill<ibv_pd>("max_pd", attr_.max_pd, 1, [&] { return ibv_alloc_pd(ctx_); }, ibv_dealloc_pd);
}

TEST_F(LimitsTest, MaxCq) {
  Fill<ibv_cq>("max_cq", attr_.max_cq, 1, [&] { return ibv_create_cq(ctx_, 1, nullptr, nullptr, 0); },
               ibv_destroy_cq);
}

TEST_F(LimitsTest, MaxMr) {
  Fill<ibv_mr>("max_mr", attr_.max_mr, 1,
               [&] { return ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE); }, ibv_dereg_mr);
}

TEST_F(LimitsTest, MaxSrq) {
  Fill<ibv_srq>("max_srq", attr_.max_srq, 0,
                [&] {
                  ibv_srq_init_attr a{};
                  a.attr.max_wr = 1;
                  a.attr.max_sge = 1;
                  return ibv_create_srq(pd_, &a);
                },
                ibv_destroy_srq);
}

TEST_F(LimitsTest, MaxAh) {
  ibv_gid gid{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  Fill<ibv_ah>("max_ah", attr_.max_ah, 0,
               [&] {
                 ibv_ah_attr a{};
                 a.is_global = 1;
                 a.grh.dgid = gid;
                 a.grh.hop_limit = 1;
                 a.port_num = 1;
                 return ibv_create_ah(pd_, &a);
               },
               ibv_destroy_ah);
}

TEST_F(LimitsTest, MaxQp) {
  Fill<ibv_qp>("max_qp", attr_.max_qp, 0,
               [&] {
                 ibv_qp_init_attr a{};
                 a.send_cq = a.recv_cq = cq_;
                 a.qp_type = IBV_QPT_UD;
                 a.cap = {1, 1, 1, 1, 0};
                 return ibv_create_qp(pd_, &a);
               },
               ibv_destroy_qp);
}

// A second context of the same device shares the limits, as on a NIC.
TEST_F(LimitsTest, TwoContextsShareTheDevicesLimit) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  std::vector<ibv_srq*> made;
  for (int i = 0; i + 1 < attr_.max_srq; ++i) {
    ibv_srq_init_attr a{};
    a.attr.max_wr = 1;
    ibv_srq* s = ibv_create_srq(pd_, &a);
    ASSERT_NE(s, nullptr);
    made.push_back(s);
  }
  ibv_pd* pd = ibv_alloc_pd(other);
  ASSERT_NE(pd, nullptr);
  ibv_srq_init_attr a{};
  a.attr.max_wr = 1;
  ibv_srq* last = ibv_create_srq(pd, &a);
  ASSERT_NE(last, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_create_srq(pd, &a), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(ibv_destroy_srq(last), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  for (ibv_srq* s : made) EXPECT_EQ(ibv_destroy_srq(s), 0);
  EXPECT_EQ(ibv_close_device(other), 0);
}

}  // namespace
