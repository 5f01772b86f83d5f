// freed-registered-memory's lookup (provider/check/registered.h), asked
// directly as the interposer asks it: which releases overlap a live MR, once
// per MR, and which MRs no longer count (deregistered, closed with their
// context, moved by a rereg, on-demand paging).
#include "provider/check/registered.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "provider/check/check.h"

namespace rdmaemu::check {
namespace {

class Registered : public ::testing::Test {
 protected:
  void SetUp() override { Configure(Mode::kWarn, nullptr); }
  void TearDown() override {
    for (ibv_mr* mr : mrs_) MemoryDeregistered(mr);
    Configure(Mode::kOff, nullptr);
  }

  // An MR over [addr, addr + length) of `context`, as the library would have made it.
  ibv_mr* Mr(uintptr_t addr, size_t length, unsigned access = IBV_ACCESS_LOCAL_WRITE,
             ibv_context* context = nullptr) {
    auto* mr = new ibv_mr{};
    mr->context = context != nullptr ? context : &context_;
    mr->addr = reinterpret_cast<void*>(addr);
    mr->length = length;
    mr->lkey = 0x100 + static_cast<uint32_t>(mrs_.size());
    mrs_.push_back(mr);
    MemoryRegistered(mr, access);
    return mr;
  }

  // How many reports releasing [addr, addr + length) made.
  int Release(uintptr_t addr, size_t length, const char* verb = "free") {
    int before = Count(Kind::kFreedRegisteredMemory);
    MemoryReleased(reinterpret_cast<void*>(addr), length, verb);
    return Count(Kind::kFreedRegisteredMemory) - before;
  }

  ibv_context context_{};
  std::vector<ibv_mr*> mrs_;  // leaked on purpose: the tables key on the pointer
};

TEST_F(Registered, OverlapIsReportedOncePerMr) {
  Mr(0x10000, 0x1000);
  EXPECT_EQ(Release(0xf000, 0x1000), 0) << "ends where the MR starts";
  EXPECT_EQ(Release(0x11000, 0x100), 0) << "starts where the MR ends";
  EXPECT_EQ(Release(0x10ff8, 0x10), 1) << "covers its last bytes";
  EXPECT_EQ(Release(0x10000, 0x1000), 0) << "the same MR again";
}

TEST_F(Registered, ReportsEachMrItsFreeingReaches) {
  Mr(0x20000, 0x100);
  Mr(0x20100, 0x100);
  EXPECT_EQ(Release(0x20000, 0x200, "munmap"), 1) << "one report, naming the other MR too";
  EXPECT_EQ(Release(0x20100, 0x10), 1) << "the second MR's own report";
}

TEST_F(Registered, FindsALongMrStartingFarBefore) {
  Mr(0x100000, 0x100000);
  Mr(0x1f0000, 0x10);
  EXPECT_EQ(Release(0x1ff000, 0x10), 1);
}

TEST_F(Registered, NoLongerAfterDeregistration) {
  ibv_mr* mr = Mr(0x30000, 0x1000);
  MemoryDeregistered(mr);
  EXPECT_EQ(Release(0x30000, 0x1000), 0);
}

TEST_F(Registered, NoLongerAfterItsContextCloses) {
  ibv_context other{};
  Mr(0x40000, 0x1000, IBV_ACCESS_LOCAL_WRITE, &other);
  Mr(0x50000, 0x1000);
  ContextMemoryReleased(&other);
  EXPECT_EQ(Release(0x40000, 0x1000), 0);
  EXPECT_EQ(Release(0x50000, 0x1000), 1) << "another context's MR stays";
}

TEST_F(Registered, ReregFollowsTheNewRange) {
  ibv_mr* mr = Mr(0x60000, 0x1000);
  mr->addr = reinterpret_cast<void*>(0x70000);
  MemoryReregistered(mr, IBV_REREG_MR_CHANGE_TRANSLATION, 0);
  EXPECT_EQ(Release(0x60000, 0x1000), 0);
  EXPECT_EQ(Release(0x70000, 0x1000), 1);
}

TEST_F(Registered, OnDemandPagingIsLeftOut) {
  Mr(0x80000, 0x1000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  EXPECT_EQ(Release(0x80000, 0x1000), 0);
  ibv_mr* mr = Mr(0x90000, 0x1000);
  MemoryReregistered(mr, IBV_REREG_MR_CHANGE_ACCESS, IBV_ACCESS_ON_DEMAND);
  EXPECT_EQ(Release(0x90000, 0x1000), 0);
}

TEST_F(Registered, NothingWhenOff) {
  Mr(0xa0000, 0x1000);
  Configure(Mode::kOff, nullptr);
  EXPECT_EQ(Release(0xa0000, 0x1000), 0);
}

}  // namespace
}  // namespace rdmaemu::check
