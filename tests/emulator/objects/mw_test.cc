// Tests of MwTable: allocation, the rules a bind checks, the views the
// responder looks rkeys up in, invalidation, and regions with windows.
#include "emulator/objects/mw.h"

#include <cerrno>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace rdmaemu::objects {
namespace {

constexpr uint32_t kPd = 1;
constexpr uint32_t kQpn = 0x11;

class MwTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto mr = mrs_.Register(kPd, buf_.data(), buf_.size(), Base(), kLocalWrite | kMwBind);
    ASSERT_TRUE(mr.ok()) << mr.status().message();
    mr_ = *mr;
  }
  uint64_t Base() const { return reinterpret_cast<uintptr_t>(buf_.data()); }
  uint32_t Alloc(MwType type, uint32_t pd = kPd) {
    auto rkey = mws_.Allocate(pd, static_cast<int>(type));
    EXPECT_TRUE(rkey.ok()) << rkey.status().message();
    return rkey.ok() ? *rkey : 0;
  }
  // A bind of [Base()+offset, +length) with `access`; type 2 unless `verb`.
  BindRequest Request(uint32_t mw, uint32_t new_rkey, uint64_t offset, uint64_t length,
                      uint32_t access, bool verb = false) {
    BindRequest r;
    r.mw_rkey = mw;
    r.new_rkey = new_rkey;
    r.has_mr = true;
    r.mr_lkey = mr_->lkey;
    r.addr = Base() + offset;
    r.length = length;
    r.access = access;
    r.type1_verb = verb;
    r.qp_pd = kPd;
    r.qpn = kQpn;
    return r;
  }
  static uint32_t Next(uint32_t rkey) { return (rkey & ~0xffu) | ((rkey + 1) & 0xffu); }

  std::vector<uint8_t> buf_ = std::vector<uint8_t>(8192);
  MrTable mrs_;
  MwTable mws_;
  std::shared_ptr<const Mr> mr_;
};

TEST_F(MwTableTest, AllocatesKeysOutsideTheRegionKeySpaceAndRefusesUnknownTypes) {
  uint32_t one = Alloc(MwType::kType1);
  uint32_t two = Alloc(MwType::kType2);
  EXPECT_TRUE(IsWindowKey(one));
  EXPECT_TRUE(IsWindowKey(two));
  EXPECT_FALSE(IsWindowKey(mr_->rkey));
  EXPECT_NE(one >> 8, two >> 8);
  EXPECT_EQ(mws_.Allocate(kPd, 3).status().code(), EINVAL);
  EXPECT_EQ(mws_.size(), 2u);
  EXPECT_TRUE(mws_.Deallocate(one).ok());
  EXPECT_EQ(mws_.Deallocate(one).code(), EINVAL);
  EXPECT_EQ(mws_.size(), 1u);
}

TEST_F(MwTableTest, BoundWindowIsAViewOfItsRangeAndRights) {
  uint32_t mw = Alloc(MwType::kType2);
  uint32_t key = Next(mw);
  EXPECT_EQ(mws_.FindByRkey(key), nullptr) << "unbound";
  ASSERT_TRUE(mws_.Bind(Request(mw, key, 1024, 512, kRemoteRead | kRemoteWrite), mrs_).ok());
  auto view = mws_.FindByRkey(key);
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->pd, kPd);
  EXPECT_EQ(view->iova, Base() + 1024);
  EXPECT_EQ(view->length, 512u);
  EXPECT_EQ(view->access, kRemoteRead | kRemoteWrite);
  EXPECT_EQ(view->bound_qpn, kQpn);
  EXPECT_EQ(view->HostAddress(Base() + 1024), buf_.data() + 1024);
  EXPECT_TRUE(view->Contains(Base() + 1024, 512));
  EXPECT_FALSE(view->Contains(Base() + 1024, 513));
  EXPECT_EQ(mws_.FindByRkey(mw), nullptr) << "the key before the bind";
  EXPECT_EQ(mws_.BoundTo(mr_->lkey), 1);
}

TEST_F(MwTableTest, ZeroBasedWindowStartsAtZero) {
  uint32_t mw = Alloc(MwType::kType2);
  ASSERT_TRUE(mws_.Bind(Request(mw, Next(mw), 2048, 256, kRemoteWrite | kZeroBased), mrs_).ok());
  auto view = mws_.FindByRkey(Next(mw));
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->iova, 0u);
  EXPECT_EQ(view->HostAddress(16), buf_.data() + 2048 + 16);
}

TEST_F(MwTableTest, BindRulesEachFail) {
  auto no_bind = mrs_.Register(kPd, buf_.data(), 64, Base(), kLocalWrite);
  auto no_local_write = mrs_.Register(kPd, buf_.data(), 64, Base(), kMwBind | kRemoteRead);
  auto other_pd = mrs_.Register(kPd + 1, buf_.data(), 64, Base(), kLocalWrite | kMwBind);
  auto zero_based = mrs_.Register(kPd, buf_.data(), 64, 0, kLocalWrite | kMwBind | kZeroBased);
  ASSERT_TRUE(no_bind.ok() && no_local_write.ok() && other_pd.ok() && zero_based.ok());
  uint32_t mw = Alloc(MwType::kType2);
  auto fails = [&](BindRequest r, const char* what) {
    Status s = mws_.Bind(r, mrs_);
    EXPECT_EQ(s.code(), EINVAL) << what;
    EXPECT_FALSE(s.message().empty()) << what;
  };
  BindRequest r = Request(mw, Next(mw), 0, 64, kRemoteRead);
  r.mr_lkey = (*no_bind)->lkey;
  fails(r, "no MW_BIND");
  r = Request(mw, Next(mw), 0, 64, kRemoteWrite);
  r.mr_lkey = (*no_local_write)->lkey;
  fails(r, "remote write without LOCAL_WRITE");
  r = Request(mw, Next(mw), 0, 64, kRemoteRead);
  r.mr_lkey = (*other_pd)->lkey;
  fails(r, "region of another PD");
  r = Request(mw, Next(mw), 0, 64, kRemoteRead);
  r.mr_lkey = (*zero_based)->lkey;
  r.addr = 0;
  fails(r, "zero-based region");
  r = Request(mw, Next(mw), 0, 64, kRemoteRead);
  r.qp_pd = kPd + 1;
  fails(r, "QP of another PD");
  fails(Request(mw, Next(mw), buf_.size() - 32, 64, kRemoteRead), "past the region");
  fails(Request(mw, Next(mw), 0, 0, kRemoteRead), "type 2 with length 0");
  fails(Request(mw, Next(mw), 0, 64, kMwBind), "a region's right");
  fails(Request(mw, mr_->rkey, 0, 64, kRemoteRead), "another object's key");
  fails(Request(mw, Next(mw), 0, 64, kRemoteRead, /*verb=*/true), "type 2 through ibv_bind_mw");
  uint32_t one = Alloc(MwType::kType1);
  fails(Request(one, Next(one), 0, 64, kRemoteRead), "type 1 by a posted WR");
  fails(Request(one, Next(one), 0, 64, kRemoteRead | kZeroBased, true), "zero-based type 1");
  EXPECT_EQ(mws_.BoundTo(mr_->lkey), 0);
}

TEST_F(MwTableTest, Type2MustBeInvalidatedBeforeItIsBoundAgain) {
  uint32_t mw = Alloc(MwType::kType2);
  uint32_t k1 = Next(mw);
  ASSERT_TRUE(mws_.Bind(Request(mw, k1, 0, 64, kRemoteRead), mrs_).ok());
  EXPECT_EQ(mws_.Bind(Request(mw, Next(k1), 0, 64, kRemoteRead), mrs_).code(), EINVAL);
  EXPECT_EQ(mws_.Invalidate(mw, kPd, 0).code(), EINVAL) << "an old key";
  EXPECT_EQ(mws_.Invalidate(k1, kPd + 1, 0).code(), EINVAL) << "another PD";
  EXPECT_EQ(mws_.Invalidate(k1, kPd, kQpn + 1).code(), EINVAL) << "another QP (remote)";
  ASSERT_TRUE(mws_.Invalidate(k1, kPd, kQpn).ok());
  EXPECT_EQ(mws_.FindByRkey(k1), nullptr);
  EXPECT_EQ(mws_.Invalidate(k1, kPd, 0).code(), EINVAL) << "twice";
  ASSERT_TRUE(mws_.Bind(Request(mw, Next(k1), 0, 64, kRemoteRead), mrs_).ok());
  EXPECT_NE(mws_.FindByRkey(Next(k1)), nullptr);
  EXPECT_EQ(mws_.Invalidate(mr_->rkey, kPd, 0).code(), ENOENT) << "a region's key";
}

TEST_F(MwTableTest, Type1RebindsAndUnbindsButIsNeverInvalidated) {
  uint32_t mw = Alloc(MwType::kType1);
  uint32_t k1 = Next(mw);
  ASSERT_TRUE(mws_.Bind(Request(mw, k1, 0, 64, kRemoteRead, true), mrs_).ok());
  uint32_t k2 = Next(k1);
  ASSERT_TRUE(mws_.Bind(Request(mw, k2, 64, 64, kRemoteRead, true), mrs_).ok());
  EXPECT_EQ(mws_.FindByRkey(k1), nullptr);
  ASSERT_NE(mws_.FindByRkey(k2), nullptr);
  EXPECT_EQ(mws_.FindByRkey(k2)->bound_qpn, 0u) << "a type 1 window serves every QP of its PD";
  EXPECT_EQ(mws_.BoundTo(mr_->lkey), 1);
  EXPECT_EQ(mws_.Invalidate(k2, kPd, 0).code(), EINVAL);
  BindRequest unbind = Request(mw, Next(k2), 0, 0, 0, true);
  unbind.has_mr = false;
  unbind.addr = 0;
  ASSERT_TRUE(mws_.Bind(unbind, mrs_).ok());
  EXPECT_EQ(mws_.FindByRkey(Next(k2)), nullptr);
  EXPECT_EQ(mws_.BoundTo(mr_->lkey), 0);
}

TEST_F(MwTableTest, RegionWithABoundWindowCannotBeDeregistered) {
  uint32_t mw = Alloc(MwType::kType2);
  ASSERT_TRUE(mws_.Bind(Request(mw, Next(mw), 0, 64, kRemoteRead), mrs_).ok());
  EXPECT_EQ(mws_.BeginDeregister(mr_->lkey).code(), EBUSY);
  ASSERT_TRUE(mws_.Deallocate(mw).ok());
  ASSERT_TRUE(mws_.BeginDeregister(mr_->lkey).ok());
  // While it is being deregistered, no window binds to it.
  uint32_t again = Alloc(MwType::kType2);
  EXPECT_EQ(mws_.Bind(Request(again, Next(again), 0, 64, kRemoteRead), mrs_).code(), EINVAL);
  mws_.EndDeregister(mr_->lkey);
  EXPECT_TRUE(mws_.Bind(Request(again, Next(again), 0, 64, kRemoteRead), mrs_).ok());
}

}  // namespace
}  // namespace rdmaemu::objects
