// Memory windows (issue 14, item 4) through the public verbs API: type 1
// windows bound with ibv_bind_mw, type 2 windows bound with IBV_WR_BIND_MW
// and ibv_wr_bind_mw, invalidated locally and by a SEND with invalidate;
// the checks a bind makes (MW_BIND_ERR), the responder's checks of a
// window's rkey (REM_ACCESS_ERR) and the verbs' own errors. Two RC QPs of
// one process: `a` sends, `b` answers; a type 2 window is bound on `b`,
// whose responder serves `a`'s requests. On each engine backend.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/integration/rc_pair.h"

namespace {

using rdmaemu::testing::RcPairTest;

constexpr size_t kRegion = 0x40000;       // where the MW_BIND region starts in buf_
constexpr size_t kRegionBytes = 0x10000;
constexpr size_t kWindow = kRegion + 0x1000;  // the windows' usual range
constexpr uint32_t kWindowBytes = 0x1000;
constexpr unsigned kRemoteAll =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

class MemoryWindowTest : public RcPairTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(RcPairTest::SetUp());
    // No remote rights of its own: remote access comes through windows only.
    region_ = ibv_reg_mr(pd_, buf_.data() + kRegion, kRegionBytes,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    ASSERT_NE(region_, nullptr);
  }
  void DestroyExtras() override {
    for (ibv_mw* mw : mws_) EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    for (ibv_mr* mr : extra_mrs_) EXPECT_EQ(ibv_dereg_mr(mr), 0);
    if (region_ != nullptr) {
      EXPECT_EQ(ibv_dereg_mr(region_), 0);
    }
    for (ibv_pd* pd : extra_pds_) EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  }


  ibv_mw* Alloc(ibv_mw_type type, ibv_pd* pd = nullptr) {
    ibv_mw* mw = ibv_alloc_mw(pd != nullptr ? pd : pd_, type);
    if (mw != nullptr) mws_.push_back(mw);
    return mw;
  }
  void Dealloc(ibv_mw* mw) {
    ASSERT_EQ(ibv_dealloc_mw(mw), 0);
    mws_.erase(std::find(mws_.begin(), mws_.end(), mw));
  }

  // A connected pair with every remote right on the QPs (the windows decide).
  void Pair(ibv_qp** a, ibv_qp** b, ibv_pd* pd = nullptr) {
    *a = CreateRcOn(pd != nullptr ? pd : pd_);
    *b = CreateRcOn(pd_);
    ASSERT_TRUE(*a && *b);
    ibv_gid gid = Gid(1);
    for (auto [qp, peer] : {std::pair{*a, *b}, std::pair{*b, *a}}) {
      ibv_qp_attr init{};
      init.qp_state = IBV_QPS_INIT;
      init.port_num = 1;
      init.qp_access_flags = kRemoteAll;
      ASSERT_EQ(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
      ASSERT_EQ(ToRtr(qp, peer->qp_num, Av(gid, 1)), 0);
      ASSERT_EQ(ToRts(qp), 0);
    }
  }
  ibv_qp* CreateRcOn(ibv_pd* pd) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap = {64, 64, 2, 2, 0};
    return Own(ibv_create_qp(pd, &a));
  }

  // IBV_WR_BIND_MW (type 2) on `qp`.
  int PostBind(ibv_qp* qp, uint64_t wr_id, ibv_mw* mw, uint32_t rkey, ibv_mr* mr, uint64_t addr,
               uint64_t length, unsigned access, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = flags;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = {mr, addr, length, access};
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }
  // ibv_bind_mw (type 1) on `qp`.
  int Bind1(ibv_qp* qp, uint64_t wr_id, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t length,
            unsigned access) {
    ibv_mw_bind b{};
    b.wr_id = wr_id;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = {mr, addr, length, access};
    return ibv_bind_mw(qp, mw, &b);
  }
  int PostInv(ibv_qp* qp, ibv_wr_opcode op, uint64_t wr_id, uint32_t rkey, ibv_sge* sge = nullptr) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    wr.sg_list = sge;
    wr.num_sge = sge != nullptr ? 1 : 0;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }
  int PostOp(ibv_qp* qp, ibv_wr_opcode op, uint64_t wr_id, ibv_sge sge, uint64_t remote, uint32_t rkey,
             unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = flags;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = remote;
      wr.wr.atomic.rkey = rkey;
      wr.wr.atomic.compare_add = 5;
    } else {
      wr.wr.rdma.remote_addr = remote;
      wr.wr.rdma.rkey = rkey;
    }
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }

  // The status of `wr_id`'s completion on `qp` (IBV_WC_GENERAL_ERR if none came).
  ibv_wc_status Status(ibv_qp* qp, uint64_t wr_id) {
    ibv_wc wc;
    if (!Completion(qp, wr_id, &wc)) {
      ADD_FAILURE() << "no completion for wr_id " << wr_id;
      return IBV_WC_GENERAL_ERR;
    }
    return wc.status;
  }
  // Writes 64 bytes of `fill` from `a` to `remote` through `rkey`; the status.
  ibv_wc_status Write(ibv_qp* a, uint64_t wr_id, uint64_t remote, uint32_t rkey, uint8_t fill,
                      uint32_t len = 64) {
    std::memset(buf_.data(), fill, len);
    EXPECT_EQ(PostOp(a, IBV_WR_RDMA_WRITE, wr_id, Sge(0, len), remote, rkey), 0);
    return Status(a, wr_id);
  }

  ibv_mr* region_ = nullptr;
  std::vector<ibv_mw*> mws_;
  std::vector<ibv_mr*> extra_mrs_;
  std::vector<ibv_pd*> extra_pds_;
};

// --- the device says it has windows ----------------------------------------

TEST_F(MemoryWindowTest, DeviceReportsMemoryWindowsAndMaxMw) {
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  // 2B, the rule enforced (a window answers on its QP only), and not 2A.
  EXPECT_FALSE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  EXPECT_GT(attr.max_mw, 0);
}

// --- allocating and deallocating --------------------------------------------

TEST_F(MemoryWindowTest, AllocatesBothTypesAndRefusesAnUnknownType) {
  ibv_mw* one = Alloc(IBV_MW_TYPE_1);
  ibv_mw* two = Alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(one && two);
  EXPECT_EQ(one->type, IBV_MW_TYPE_1);
  EXPECT_EQ(two->type, IBV_MW_TYPE_2);
  EXPECT_EQ(one->pd, pd_);
  EXPECT_NE(one->rkey, 0u);
  EXPECT_NE(one->rkey >> 8, two->rkey >> 8) << "two windows share an rkey index";
  EXPECT_NE(one->rkey >> 8, mr_->rkey >> 8);
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(pd_, static_cast<ibv_mw_type>(3)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A PD with windows is busy.
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// --- type 1: ibv_bind_mw -------------------------------------------------------

TEST_F(MemoryWindowTest, Type1BindGrantsWriteReadAndAtomicInsideTheWindow) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  const uint32_t before = mw->rkey;
  ASSERT_EQ(Bind1(b, 1, mw, region_, At(kWindow), kWindowBytes, kRemoteAll), 0);
  EXPECT_EQ(mw->rkey, ibv_inc_rkey(before)) << "ibv_bind_mw bumps the key";
  ibv_wc wc;
  ASSERT_TRUE(Completion(b, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
  // WRITE, READ and an atomic through the window's rkey.
  EXPECT_EQ(Write(a, 2, At(kWindow + 64), mw->rkey, 0x5a), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kWindow + 64], 0x5a);
  buf_[kWindow + 256] = 0x77;
  ASSERT_EQ(PostOp(a, IBV_WR_RDMA_READ, 3, Sge(512, 16), At(kWindow + 256), mw->rkey), 0);
  EXPECT_EQ(Status(a, 3), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[512], 0x77);
  ASSERT_EQ(PostOp(a, IBV_WR_ATOMIC_FETCH_AND_ADD, 4, Sge(1024, 8), At(kWindow + 1024), mw->rkey), 0);
  EXPECT_EQ(Status(a, 4), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kWindow + 1024], 5);
}

TEST_F(MemoryWindowTest, Type1RebindBumpsTheKeyAndTheOldOneIsRefused) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ASSERT_EQ(Bind1(b, 1, mw, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  const uint32_t first = mw->rkey;
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(Bind1(b, 2, mw, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 2), IBV_WC_SUCCESS);
  EXPECT_EQ(mw->rkey, ibv_inc_rkey(first));
  EXPECT_EQ(Write(a, 3, At(kWindow), mw->rkey, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 4, At(kWindow), first, 2), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_[kWindow], 1) << "the stale key wrote";
}

TEST_F(MemoryWindowTest, AccessOutsideTheWindowIsRefusedEvenInsideTheRegion) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ASSERT_EQ(Bind1(b, 1, mw, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 2, At(kWindow + kWindowBytes - 32), mw->rkey, 9), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_[kWindow + kWindowBytes - 32], 0);
}

TEST_F(MemoryWindowTest, WindowGrantsOnlyItsOwnRights) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ASSERT_EQ(Bind1(b, 1, mw, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(PostOp(a, IBV_WR_RDMA_READ, 2, Sge(512, 16), At(kWindow), mw->rkey), 0);
  EXPECT_EQ(Status(a, 2), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 3, At(kWindow), mw->rkey, 9), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_[kWindow], 0);
}

TEST_F(MemoryWindowTest, Type1UnbindWithZeroLengthRevokesAccess) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ASSERT_EQ(Bind1(b, 1, mw, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(Bind1(b, 2, mw, region_, At(kWindow), 0, 0), 0);  // what pyverbs' test does
  EXPECT_EQ(Status(b, 2), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 3, At(kWindow), mw->rkey, 9), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindowTest, Type1VerbRefusesZeroBasedAndTheWrongPdAtTheCall) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(Bind1(b, 1, mw, region_, At(kWindow), kWindowBytes,
                  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED),
            EINVAL);
  // Posting a type 1 window's bind as a WR is refused: it is ibv_bind_mw's.
  EXPECT_EQ(PostBind(b, 2, mw, ibv_inc_rkey(mw->rkey), region_, At(kWindow), kWindowBytes,
                     IBV_ACCESS_REMOTE_WRITE),
            EINVAL);
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  extra_pds_.push_back(other);
  ibv_mw* foreign = Alloc(IBV_MW_TYPE_1, other);
  ASSERT_NE(foreign, nullptr);
  // verbs.h's ibv_bind_mw: region and window of different PDs.
  EXPECT_EQ(Bind1(b, 3, foreign, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), EPERM);
}

// --- what a bind checks when the device executes it: MW_BIND_ERR ------------

TEST_F(MemoryWindowTest, BindChecksTheRegionAndTheRightsAndFailsWithMwBindErr) {
  std::vector<uint8_t> local(4096);
  // A region without IBV_ACCESS_MW_BIND, and one without LOCAL_WRITE.
  ibv_mr* no_bind = ibv_reg_mr(pd_, local.data(), 2048, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* read_only = ibv_reg_mr(pd_, local.data() + 2048, 2048,
                                 IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(no_bind && read_only);
  extra_mrs_ = {no_bind, read_only};
  struct Case {
    const char* what;
    ibv_mr* mr;
    uint64_t addr;
    uint64_t length;
    unsigned access;
  } cases[] = {
      {"region without MW_BIND", no_bind, reinterpret_cast<uintptr_t>(local.data()), 64,
       IBV_ACCESS_REMOTE_READ},
      {"remote write on a region without LOCAL_WRITE", read_only,
       reinterpret_cast<uintptr_t>(local.data() + 2048), 64, IBV_ACCESS_REMOTE_WRITE},
      {"range past the region", region_, At(kRegion + kRegionBytes - 32), 64, IBV_ACCESS_REMOTE_READ},
      {"range before the region", region_, At(kRegion - 32), 64, IBV_ACCESS_REMOTE_READ},
      {"a type 2 bind of length 0", region_, At(kWindow), 0, IBV_ACCESS_REMOTE_READ},
      {"local-only rights beyond a window's", region_, At(kWindow), 64, IBV_ACCESS_MW_BIND},
  };
  uint64_t id = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ibv_qp *a, *b;
    ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
    ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
    ASSERT_NE(mw, nullptr);
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    ASSERT_EQ(PostBind(b, ++id, mw, rkey, c.mr, c.addr, c.length, c.access), 0);
    ibv_wc wc;
    ASSERT_TRUE(Completion(b, id, &wc));
    EXPECT_EQ(wc.status, IBV_WC_MW_BIND_ERR) << ibv_wc_status_str(wc.status);
    // A failed WR moves its QP to ERR, a bind's as any other's.
    EXPECT_EQ(Query(b).qp_state, IBV_QPS_ERR);
  }
}

TEST_F(MemoryWindowTest, BindOnAQpOfAnotherPdFailsWithMwBindErr) {
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  extra_pds_.push_back(other);
  ibv_qp* foreign_qp = CreateRcOn(other);
  ibv_qp* peer = CreateRcOn(pd_);
  ASSERT_TRUE(foreign_qp && peer);
  ibv_gid gid = Gid(1);
  for (auto [qp, p] : {std::pair{foreign_qp, peer}, std::pair{peer, foreign_qp}}) {
    ASSERT_EQ(ToInit(qp), 0);
    ASSERT_EQ(ToRtr(qp, p->qp_num, Av(gid, 1)), 0);
    ASSERT_EQ(ToRts(qp), 0);
  }
  // Window and region on pd_, the QP on `other`: type 2 ...
  ibv_mw* two = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(two, nullptr);
  ASSERT_EQ(PostBind(foreign_qp, 1, two, ibv_inc_rkey(two->rkey), region_, At(kWindow), kWindowBytes,
                     IBV_ACCESS_REMOTE_WRITE),
            0);
  EXPECT_EQ(Status(foreign_qp, 1), IBV_WC_MW_BIND_ERR);
  // ... and type 1 (on a fresh QP of `other`: the first one is in ERR).
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b, other));
  ibv_mw* one = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(one, nullptr);
  ASSERT_EQ(Bind1(a, 2, one, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(a, 2), IBV_WC_MW_BIND_ERR);
}

// --- type 2: IBV_WR_BIND_MW ------------------------------------------------------

TEST_F(MemoryWindowTest, Type2KeyIsTheProgramsLowByteAndOnlyItsIndexIsChecked) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = (mw->rkey & ~0xffu) | 0x5a;
  ASSERT_EQ(PostBind(b, 1, mw, rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  ibv_wc wc;
  ASSERT_TRUE(Completion(b, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(Write(a, 2, At(kWindow + 8), rkey, 0x42), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kWindow + 8], 0x42);
  // A key whose upper 24 bits name another object is not this window's.
  ibv_mw* other = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(PostBind(b, 3, other, mw->rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 3), IBV_WC_MW_BIND_ERR);
}

TEST_F(MemoryWindowTest, Type2ZeroBasedWindowIsAddressedFromZero) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(b, 1, mw, rkey, region_, At(kWindow), kWindowBytes,
                     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED),
            0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 2, 128, rkey, 0x6b), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kWindow + 128], 0x6b) << "offset 128 of a zero-based window";
  // Its virtual address is no address of the window.
  EXPECT_EQ(Write(a, 3, At(kWindow), rkey, 0x6c), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindowTest, Type2BoundTwiceWithoutInvalidatingFails) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(b, 1, mw, rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(PostBind(b, 2, mw, ibv_inc_rkey(rkey), region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 2), IBV_WC_MW_BIND_ERR);
}

TEST_F(MemoryWindowTest, Type2WindowServesOnlyTheQpItWasBoundOn) {
  ibv_qp *a, *b, *c, *d;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ASSERT_NO_FATAL_FAILURE(Pair(&c, &d));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(b, 1, mw, rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 2, At(kWindow), rkey, 1), IBV_WC_SUCCESS);   // served by b
  EXPECT_EQ(Write(c, 3, At(kWindow), rkey, 2), IBV_WC_REM_ACCESS_ERR);  // served by d
  EXPECT_EQ(buf_[kWindow], 1);
}

TEST_F(MemoryWindowTest, BindCompletesInOrderWithTheOtherWorkAndUnsignaledIsSilent) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ibv_mw* quiet = Alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw && quiet);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostOp(a, IBV_WR_RDMA_WRITE, 1, Sge(0, 64), At(kRegion - 4096), mr_->rkey), 0);
  ASSERT_EQ(PostBind(a, 2, mw, rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  ASSERT_EQ(PostBind(a, 3, quiet, ibv_inc_rkey(quiet->rkey), region_, At(kWindow), 64,
                     IBV_ACCESS_REMOTE_READ, 0),
            0);
  ASSERT_EQ(PostOp(a, IBV_WR_RDMA_WRITE, 4, Sge(0, 64), At(kRegion - 8192), mr_->rkey), 0);
  std::vector<ibv_wc> wcs = Poll(3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(wcs[2].wr_id, 4u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ibv_wc extra;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &extra), 0) << "the unsignaled bind completed";
}

TEST_F(MemoryWindowTest, BindIsRefusedOnUd) {
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_UD;
  qa.cap = {8, 8, 1, 1, 0};
  ibv_qp* ud = Own(ibv_create_qp(pd_, &qa));
  ASSERT_NE(ud, nullptr);
  ASSERT_EQ(UdToRts(ud, 0x11, 0), 0);
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(PostBind(ud, 1, mw, ibv_inc_rkey(mw->rkey), region_, At(kWindow), 64, IBV_ACCESS_REMOTE_READ),
            EINVAL);
  EXPECT_EQ(PostInv(ud, IBV_WR_LOCAL_INV, 2, mw->rkey), EINVAL);
}

// --- invalidation -------------------------------------------------------------

TEST_F(MemoryWindowTest, LocalInvalidateRevokesAndTheWindowCanBeBoundAgain) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t first = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(b, 1, mw, first, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 2, At(kWindow), first, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(PostInv(b, IBV_WR_LOCAL_INV, 3, first), 0);
  ibv_wc wc;
  ASSERT_TRUE(Completion(b, 3, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_LOCAL_INV);
  const uint32_t second = ibv_inc_rkey(first);
  ASSERT_EQ(PostBind(b, 4, mw, second, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 4), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 5, At(kWindow), second, 2), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kWindow], 2);
  EXPECT_EQ(Write(a, 6, At(kWindow), first, 3), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_[kWindow], 2);
}

TEST_F(MemoryWindowTest, LocalInvalidateOfWhatCannotBeInvalidatedFailsWithLocQpOpErr) {
  ibv_mw* one = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(one, nullptr);
  for (uint32_t rkey : {one->rkey, mr_->rkey}) {
    ibv_qp *a, *b;
    ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
    ASSERT_EQ(PostInv(b, IBV_WR_LOCAL_INV, 1, rkey), 0);
    EXPECT_EQ(Status(b, 1), IBV_WC_LOC_QP_OP_ERR) << std::hex << rkey;
  }
}

TEST_F(MemoryWindowTest, SendWithInvalidateInvalidatesTheWindowItNames) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(b, 1, mw, rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(Write(a, 2, At(kWindow), rkey, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(PostRecv(b, 3, Sge(8192, 64)), 0);
  ibv_sge sge = Sge(0, 16);
  ASSERT_EQ(PostInv(a, IBV_WR_SEND_WITH_INV, 4, rkey, &sge), 0);
  EXPECT_EQ(Status(a, 4), IBV_WC_SUCCESS);
  ibv_wc wc;
  ASSERT_TRUE(Completion(b, 3, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wc.invalidated_rkey, rkey);
  EXPECT_EQ(Write(a, 5, At(kWindow), rkey, 2), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_[kWindow], 1);
}

TEST_F(MemoryWindowTest, SendWithInvalidateOfAWindowOfAnotherQpFailsTheMessage) {
  ibv_qp *a, *b, *c, *d;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  ASSERT_NO_FATAL_FAILURE(Pair(&c, &d));
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(d, 1, mw, rkey, region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(d, 1), IBV_WC_SUCCESS);
  ASSERT_EQ(PostRecv(b, 2, Sge(8192, 64)), 0);
  ibv_sge sge = Sge(0, 16);
  ASSERT_EQ(PostInv(a, IBV_WR_SEND_WITH_INV, 3, rkey, &sge), 0);
  EXPECT_EQ(Status(a, 3), IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(Status(b, 2), IBV_WC_REM_INV_REQ_ERR);
  // The window still serves the QP it was bound on.
  EXPECT_EQ(Write(c, 4, At(kWindow), rkey, 7), IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kWindow], 7);
}

// Only windows (and regions of fast registration, which ibv_reg_mr never
// makes) can be invalidated by a SEND with invalidate: a region's rkey, or
// a key that names nothing, fails the message on both sides and revokes
// nothing (issue 14; rxe_invalidate_mr refuses a user region too).
TEST_F(MemoryWindowTest, SendWithInvalidateOfARegionsRkeyFailsTheMessage) {
  ibv_mr* target = ibv_reg_mr(pd_, buf_.data() + kRegion - 8192, 4096,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(target, nullptr);
  extra_mrs_.push_back(target);
  for (uint32_t rkey : {target->rkey, 0x00abcd00u}) {
    ibv_qp *a, *b;
    ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
    ASSERT_EQ(PostRecv(b, 1, Sge(8192, 64)), 0);
    ibv_sge sge = Sge(0, 16);
    ASSERT_EQ(PostInv(a, IBV_WR_SEND_WITH_INV, 2, rkey, &sge), 0);
    EXPECT_EQ(Status(a, 2), IBV_WC_REM_INV_REQ_ERR) << std::hex << rkey;
    EXPECT_EQ(Status(b, 1), IBV_WC_REM_INV_REQ_ERR) << std::hex << rkey;
  }
  // The region was not invalidated: it still serves a healthy pair.
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  EXPECT_EQ(Write(a, 3, reinterpret_cast<uintptr_t>(buf_.data() + kRegion - 8192), target->rkey, 9),
            IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[kRegion - 8192], 9);
}

// --- windows and the life of their region -----------------------------------

TEST_F(MemoryWindowTest, RegionWithABoundWindowCannotBeDeregistered) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  std::vector<uint8_t> local(4096);
  ibv_mr* mr = ibv_reg_mr(pd_, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(PostBind(b, 1, mw, rkey, mr, reinterpret_cast<uintptr_t>(local.data()), 64,
                     IBV_ACCESS_REMOTE_WRITE),
            0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  errno = 0;
  EXPECT_EQ(ibv_dereg_mr(mr), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ),
            IBV_REREG_MR_ERR_INPUT);
  ASSERT_EQ(PostInv(b, IBV_WR_LOCAL_INV, 2, rkey), 0);
  EXPECT_EQ(Status(b, 2), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(MemoryWindowTest, DeallocatedWindowStopsAnsweringAndFreesItsRegion) {
  ibv_qp *a, *b;
  ASSERT_NO_FATAL_FAILURE(Pair(&a, &b));
  std::vector<uint8_t> local(4096);
  ibv_mr* mr = ibv_reg_mr(pd_, local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ASSERT_EQ(Bind1(b, 1, mw, mr, reinterpret_cast<uintptr_t>(local.data()), 64, IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(Status(b, 1), IBV_WC_SUCCESS);
  const uint32_t rkey = mw->rkey;
  EXPECT_EQ(Write(a, 2, reinterpret_cast<uintptr_t>(local.data()), rkey, 1), IBV_WC_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(Dealloc(mw));
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(Write(a, 3, reinterpret_cast<uintptr_t>(local.data()), rkey, 2), IBV_WC_REM_ACCESS_ERR);
}

// --- the extended post API ---------------------------------------------------

TEST_F(MemoryWindowTest, WrBindMwAndWrLocalInvThroughTheExtendedApi) {
  ibv_qp_init_attr_ex qa{};
  qa.send_cq = qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {16, 16, 1, 1, 0};
  qa.pd = pd_;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
  ibv_qp* b = Own(ibv_create_qp_ex(ctx_, &qa));
  ASSERT_NE(b, nullptr);
  ibv_qp* a = CreateRcOn(pd_);
  ASSERT_NE(a, nullptr);
  ibv_gid gid = Gid(1);
  for (auto [qp, p] : {std::pair{a, b}, std::pair{b, a}}) {
    ASSERT_EQ(ToInit(qp), 0);
    ASSERT_EQ(ToRtr(qp, p->qp_num, Av(gid, 1)), 0);
    ASSERT_EQ(ToRts(qp), 0);
  }
  ibv_qp_ex* x = ibv_qp_to_qp_ex(b);
  ASSERT_NE(x, nullptr);
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t rkey = ibv_inc_rkey(mw->rkey);
  const ibv_mw_bind_info info{region_, At(kWindow), kWindowBytes, IBV_ACCESS_REMOTE_WRITE};
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_bind_mw(x, mw, rkey, &info);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ibv_wc wc;
  ASSERT_TRUE(Completion(b, 1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(Write(a, 2, At(kWindow), rkey, 4), IBV_WC_SUCCESS);
  ibv_wr_start(x);
  x->wr_id = 3;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_local_inv(x, rkey);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ASSERT_TRUE(Completion(b, 3, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_LOCAL_INV);
  EXPECT_EQ(Write(a, 4, At(kWindow), rkey, 5), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(buf_[kWindow], 4);
}

}  // namespace
