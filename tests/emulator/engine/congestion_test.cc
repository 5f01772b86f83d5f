// The requester's congestion window (emulator/engine/congestion.h).
#include "emulator/engine/congestion.h"

#include <gtest/gtest.h>

namespace rdmaemu::engine {
namespace {

TEST(CongestionWindowTest, StartsFullAndAcksDoNotGrowItPastTheMaximum) {
  CongestionWindow w;
  EXPECT_EQ(w.size(), CongestionWindow::kMax);
  w.OnAck(1000);
  EXPECT_EQ(w.size(), CongestionWindow::kMax);
}

TEST(CongestionWindowTest, TimeoutShrinksToOneAndHalvesTheThreshold) {
  CongestionWindow w;
  w.OnTimeout(100);
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.threshold(), 50u);
  // A timeout with less in flight than the window halves what was in flight.
  w.OnAck(20);
  w.OnTimeout(7);
  EXPECT_EQ(w.threshold(), 3u);
  // Never below two, so slow start always has a step.
  w.OnTimeout(1);
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.threshold(), 2u);
}

TEST(CongestionWindowTest, SlowStartBelowTheThresholdThenOnePerWindow) {
  CongestionWindow w;
  w.OnTimeout(16);  // threshold 8
  w.OnAck(1);
  EXPECT_EQ(w.size(), 2u);
  w.OnAck(2);
  EXPECT_EQ(w.size(), 4u);
  w.OnAck(4);
  EXPECT_EQ(w.size(), 8u);
  // At the threshold: 8 acknowledged PSNs open one more.
  w.OnAck(7);
  EXPECT_EQ(w.size(), 8u);
  w.OnAck(1);
  EXPECT_EQ(w.size(), 9u);
  w.OnAck(9);
  EXPECT_EQ(w.size(), 10u);
}

TEST(CongestionWindowTest, ResetGivesANewQpsWindow) {
  CongestionWindow w;
  w.OnTimeout(64);
  w.Reset();
  EXPECT_EQ(w.size(), CongestionWindow::kMax);
  EXPECT_EQ(w.threshold(), CongestionWindow::kMax);
}

}  // namespace
}  // namespace rdmaemu::engine
