// Thread domains and parent domains (ibv_alloc_td(3),
// ibv_alloc_parent_domain(3)): bad input refused with EINVAL, the busy
// rules (a PD or TD under a parent domain, a parent domain under objects),
// a parent domain accepted wherever a PD is, and a CQ whose ring lives in
// the memory the program's allocator gave, with traffic through it.
#include <errno.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "rdmaemu/rdmaemu.h"
#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

// What the allocator callbacks saw, and the arena they hand out.
struct Allocations {
  ibv_pd* expected_pd = nullptr;
  int allocs = 0;
  int frees = 0;
  bool wrong_args = false;
  bool fail = false;         // alloc returns NULL
  bool use_default = false;  // alloc returns IBV_ALLOCATOR_USE_DEFAULT
  std::vector<void*> given;  // what alloc returned and free has not taken back
};

void* Alloc(ibv_pd* pd, void* pd_context, size_t size, size_t alignment, uint64_t type) {
  auto* a = static_cast<Allocations*>(pd_context);
  if (pd != a->expected_pd || type != RDMAEMU_RES_TYPE_CQ) a->wrong_args = true;
  ++a->allocs;
  if (a->fail) return nullptr;
  if (a->use_default) return IBV_ALLOCATOR_USE_DEFAULT;
  void* p = nullptr;
  if (posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, size) != 0) return nullptr;
  std::memset(p, 0, size);
  a->given.push_back(p);
  return p;
}

void Free(ibv_pd* pd, void* pd_context, void* ptr, uint64_t type) {
  auto* a = static_cast<Allocations*>(pd_context);
  if (pd != a->expected_pd || type != RDMAEMU_RES_TYPE_CQ) a->wrong_args = true;
  ++a->frees;
  for (auto it = a->given.begin(); it != a->given.end(); ++it) {
    if (*it == ptr) {
      a->given.erase(it);
      std::free(ptr);
      return;
    }
  }
  a->wrong_args = true;  // freed what it never gave
}

class ParentDomainTest : public RcPairTest {
 protected:
  ibv_pd* ParentDomain(ibv_td* td = nullptr, Allocations* allocations = nullptr) {
    ibv_parent_domain_init_attr attr{};
    attr.pd = pd_;
    attr.td = td;
    if (allocations != nullptr) {
      attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
      attr.alloc = Alloc;
      attr.free = Free;
      attr.pd_context = allocations;
    }
    ibv_pd* parent = ibv_alloc_parent_domain(ctx_, &attr);
    if (allocations != nullptr) allocations->expected_pd = parent;
    return parent;
  }

  ibv_cq_ex* CqOn(ibv_pd* parent, int cqe = 16) {
    ibv_cq_init_attr_ex attr{};
    attr.cqe = cqe;
    attr.wc_flags = IBV_WC_STANDARD_FLAGS;
    attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    attr.parent_domain = parent;
    return ibv_create_cq_ex(ctx_, &attr);
  }

  ibv_qp* RcOn(ibv_pd* pd, ibv_cq* cq) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap = {16, 16, 1, 1, 0};
    return Own(ibv_create_qp(pd, &a));
  }
};

TEST_F(ParentDomainTest, ThreadDomainChecksItsAttributes) {
  ibv_td_init_attr attr{};
  attr.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_td(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  attr.comp_mask = 0;
  ibv_td* td = ibv_alloc_td(ctx_, &attr);
  ASSERT_NE(td, nullptr);
  EXPECT_EQ(td->context, ctx_);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

TEST_F(ParentDomainTest, BadAttributesAreEinval) {
  ibv_parent_domain_init_attr attr{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &attr), nullptr) << "no PD";
  EXPECT_EQ(errno, EINVAL);

  attr.pd = pd_;
  attr.comp_mask = 1u << 7;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &attr), nullptr) << "unknown comp_mask bit";
  EXPECT_EQ(errno, EINVAL);

  attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
  attr.alloc = Alloc;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &attr), nullptr) << "ALLOCATORS without free";
  EXPECT_EQ(errno, EINVAL);

  // A PD and a TD of another context.
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  ibv_pd* other_pd = ibv_alloc_pd(other);
  ibv_td_init_attr td_attr{};
  ibv_td* other_td = ibv_alloc_td(other, &td_attr);
  ASSERT_NE(other_pd, nullptr);
  ASSERT_NE(other_td, nullptr);
  attr = {};
  attr.pd = other_pd;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  attr.pd = pd_;
  attr.td = other_td;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_td(other_td), 0);
  EXPECT_EQ(ibv_dealloc_pd(other_pd), 0);
  EXPECT_EQ(ibv_close_device(other), 0);

  // A parent domain is made on a PD, not on another parent domain.
  ibv_pd* parent = ParentDomain();
  ASSERT_NE(parent, nullptr);
  attr = {};
  attr.pd = parent;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

TEST_F(ParentDomainTest, PdAndTdAreBusyUnderAParentDomain) {
  ibv_td_init_attr td_attr{};
  ibv_td* td = ibv_alloc_td(ctx_, &td_attr);
  ASSERT_NE(td, nullptr);
  ibv_pd* parent = ParentDomain(td);
  ASSERT_NE(parent, nullptr);
  EXPECT_EQ(parent->context, ctx_);
  EXPECT_EQ(parent->handle, pd_->handle) << "a parent domain protects with its PD's handle";

  ibv_pd* spare = ibv_alloc_pd(ctx_);
  ASSERT_NE(spare, nullptr);
  ibv_parent_domain_init_attr attr{};
  attr.pd = spare;
  ibv_pd* spare_parent = ibv_alloc_parent_domain(ctx_, &attr);
  ASSERT_NE(spare_parent, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(spare), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(ibv_dealloc_td(td), EBUSY);

  EXPECT_EQ(ibv_dealloc_pd(spare_parent), 0);
  EXPECT_EQ(ibv_dealloc_pd(spare), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

TEST_F(ParentDomainTest, AParentDomainIsAcceptedWhereAPdIsAndBusyUnderItsObjects) {
  ibv_pd* parent = ParentDomain();
  ASSERT_NE(parent, nullptr);
  ibv_mr* mr = ibv_reg_mr(parent, buf_.data(), 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->pd, parent);
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr = {16, 1, 0};
  ibv_srq* srq = ibv_create_srq(parent, &srq_attr);
  ASSERT_NE(srq, nullptr);
  ibv_gid gid = Gid(1);
  ibv_ah_attr av = Av(gid, 1);
  ibv_ah* ah = ibv_create_ah(parent, &av);
  ASSERT_NE(ah, nullptr);
  ibv_qp* qp = RcOn(parent, cq_);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->pd, parent);

  EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  Forget(qp);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY) << "the MR still uses it";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

TEST_F(ParentDomainTest, CqTakesOnlyAParentDomain) {
  errno = 0;
  EXPECT_EQ(CqOn(nullptr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(CqOn(pd_), nullptr) << "a plain PD";
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(ParentDomainTest, AllocatorFailureIsEnomemAndDefaultIsHonoured) {
  Allocations allocations;
  ibv_pd* parent = ParentDomain(nullptr, &allocations);
  ASSERT_NE(parent, nullptr);
  allocations.fail = true;
  errno = 0;
  EXPECT_EQ(CqOn(parent), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(allocations.allocs, 1);

  allocations.fail = false;
  allocations.use_default = true;
  ibv_cq_ex* cq = CqOn(parent);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(allocations.allocs, 2);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(allocations.frees, 0) << "what the default allocated is not given to free";
  EXPECT_FALSE(allocations.wrong_args);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

// The CQ's completions are written into the buffer the program's allocator
// gave; a resize asks for a new one and gives the old one back; the destroy
// gives the last one back. The QPs and an MR on the parent domain move data
// with the fixture's MR on the plain PD (one protection domain).
TEST_F(ParentDomainTest, CqRingLivesInTheAllocatorsMemoryAndCarriesTraffic) {
  Allocations allocations;
  ibv_td_init_attr td_attr{};
  ibv_td* td = ibv_alloc_td(ctx_, &td_attr);
  ASSERT_NE(td, nullptr);
  ibv_pd* parent = ParentDomain(td, &allocations);
  ASSERT_NE(parent, nullptr);
  ibv_cq_ex* cq_ex = CqOn(parent, 8);
  ASSERT_NE(cq_ex, nullptr);
  ASSERT_EQ(allocations.allocs, 1);
  ASSERT_EQ(allocations.given.size(), 1u);
  const void* ring = allocations.given[0];
  ibv_cq* cq = ibv_cq_ex_to_cq(cq_ex);
  EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY) << "the CQ uses it";

  ibv_qp* a = RcOn(parent, cq);
  ibv_qp* b = RcOn(parent, cq);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NO_FATAL_FAILURE(Connect(a, b));
  ibv_mr* src = ibv_reg_mr(parent, buf_.data(), 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(src, nullptr);
  std::memset(buf_.data(), 0x5a, 512);

  const uint64_t wr_id = 0x1122334455667788;
  ibv_sge sge{At(0), 512, src->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = At(8192);
  wr.wr.rdma.rkey = mr_->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);

  // The CQE is in the program's buffer before anyone polls it.
  bool in_ring = false;
  ibv_wc wc{};
  // Nobody polls, so the engine's thread completes the WRITE: the test's
  // thread yields its core to it (with another test spinning on the other
  // core of a 2-core machine it may wait milliseconds for one otherwise).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!in_ring && std::chrono::steady_clock::now() < give_up) {
    in_ring = std::memcmp(ring, &wr_id, sizeof wr_id) == 0;
    if (!in_ring) sched_yield();
  }
  EXPECT_TRUE(in_ring) << "the completion was not written into the allocator's buffer";
  int n = 0;
  for (int i = 0; i < 5000000 && n == 0; ++i) n = ibv_poll_cq(cq, 1, &wc);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, wr_id);
  EXPECT_EQ(std::memcmp(buf_.data() + 8192, buf_.data(), 512), 0);

  ASSERT_EQ(ibv_resize_cq(cq, 32), 0);
  EXPECT_EQ(allocations.allocs, 2);
  EXPECT_EQ(allocations.frees, 1);

  EXPECT_EQ(ibv_dereg_mr(src), 0);
  for (ibv_qp* qp : {a, b}) {
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    Forget(qp);
  }
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(allocations.frees, 2);
  EXPECT_TRUE(allocations.given.empty());
  EXPECT_FALSE(allocations.wrong_args);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

}  // namespace
}  // namespace rdmaemu::testing
