#include "emulator/wire/psn.h"

#include <gtest/gtest.h>

namespace rdmaemu::wire {
namespace {

TEST(Psn, AddWrapsAt2To24) {
  EXPECT_EQ(PsnAdd(0xfffffe, 1), 0xffffffu);
  EXPECT_EQ(PsnAdd(0xffffff, 1), 0u);
  EXPECT_EQ(PsnAdd(0xfffff0, 0x20), 0x10u);
  EXPECT_EQ(PsnNext(0xffffff), 0u);
  EXPECT_EQ(PsnAdd(5, -6), 0xffffffu);
  EXPECT_EQ(PsnAdd(0, int64_t{1} << 24), 0u);
}

TEST(Psn, MaskKeepsLow24Bits) {
  EXPECT_EQ(PsnMask(0xff123456), 0x123456u);
  EXPECT_EQ(PsnMask(0x01000000), 0u);
}

TEST(Psn, DiffIsTheSignedDistanceAcrossTheWrap) {
  EXPECT_EQ(PsnDiff(10, 3), 7);
  EXPECT_EQ(PsnDiff(3, 10), -7);
  EXPECT_EQ(PsnDiff(2, 0xfffffe), 4);
  EXPECT_EQ(PsnDiff(0xfffffe, 2), -4);
  EXPECT_EQ(PsnDiff(123, 123), 0);
}

TEST(Psn, DiffRangeIsMinus2To23ExclusiveTo2To23Inclusive) {
  const uint32_t base = 0xfff000;
  EXPECT_EQ(PsnDiff(PsnAdd(base, 0x7fffff), base), 0x7fffff);
  EXPECT_EQ(PsnDiff(PsnAdd(base, 0x800000), base), 0x800000);   // exactly half: positive
  EXPECT_EQ(PsnDiff(PsnAdd(base, 0x800001), base), -0x7fffff);  // past half: behind
  EXPECT_EQ(PsnDiff(base, PsnAdd(base, 0x800000)), 0x800000);   // and from the other side
}

TEST(Psn, DiffInvertsAddForEveryDistanceInRange) {
  for (uint32_t base : {0u, 1u, 0x7fffffu, 0x800000u, 0xfffff0u, 0xffffffu}) {
    for (int64_t k = -0x7fffff; k <= 0x800000; k += 0x1fff) {
      EXPECT_EQ(PsnDiff(PsnAdd(base, k), base), k) << base << " " << k;
    }
  }
}

TEST(Psn, BeforeAndAfterFollowTheWrap) {
  EXPECT_TRUE(PsnBefore(0xffffff, 0));
  EXPECT_TRUE(PsnAfter(0, 0xffffff));
  EXPECT_TRUE(PsnBefore(5, 6));
  EXPECT_FALSE(PsnBefore(6, 6));
  EXPECT_FALSE(PsnAfter(6, 6));
  EXPECT_TRUE(PsnAfter(0x100, 0xffff00));
  EXPECT_FALSE(PsnBefore(0x100, 0xffff00));
}

}  // namespace
}  // namespace rdmaemu::wire
