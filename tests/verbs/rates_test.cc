// Rate conversions: rdma-core 44's tables, round trips, and the installed
// library's answers for every input we can think of.

#include <infiniband/verbs.h>

#include <vector>

#include "gtest/gtest.h"
#include "tests/verbs/real_libibverbs.h"
#include "verbs/abi/exports.h"

namespace {

struct Row {
  ibv_rate rate;
  int mult;
  int mbps;
};

// Straight from the verbs.h names, and rdma-core's signalling-rate Mb/s.
const Row kRows[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},     {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},     {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},    {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},  {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},    {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},  {IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},  {IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},  {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},    {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500}, {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

TEST(Rates, Tables) {
  for (const Row& row : kRows) {
    EXPECT_EQ(ibv_rate_to_mult(row.rate), row.mult) << "rate " << row.rate;
    EXPECT_EQ(ibv_rate_to_mbps(row.rate), row.mbps) << "rate " << row.rate;
  }
}

TEST(Rates, RoundTrips) {
  for (const Row& row : kRows) {
    EXPECT_EQ(mbps_to_ibv_rate(ibv_rate_to_mbps(row.rate)), row.rate) << "rate " << row.rate;
    if (row.mult > 0) {
      EXPECT_EQ(mult_to_ibv_rate(ibv_rate_to_mult(row.rate)), row.rate) << "rate " << row.rate;
      EXPECT_EQ(ibv_rate_to_mult(mult_to_ibv_rate(row.mult)), row.mult);
    }
    EXPECT_EQ(ibv_rate_to_mbps(mbps_to_ibv_rate(row.mbps)), row.mbps);
  }
}

TEST(Rates, UnknownValues) {
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_MAX), -1);
  EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_MAX), -1);
  EXPECT_EQ(ibv_rate_to_mult(static_cast<ibv_rate>(1)), -1);
  EXPECT_EQ(ibv_rate_to_mbps(static_cast<ibv_rate>(25)), -1);
  EXPECT_EQ(ibv_rate_to_mbps(static_cast<ibv_rate>(-1)), -1);
  EXPECT_EQ(mult_to_ibv_rate(0), IBV_RATE_MAX);
  EXPECT_EQ(mult_to_ibv_rate(3), IBV_RATE_MAX);
  EXPECT_EQ(mult_to_ibv_rate(-1), IBV_RATE_MAX);
  EXPECT_EQ(mbps_to_ibv_rate(0), IBV_RATE_MAX);
  EXPECT_EQ(mbps_to_ibv_rate(25000), IBV_RATE_MAX);  // 25G is 25781 (64b/66b)
  EXPECT_EQ(mbps_to_ibv_rate(-1), IBV_RATE_MAX);
}

TEST(Rates, SameAsInstalledRdmaCore) {
  auto real_to_mult = REAL_SYMBOL(ibv_rate_to_mult);
  auto real_to_mbps = REAL_SYMBOL(ibv_rate_to_mbps);
  auto real_from_mult = REAL_SYMBOL(mult_to_ibv_rate);
  auto real_from_mbps = REAL_SYMBOL(mbps_to_ibv_rate);
  if (!real_to_mult || !real_to_mbps || !real_from_mult || !real_from_mbps)
    GTEST_SKIP() << rdmaemu::testing::kRealLibibverbs << " is not installed";
  for (int v = -2; v <= 40; ++v) {
    EXPECT_EQ(ibv_rate_to_mult(static_cast<ibv_rate>(v)), real_to_mult(static_cast<ibv_rate>(v)))
        << v;
    EXPECT_EQ(ibv_rate_to_mbps(static_cast<ibv_rate>(v)), real_to_mbps(static_cast<ibv_rate>(v)))
        << v;
  }
  for (int m = -2; m <= 1000; ++m) EXPECT_EQ(mult_to_ibv_rate(m), real_from_mult(m)) << m;
  std::vector<int> mbps = {-1, 0, 1, 2499, 2501, 14063, 25000, 50000, 100000, 200000, 400000};
  for (const Row& row : kRows) mbps.push_back(row.mbps);
  for (int v : mbps) EXPECT_EQ(mbps_to_ibv_rate(v), real_from_mbps(v)) << v;
}

}  // namespace
