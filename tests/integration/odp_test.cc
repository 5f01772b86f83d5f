// On-demand paging: regions registered with IBV_ACCESS_ON_DEMAND pin
// nothing; their pages are faulted in as the device touches them, and a page
// that is not mapped (or not writable, for a write) fails that access with
// the completion a NIC gives instead of faulting the device. Also implicit
// regions (the whole address space) and ibv_advise_mr.
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

constexpr int kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

class OdpTest : public RcPairTest {
 protected:
  void SetUp() override {
    RcPairTest::SetUp();
    page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  }
  void TearDown() override {
    for (ibv_mr* mr : mrs_) EXPECT_EQ(ibv_dereg_mr(mr), 0);
    if (area_ != nullptr) ::munmap(area_, area_len_);
    RcPairTest::TearDown();
  }

  // Four fresh pages, never touched, and an on-demand region over them.
  ibv_mr* OdpArea(int access = kRemote | IBV_ACCESS_ON_DEMAND) {
    area_len_ = 4 * page_;
    void* p = ::mmap(nullptr, area_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    area_ = static_cast<uint8_t*>(p);
    return Keep(ibv_reg_mr(pd_, area_, area_len_, access));
  }
  ibv_mr* Keep(ibv_mr* mr) {
    if (mr != nullptr) mrs_.push_back(mr);
    return mr;
  }

  int Post(ibv_qp* qp, uint64_t wr_id, ibv_wr_opcode op, ibv_sge sge, uintptr_t remote, uint32_t rkey) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &wr, &bad);
  }

  ibv_wc Wait(ibv_qp* qp, uint64_t wr_id) {
    ibv_wc wc{};
    EXPECT_TRUE(Completion(qp, wr_id, &wc)) << "no completion for wr " << wr_id;
    return wc;
  }

  void Pair() {
    a_ = CreateRc();
    b_ = CreateRc();
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_NO_FATAL_FAILURE(Connect(a_, b_));
  }

  size_t page_ = 4096;
  uint8_t* area_ = nullptr;
  size_t area_len_ = 0;
  std::vector<ibv_mr*> mrs_;
  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
};

TEST_F(OdpTest, DeviceReportsOnDemandPagingOnEveryTransport) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  EXPECT_TRUE(attr.odp_caps.general_caps & IBV_ODP_SUPPORT);
  EXPECT_TRUE(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
  const uint32_t rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
  for (uint32_t cap : {IBV_ODP_SUPPORT_SEND, IBV_ODP_SUPPORT_RECV, IBV_ODP_SUPPORT_WRITE,
                       IBV_ODP_SUPPORT_READ, IBV_ODP_SUPPORT_ATOMIC, IBV_ODP_SUPPORT_SRQ_RECV}) {
    EXPECT_TRUE(rc & cap) << cap;
  }
  EXPECT_TRUE(attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
  EXPECT_TRUE(attr.odp_caps.per_transport_caps.uc_odp_caps & IBV_ODP_SUPPORT_WRITE);
}

TEST_F(OdpTest, WriteAndReadThroughAnOnDemandRegionOfUntouchedPages) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ibv_mr* odp = OdpArea();
  ASSERT_NE(odp, nullptr);
  for (size_t i = 0; i < 3000; ++i) buf_[i] = static_cast<uint8_t>(i * 13 + 1);
  // Across a page boundary, into pages nobody has touched yet.
  const uintptr_t dst = reinterpret_cast<uintptr_t>(area_) + page_ - 100;
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, Sge(0, 3000), dst, odp->rkey), 0);
  EXPECT_EQ(Wait(a_, 1).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(area_ + page_ - 100, buf_.data(), 3000), 0);
  // And back: the on-demand region as the local side of a READ.
  ibv_sge local{reinterpret_cast<uintptr_t>(area_) + 2 * page_ + 8, 3000, odp->lkey};
  ASSERT_EQ(Post(a_, 2, IBV_WR_RDMA_READ, local, At(0), mr_->rkey), 0);
  EXPECT_EQ(Wait(a_, 2).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(area_ + 2 * page_ + 8, buf_.data(), 3000), 0);
}

TEST_F(OdpTest, ImplicitRegionCoversTheWholeAddressSpace) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ibv_mr* all = Keep(ibv_reg_mr(pd_, nullptr, SIZE_MAX, kRemote | IBV_ACCESS_ON_DEMAND));
  ASSERT_NE(all, nullptr) << strerror(errno);
  std::vector<uint8_t> src(2000), dst(2000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  // Heap memory never registered on its own, through the implicit keys.
  ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 2000, all->lkey};
  ASSERT_EQ(Post(a_, 3, IBV_WR_RDMA_WRITE, sge, reinterpret_cast<uintptr_t>(dst.data()), all->rkey), 0);
  EXPECT_EQ(Wait(a_, 3).status, IBV_WC_SUCCESS);
  EXPECT_EQ(dst, src);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, nullptr, SIZE_MAX, kRemote), nullptr) << "implicit needs ON_DEMAND";
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(OdpTest, RemoteWriteToAnUnmappedPageIsARemoteAccessErrorNotACrash) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ibv_mr* odp = OdpArea();
  ASSERT_NE(odp, nullptr);
  ASSERT_EQ(::munmap(area_ + page_, page_), 0);  // the second page goes away
  ASSERT_EQ(Post(a_, 4, IBV_WR_RDMA_WRITE, Sge(0, 64), reinterpret_cast<uintptr_t>(area_ + page_ + 8),
                 odp->rkey),
            0);
  EXPECT_EQ(Wait(a_, 4).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(OdpTest, RemoteWriteToAReadOnlyPageIsARemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ibv_mr* odp = OdpArea();
  ASSERT_NE(odp, nullptr);
  ASSERT_EQ(::mprotect(area_, page_, PROT_READ), 0);
  ASSERT_EQ(Post(a_, 5, IBV_WR_RDMA_WRITE, Sge(0, 64), reinterpret_cast<uintptr_t>(area_), odp->rkey), 0);
  EXPECT_EQ(Wait(a_, 5).status, IBV_WC_REM_ACCESS_ERR);
  // Reading it is fine.
  ASSERT_NO_FATAL_FAILURE(Pair());
  ASSERT_EQ(Post(a_, 6, IBV_WR_RDMA_READ, Sge(0, 64), reinterpret_cast<uintptr_t>(area_), odp->rkey), 0);
  EXPECT_EQ(Wait(a_, 6).status, IBV_WC_SUCCESS);
}

TEST_F(OdpTest, SendingFromAnUnmappedPageIsALocalProtectionError) {
  ASSERT_NO_FATAL_FAILURE(Pair());
  ibv_mr* odp = OdpArea();
  ASSERT_NE(odp, nullptr);
  ASSERT_EQ(::munmap(area_ + 3 * page_, page_), 0);
  ibv_sge gone{reinterpret_cast<uintptr_t>(area_ + 3 * page_), 64, odp->lkey};
  ASSERT_EQ(Post(a_, 7, IBV_WR_RDMA_WRITE, gone, At(0), mr_->rkey), 0);
  EXPECT_EQ(Wait(a_, 7).status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(OdpTest, AdviseMrPrefetchesAndReportsWhatItCannotWithFlush) {
  ibv_mr* odp = OdpArea();
  ASSERT_NE(odp, nullptr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(area_), static_cast<uint32_t>(2 * page_), odp->lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1), 0);
  ASSERT_EQ(::munmap(area_ + page_, page_), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1), EFAULT);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1), 0) << "a hint reports nothing";
  // Bad arguments.
  ibv_sge pinned = Sge(0, 64);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pinned, 1), EINVAL);
  ibv_sge outside{reinterpret_cast<uintptr_t>(area_), static_cast<uint32_t>(8 * page_), odp->lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &outside, 1), EINVAL);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0), EINVAL);
  EXPECT_EQ(ibv_advise_mr(pd_, static_cast<ibv_advise_mr_advice>(7), 0, &sge, 1), EOPNOTSUPP);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x10, &sge, 1), EOPNOTSUPP);
}

}  // namespace
}  // namespace rdmaemu::testing
