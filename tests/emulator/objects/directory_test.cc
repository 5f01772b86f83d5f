// The object directory: numbering, lookups, and that Remove waits for a
// With() in progress (the control plane's guarantee against use-after-free).
#include "emulator/objects/directory.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace rdmaemu::objects {
namespace {

TEST(DirectoryTest, NumbersCountFromOnePerKind) {
  Directory d;
  EXPECT_EQ(*d.Add(ObjectKind::kCq, 100), 1u);
  EXPECT_EQ(*d.Add(ObjectKind::kCq, 101), 2u);
  EXPECT_EQ(*d.Add(ObjectKind::kSrq, 200), 1u);
  d.Remove(ObjectKind::kCq, 1);
  // Numbers are not reused at once: an event aimed at an old CQ must not
  // hit a new one.
  EXPECT_EQ(*d.Add(ObjectKind::kCq, 102), 3u);
}

TEST(DirectoryTest, QpsKeepTheirQpn) {
  Directory d;
  EXPECT_EQ(*d.Add(ObjectKind::kQp, 1, {}, 0x11), 0x11u);
  auto again = d.Add(ObjectKind::kQp, 2, {}, 0x11);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), EEXIST);
}

TEST(DirectoryTest, WithFindsTheHandleOrSaysNoSuchObject) {
  Directory d;
  uint32_t n = *d.Add(ObjectKind::kSrq, 0xabc);
  uint64_t seen = 0;
  EXPECT_TRUE(d.With(ObjectKind::kSrq, n, [&](uint64_t h) { seen = h; }).ok());
  EXPECT_EQ(seen, 0xabcu);
  Status missing = d.With(ObjectKind::kCq, n, [](uint64_t) { FAIL(); });
  EXPECT_EQ(missing.code(), ENOENT);
  EXPECT_EQ(missing.message(), "no cq 1");
  d.Remove(ObjectKind::kSrq, n);
  EXPECT_EQ(d.With(ObjectKind::kSrq, n, [](uint64_t) { FAIL(); }).code(), ENOENT);
}

TEST(DirectoryTest, ListIsByKindThenNumberWithDetails) {
  Directory d;
  ASSERT_TRUE(d.Add(ObjectKind::kCq, 1).ok());
  ASSERT_TRUE(d.Add(ObjectKind::kQp, 2, [] { return std::string("RC RTS"); }, 0x20).ok());
  ASSERT_TRUE(d.Add(ObjectKind::kQp, 3, [] { return std::string("UD INIT"); }, 0x12).ok());
  ASSERT_TRUE(d.Add(ObjectKind::kWq, 4).ok());
  auto list = d.List();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].kind, ObjectKind::kQp);
  EXPECT_EQ(list[0].number, 0x12u);
  EXPECT_EQ(list[0].details, "UD INIT");
  EXPECT_EQ(list[1].number, 0x20u);
  EXPECT_EQ(list[2].kind, ObjectKind::kCq);
  EXPECT_EQ(list[3].kind, ObjectKind::kWq);
  EXPECT_EQ(ToString(ObjectKind::kWq), "wq");
}

TEST(DirectoryTest, RemoveWaitsForAWithInProgress) {
  Directory d;
  uint32_t n = *d.Add(ObjectKind::kCq, 7);
  std::atomic<bool> inside{false}, finished{false};
  std::thread user([&] {
    Status s = d.With(ObjectKind::kCq, n, [&](uint64_t) {
      inside = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      finished = true;
    });
    EXPECT_TRUE(s.ok());
  });
  while (!inside) std::this_thread::yield();
  d.Remove(ObjectKind::kCq, n);
  EXPECT_TRUE(finished.load()) << "Remove returned while the object was still in use";
  user.join();
}

}  // namespace
}  // namespace rdmaemu::objects
