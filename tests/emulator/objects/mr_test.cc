// Tests of MrTable: registration checks, keys, lookups and bounds.
#include "emulator/objects/mr.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/device/attributes.h"

namespace rdmaemu::objects {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

class MrTableTest : public ::testing::Test {
 protected:
  uint64_t Iova() const { return reinterpret_cast<uintptr_t>(buf_.data()); }
  Result<std::shared_ptr<const Mr>> Reg(uint32_t access, uint64_t len = 4096) {
    return table_.Register(1, buf_.data(), len, Iova(), access);
  }
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(8192);
  MrTable table_;
};

TEST(CheckAccessTest, ValidCombinations) {
  for (uint32_t a : {0u, uint32_t{kLocalWrite}, uint32_t{kRemoteRead}, kLocalWrite | kRemoteWrite,
                     kLocalWrite | kRemoteAtomic, kLocalWrite | kRemoteAccessMask,
                     kLocalWrite | kMwBind | kZeroBased, uint32_t{kHugetlb}, uint32_t{kRelaxedOrdering}}) {
    EXPECT_TRUE(MrTable::CheckAccess(a).ok()) << std::hex << a;
  }
}

TEST(CheckAccessTest, RemoteWriteOrAtomicWithoutLocalWriteIsEinval) {
  for (uint32_t a : {uint32_t{kRemoteWrite}, uint32_t{kRemoteAtomic}, kRemoteWrite | kRemoteRead,
                     kRemoteAtomic | kRemoteRead | kMwBind}) {
    Status s = MrTable::CheckAccess(a);
    EXPECT_EQ(s.code(), EINVAL) << std::hex << a;
    EXPECT_FALSE(s.message().empty());
  }
}

TEST(CheckAccessTest, UnknownBitsAreEinval) {
  for (uint32_t a : {1u << 10, 1u << 15, 1u << 19, 1u << 21, 1u << 31}) {
    EXPECT_EQ(MrTable::CheckAccess(a).code(), EINVAL) << std::hex << a;
    EXPECT_EQ(MrTable::CheckAccess(a | kLocalWrite).code(), EINVAL) << std::hex << a;
  }
}

TEST(CheckAccessTest, OnDemandAndGlobalFlushAreRightsPersistentFlushNeedsPmem) {
  EXPECT_TRUE(MrTable::CheckAccess(kOnDemand | kLocalWrite).ok());
  EXPECT_TRUE(MrTable::CheckAccess(kFlushGlobal | kLocalWrite).ok());
  EXPECT_EQ(MrTable::CheckAccess(kFlushPersistent | kLocalWrite).code(), EINVAL);
}

TEST_F(MrTableTest, RegisterValidatesAccess) {
  EXPECT_EQ(Reg(kRemoteWrite).status().code(), EINVAL);
  EXPECT_EQ(Reg(kRemoteAtomic).status().code(), EINVAL);
  EXPECT_EQ(Reg(1u << 12).status().code(), EINVAL);
  EXPECT_EQ(Reg(kFlushPersistent | kLocalWrite).status().code(), EINVAL);
  EXPECT_EQ(table_.size(), 0u) << "a failed registration publishes nothing";
}

// On demand, nothing is pinned: unmapped memory registers, and faulting it
// in is what fails (and succeeds once it is mapped).
TEST_F(MrTableTest, OnDemandRegionsRegisterUnmappedMemoryAndFaultInOnUse) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(munmap(static_cast<uint8_t*>(p) + page, page), 0);
  const auto base = reinterpret_cast<uintptr_t>(p);
  EXPECT_EQ(table_.Register(1, p, 2 * page, base, kLocalWrite).status().code(), EFAULT)
      << "pinned: every page must be mapped";
  auto odp = table_.Register(1, p, 2 * page, base, kLocalWrite | kOnDemand);
  ASSERT_TRUE(odp.ok()) << odp.status().message();
  EXPECT_TRUE((*odp)->FaultIn(base, page, true).ok());
  EXPECT_EQ((*odp)->FaultIn(base + page - 8, 16, false).code(), EFAULT);
  ASSERT_EQ(mprotect(p, page, PROT_READ), 0);
  EXPECT_TRUE((*odp)->FaultIn(base, 8, false).ok());
  EXPECT_EQ((*odp)->FaultIn(base, 8, true).code(), EFAULT) << "a read-only page cannot be written";
  munmap(p, page);
}

// As the kernel: a zero-length region inside a page registers (it pins that
// page); at a page boundary it spans none and is refused.
TEST_F(MrTableTest, ZeroLengthRegistersInsideAPageAndIsEinvalAtAPageBoundary) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* aligned = aligned_alloc(page, page);
  ASSERT_NE(aligned, nullptr);
  EXPECT_EQ(table_.Register(1, aligned, 0, 0, kLocalWrite).status().code(), EINVAL);
  auto inside = table_.Register(1, static_cast<uint8_t*>(aligned) + 8, 0, 0, kLocalWrite);
  ASSERT_TRUE(inside.ok()) << inside.status().message();
  EXPECT_EQ((*inside)->length, 0u);
  EXPECT_TRUE(table_.Deregister((*inside)->lkey).ok());
  free(aligned);
}

TEST_F(MrTableTest, NullAddressIsEfault) {
  EXPECT_EQ(table_.Register(1, nullptr, 64, 0, kLocalWrite).status().code(), EFAULT);
}

TEST_F(MrTableTest, IovaOverflowIsEinval) {
  EXPECT_EQ(table_.Register(1, buf_.data(), 4096, kMax - 100, kLocalWrite).status().code(), EINVAL);
}

TEST_F(MrTableTest, UnmappedMemoryIsEfault) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(p);
  ASSERT_EQ(::munmap(base + page, page), 0);  // a hole in the middle
  EXPECT_TRUE(table_.Register(1, base, page, 0, kLocalWrite).ok()) << "the first page is mapped";
  auto spanning = table_.Register(1, base + page / 2, 2 * page, 0, kLocalWrite);
  ASSERT_FALSE(spanning.ok());
  EXPECT_EQ(spanning.status().code(), EFAULT);
  auto in_hole = table_.Register(1, base + page + 8, 16, 0, kLocalWrite);
  EXPECT_EQ(in_hole.status().code(), EFAULT);
  auto across_all = table_.Register(1, base, 3 * page, 0, kLocalWrite);
  EXPECT_EQ(across_all.status().code(), EFAULT);
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
  EXPECT_EQ(table_.Register(1, base, page, 0, kLocalWrite).status().code(), EFAULT)
      << "a fully unmapped range";
}

TEST_F(MrTableTest, RegisterFillsTheRegion) {
  auto mr = table_.Register(7, buf_.data() + 16, 100, 0x1000, kLocalWrite | kRemoteRead);
  ASSERT_TRUE(mr.ok()) << mr.status().message();
  EXPECT_EQ((*mr)->pd, 7u);
  EXPECT_EQ((*mr)->addr, buf_.data() + 16);
  EXPECT_EQ((*mr)->length, 100u);
  EXPECT_EQ((*mr)->iova, 0x1000u);
  EXPECT_EQ((*mr)->access, kLocalWrite | kRemoteRead);
  EXPECT_NE((*mr)->lkey, 0u);
  EXPECT_EQ((*mr)->HostAddress(0x1000), buf_.data() + 16);
  EXPECT_EQ((*mr)->HostAddress(0x1063), buf_.data() + 16 + 99);
  EXPECT_EQ(table_.size(), 1u);
}

TEST_F(MrTableTest, ZeroBasedRegionAnswersToIovaZero) {
  auto mr = table_.Register(1, buf_.data(), 4096, Iova(), kLocalWrite | kZeroBased);
  ASSERT_TRUE(mr.ok()) << mr.status().message();
  EXPECT_EQ((*mr)->iova, 0u);
  EXPECT_TRUE((*mr)->Contains(0, 4096));
  EXPECT_FALSE((*mr)->Contains(Iova(), 1)) << "the virtual address no longer applies";
  EXPECT_EQ((*mr)->HostAddress(10), buf_.data() + 10);
}

TEST_F(MrTableTest, KeysAreUniqueAndFindable) {
  std::set<uint32_t> keys;
  std::vector<std::shared_ptr<const Mr>> mrs;
  for (int i = 0; i < 200; ++i) {
    auto mr = table_.Register(1, buf_.data() + i, 8, Iova() + i, kLocalWrite);
    ASSERT_TRUE(mr.ok());
    EXPECT_NE((*mr)->lkey, 0u);
    EXPECT_TRUE(keys.insert((*mr)->lkey).second) << "duplicate key";
    mrs.push_back(*mr);
  }
  EXPECT_EQ(table_.size(), 200u);
  for (const auto& mr : mrs) {
    EXPECT_EQ(table_.FindByLkey(mr->lkey), mr);
    EXPECT_EQ(table_.FindByRkey(mr->rkey), mr);
  }
  EXPECT_EQ(table_.FindByLkey(0), nullptr);
  EXPECT_EQ(table_.FindByLkey(0xffffffff), nullptr);
}

TEST_F(MrTableTest, KeysAreStaleAfterDeregisterEvenWhenTheSlotIsReused) {
  auto a = Reg(kLocalWrite);
  ASSERT_TRUE(a.ok());
  uint32_t old_key = (*a)->lkey;
  uint32_t old_rkey = (*a)->rkey;
  ASSERT_TRUE(table_.Deregister(old_key).ok());
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.FindByLkey(old_key), nullptr);
  EXPECT_EQ(table_.FindByRkey(old_rkey), nullptr);
  EXPECT_EQ(table_.Deregister(old_key).code(), EINVAL) << "double deregister";

  auto b = Reg(kLocalWrite);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)->lkey, old_key) << "a reused slot gets a fresh key";
  EXPECT_NE((*b)->rkey, old_rkey);
  EXPECT_EQ(table_.FindByLkey(old_key), nullptr);
  EXPECT_EQ(table_.FindByRkey(old_rkey), nullptr);
  EXPECT_EQ(table_.Deregister(old_key).code(), EINVAL) << "a stale key must not free the new region";
  EXPECT_NE(table_.FindByLkey((*b)->lkey), nullptr);
  // The region object outlives its deregistration while someone holds it.
  EXPECT_EQ((*a)->length, 4096u);
}

TEST_F(MrTableTest, DeregisterOfUnknownKeysIsEinval) {
  EXPECT_EQ(table_.Deregister(0).code(), EINVAL);
  EXPECT_EQ(table_.Deregister(0x100).code(), EINVAL);
  EXPECT_EQ(table_.Deregister(0xdeadbe01).code(), EINVAL);
}

TEST_F(MrTableTest, ReregisterKeepsTheKeysAndReplacesTheRest) {
  auto a = Reg(kLocalWrite);
  ASSERT_TRUE(a.ok());
  uint32_t key = (*a)->lkey;
  auto b = table_.Reregister(key, 2, buf_.data() + 4096, 4096, Iova() + 4096,
                             kLocalWrite | kRemoteWrite);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ((*b)->lkey, key);
  EXPECT_EQ((*b)->rkey, key);
  EXPECT_EQ((*b)->pd, 2u);
  EXPECT_EQ((*b)->iova, Iova() + 4096);
  EXPECT_EQ((*b)->addr, buf_.data() + 4096);
  EXPECT_EQ((*b)->access, kLocalWrite | kRemoteWrite);
  // The key finds the new region, never the old one.
  EXPECT_EQ(table_.FindByLkey(key), *b);
  EXPECT_EQ(table_.FindByRkey(key), *b);
  EXPECT_EQ(table_.size(), 1u);
  ASSERT_TRUE(table_.Deregister(key).ok());
  EXPECT_EQ(table_.size(), 0u);
}

TEST_F(MrTableTest, FailedReregisterKeepsTheOldRegion) {
  auto a = Reg(kLocalWrite);
  ASSERT_TRUE(a.ok());
  auto b = table_.Reregister((*a)->lkey, 1, buf_.data(), 4096, Iova(), kRemoteWrite);
  EXPECT_EQ(b.status().code(), EINVAL);
  EXPECT_EQ(table_.FindByLkey((*a)->lkey), *a);
  EXPECT_EQ(table_.Reregister(0x12345601, 1, buf_.data(), 16, Iova(), 0).status().code(), EINVAL);
}

TEST_F(MrTableTest, TableIsLimitedToMaxMr) {
  std::vector<uint32_t> keys;
  keys.reserve(device::kMaxMr);
  for (int i = 0; i < device::kMaxMr; ++i) {
    auto mr = table_.Register(1, buf_.data(), 8, Iova(), 0);
    ASSERT_TRUE(mr.ok()) << i;
    keys.push_back((*mr)->lkey);
  }
  EXPECT_EQ(table_.Register(1, buf_.data(), 8, Iova(), 0).status().code(), ENOMEM);
  ASSERT_TRUE(table_.Deregister(keys.back()).ok());
  EXPECT_TRUE(table_.Register(1, buf_.data(), 8, Iova(), 0).ok());
}

TEST(MrContainsTest, BoundsAreInclusiveOfTheLastByteOnly) {
  Mr mr;
  mr.iova = 1000;
  mr.length = 100;
  EXPECT_TRUE(mr.Contains(1000, 100));
  EXPECT_TRUE(mr.Contains(1000, 0));
  EXPECT_TRUE(mr.Contains(1099, 1));
  EXPECT_TRUE(mr.Contains(1100, 0)) << "an empty range at the end";
  EXPECT_TRUE(mr.Contains(1050, 50));
  EXPECT_FALSE(mr.Contains(999, 1));
  EXPECT_FALSE(mr.Contains(999, 2));
  EXPECT_FALSE(mr.Contains(1000, 101));
  EXPECT_FALSE(mr.Contains(1099, 2));
  EXPECT_FALSE(mr.Contains(1100, 1));
  EXPECT_FALSE(mr.Contains(1101, 0));
  EXPECT_FALSE(mr.Contains(0, 0));
}

TEST(MrContainsTest, OverflowingRangesAreOutside) {
  Mr mr;
  mr.iova = 1000;
  mr.length = 100;
  EXPECT_FALSE(mr.Contains(1001, kMax)) << "start + len wraps";
  EXPECT_FALSE(mr.Contains(kMax, 2));
  EXPECT_FALSE(mr.Contains(kMax, kMax));
  EXPECT_FALSE(mr.Contains(1050, kMax - 1040));

  Mr top;
  top.iova = kMax - 99;
  top.length = 100;  // ends exactly at 2^64
  EXPECT_TRUE(top.Contains(kMax - 99, 100));
  EXPECT_TRUE(top.Contains(kMax, 1));
  EXPECT_FALSE(top.Contains(kMax, 2));
  EXPECT_FALSE(top.Contains(0, 1));

  Mr whole;
  whole.iova = 0;
  whole.length = kMax;
  EXPECT_TRUE(whole.Contains(0, kMax));
  EXPECT_TRUE(whole.Contains(kMax - 1, 1));
  EXPECT_FALSE(whole.Contains(1, kMax));
}

}  // namespace
}  // namespace rdmaemu::objects
