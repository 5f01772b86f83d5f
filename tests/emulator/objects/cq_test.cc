// Tests of the CQ ring: order, overrun, one-shot arming, resize.
#include "emulator/objects/cq.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace rdmaemu::objects {
namespace {

Cqe Make(uint64_t wr_id, bool solicited = false, WcStatus status = WcStatus::kSuccess) {
  Cqe c;
  c.wr_id = wr_id;
  c.solicited = solicited;
  c.status = status;
  c.byte_len = static_cast<uint32_t>(wr_id * 3);
  return c;
}

class CqTest : public ::testing::Test {
 protected:
  std::atomic<int> notified_{0};
  Cq::Notifier Count() {
    return [this] { ++notified_; };
  }
};

TEST_F(CqTest, PollReturnsCqesInPushOrder) {
  Cq cq(8, Count());
  EXPECT_EQ(cq.capacity(), 8u);
  for (uint64_t i = 1; i <= 5; ++i) ASSERT_TRUE(cq.Push(Make(i)));
  EXPECT_EQ(cq.depth(), 5u);
  Cqe out[8];
  EXPECT_EQ(cq.Poll(2, out), 2);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[1].wr_id, 2u);
  EXPECT_EQ(out[1].byte_len, 6u);
  EXPECT_EQ(cq.Poll(8, out), 3);
  EXPECT_EQ(out[0].wr_id, 3u);
  EXPECT_EQ(out[2].wr_id, 5u);
  EXPECT_EQ(cq.Poll(8, out), 0);
  EXPECT_EQ(cq.depth(), 0u);
  EXPECT_EQ(notified_, 0) << "no notification without arming";
}

uint64_t Now(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

// A CQE is stamped as it is pushed (produced), with the clocks the CQ was
// made to stamp with, whatever the producer put there; never as polled.
TEST_F(CqTest, PushStampsTheClocksTheCqWasMadeFor) {
  Cq plain(4, nullptr);
  Cq both(4, nullptr, 0, kStampCoreClock | kStampWallclock);
  Cq wall(4, nullptr, 0, kStampWallclock);
  Cqe c = Make(1);
  c.timestamp = c.wallclock_ns = 42;  // the producer's values do not count
  const uint64_t mono0 = Now(CLOCK_MONOTONIC), real0 = Now(CLOCK_REALTIME);
  ASSERT_TRUE(plain.Push(c));
  ASSERT_TRUE(both.Push(c));
  ASSERT_TRUE(wall.Push(c));
  const uint64_t mono1 = Now(CLOCK_MONOTONIC), real1 = Now(CLOCK_REALTIME);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Cqe out;
  ASSERT_EQ(plain.Poll(1, &out), 1);
  EXPECT_EQ(out.timestamp, 0u);
  EXPECT_EQ(out.wallclock_ns, 0u);
  ASSERT_EQ(both.Poll(1, &out), 1);
  EXPECT_GE(out.timestamp, mono0);
  EXPECT_LE(out.timestamp, mono1) << "stamped when pushed, not when polled 20 ms later";
  EXPECT_GE(out.wallclock_ns, real0);
  EXPECT_LE(out.wallclock_ns, real1);
  ASSERT_EQ(wall.Poll(1, &out), 1);
  EXPECT_EQ(out.timestamp, 0u);
  EXPECT_GE(out.wallclock_ns, real0);
  EXPECT_LE(out.wallclock_ns, real1);
}

TEST_F(CqTest, OrderSurvivesWrappingTheRing) {
  Cq cq(4, nullptr);
  Cqe out[4];
  uint64_t next_push = 0, next_poll = 0;
  for (int round = 0; round < 50; ++round) {
    int n = 1 + round % 4;
    for (int i = 0; i < n; ++i) ASSERT_TRUE(cq.Push(Make(next_push++)));
    int got = cq.Poll(n, out);
    ASSERT_EQ(got, n);
    for (int i = 0; i < got; ++i) EXPECT_EQ(out[i].wr_id, next_poll++);
  }
  EXPECT_FALSE(cq.overrun());
}

TEST_F(CqTest, PeekLooksWithoutTakingAndPopTakes) {
  Cq cq(4, nullptr);
  Cqe c;
  EXPECT_FALSE(cq.Peek(&c));
  cq.Pop();  // empty: harmless
  EXPECT_EQ(cq.depth(), 0u);
  ASSERT_TRUE(cq.Push(Make(10)));
  ASSERT_TRUE(cq.Push(Make(11)));
  ASSERT_TRUE(cq.Peek(&c));
  EXPECT_EQ(c.wr_id, 10u);
  ASSERT_TRUE(cq.Peek(&c));
  EXPECT_EQ(c.wr_id, 10u);
  cq.Pop();
  ASSERT_TRUE(cq.Peek(&c));
  EXPECT_EQ(c.wr_id, 11u);
  cq.Pop();
  EXPECT_FALSE(cq.Peek(&c));
}

// ibv_end_poll after ibv_next_poll found the CQ empty: a completion that
// arrives in between was never seen, so it must stay for the next poll.
TEST_F(CqTest, PopTakesOnlyWhatPeekSaw) {
  Cq cq(4, nullptr);
  Cqe c;
  ASSERT_TRUE(cq.Push(Make(1)));
  ASSERT_TRUE(cq.Peek(&c));
  cq.Pop();                      // ibv_next_poll: takes 1 ...
  EXPECT_FALSE(cq.Peek(&c));     // ... and finds nothing more
  ASSERT_TRUE(cq.Push(Make(2)));  // the device completes meanwhile
  cq.Pop();                      // ibv_end_poll
  ASSERT_TRUE(cq.Peek(&c));
  EXPECT_EQ(c.wr_id, 2u);
}

// A QP reset by another thread during an extended-poll session: its CQE
// under the cursor goes, and the session's Pop does not take the next one.
TEST_F(CqTest, RemoveQpOfThePeekedCqeLeavesTheNextOneForThePoller) {
  Cq cq(4, nullptr);
  Cqe a = Make(1), b = Make(2);
  a.qp_num = 17;
  b.qp_num = 18;
  ASSERT_TRUE(cq.Push(a));
  ASSERT_TRUE(cq.Push(b));
  Cqe c;
  ASSERT_TRUE(cq.Peek(&c));
  EXPECT_EQ(c.wr_id, 1u);
  EXPECT_EQ(cq.RemoveQp(17), 1u);
  cq.Pop();
  ASSERT_TRUE(cq.Peek(&c));
  EXPECT_EQ(c.wr_id, 2u);
  EXPECT_EQ(cq.depth(), 1u);
}

TEST_F(CqTest, FullCqRefusesPushAndIsOverrun) {
  Cq cq(3, Count());
  cq.Arm(false);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(cq.Push(Make(i)));
  EXPECT_EQ(notified_, 1);
  EXPECT_FALSE(cq.overrun());
  cq.Arm(false);
  EXPECT_FALSE(cq.Push(Make(99)));
  EXPECT_TRUE(cq.overrun());
  EXPECT_EQ(notified_, 1) << "a lost CQE does not notify";
  EXPECT_EQ(cq.depth(), 3u);
  Cqe out[4];
  ASSERT_EQ(cq.Poll(4, out), 3);
  EXPECT_EQ(out[2].wr_id, 2u) << "the lost CQE did not overwrite the ring";
  // The CQ stays in error: nothing more is accepted.
  EXPECT_FALSE(cq.Push(Make(100)));
  EXPECT_TRUE(cq.overrun());
  EXPECT_EQ(cq.depth(), 0u);
}

TEST_F(CqTest, ArmNextCompletionNotifiesOnceForTheNextCqe) {
  Cq cq(16, Count());
  cq.Arm(false);
  ASSERT_TRUE(cq.Push(Make(1)));
  EXPECT_EQ(notified_, 1);
  ASSERT_TRUE(cq.Push(Make(2)));
  ASSERT_TRUE(cq.Push(Make(3, true)));
  EXPECT_EQ(notified_, 1) << "arming is one-shot";
  cq.Arm(false);
  ASSERT_TRUE(cq.Push(Make(4)));
  EXPECT_EQ(notified_, 2);
}

TEST_F(CqTest, CqesPushedBeforeArmingDoNotNotify) {
  Cq cq(16, Count());
  ASSERT_TRUE(cq.Push(Make(1)));
  ASSERT_TRUE(cq.Push(Make(2)));
  cq.Arm(false);
  EXPECT_EQ(notified_, 0) << "arming with CQEs present does not fire";
  Cqe out[4];
  EXPECT_EQ(cq.Poll(4, out), 2);
  EXPECT_EQ(notified_, 0);
  ASSERT_TRUE(cq.Push(Make(3)));
  EXPECT_EQ(notified_, 1);
}

TEST_F(CqTest, SolicitedArmIgnoresUnsolicitedSuccesses) {
  Cq cq(16, Count());
  cq.Arm(true);
  ASSERT_TRUE(cq.Push(Make(1)));
  ASSERT_TRUE(cq.Push(Make(2)));
  EXPECT_EQ(notified_, 0);
  ASSERT_TRUE(cq.Push(Make(3, /*solicited=*/true)));
  EXPECT_EQ(notified_, 1);
  ASSERT_TRUE(cq.Push(Make(4, true)));
  EXPECT_EQ(notified_, 1) << "one-shot";
}

TEST_F(CqTest, SolicitedArmFiresOnAnErrorCompletion) {
  Cq cq(16, Count());
  cq.Arm(true);
  ASSERT_TRUE(cq.Push(Make(1, false, WcStatus::kWrFlushErr)));
  EXPECT_EQ(notified_, 1);
  cq.Arm(true);
  ASSERT_TRUE(cq.Push(Make(2, false, WcStatus::kRemAccessErr)));
  EXPECT_EQ(notified_, 2);
}

TEST_F(CqTest, NextCompletionArmUpgradesASolicitedOneNeverTheReverse) {
  Cq cq(16, Count());
  cq.Arm(true);
  cq.Arm(false);
  ASSERT_TRUE(cq.Push(Make(1)));
  EXPECT_EQ(notified_, 1) << "solicited then next: any completion fires";

  cq.Arm(false);
  cq.Arm(true);
  ASSERT_TRUE(cq.Push(Make(2)));
  EXPECT_EQ(notified_, 2) << "next then solicited: still any completion";
}

TEST_F(CqTest, RearmingTwiceStillNotifiesOnce) {
  Cq cq(16, Count());
  cq.Arm(false);
  cq.Arm(false);
  ASSERT_TRUE(cq.Push(Make(1)));
  ASSERT_TRUE(cq.Push(Make(2)));
  EXPECT_EQ(notified_, 1);
}

TEST_F(CqTest, NotifierRunsWithoutTheLockAndSeesTheCqe) {
  // The notifier polls the CQ: it would deadlock if called under the CQ's
  // mutex, and must find the CQE that fired it.
  Cq* self = nullptr;
  std::vector<uint64_t> seen;
  Cq cq(4, [&] {
    Cqe out[4];
    int n = self->Poll(4, out);
    for (int i = 0; i < n; ++i) seen.push_back(out[i].wr_id);
    self->Arm(false);  // re-arm from inside the notifier
  });
  self = &cq;
  cq.Arm(false);
  ASSERT_TRUE(cq.Push(Make(7)));
  ASSERT_TRUE(cq.Push(Make(8)));
  EXPECT_EQ(seen, (std::vector<uint64_t>{7, 8}));
}

TEST_F(CqTest, ResizeKeepsQueuedEntriesInOrder) {
  Cq cq(4, nullptr);
  Cqe out[16];
  // Wrap the ring first so the copy must unwrap it.
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(cq.Push(Make(i)));
  ASSERT_EQ(cq.Poll(2, out), 2);
  for (uint64_t i = 3; i < 6; ++i) ASSERT_TRUE(cq.Push(Make(i)));
  EXPECT_EQ(cq.depth(), 4u);
  ASSERT_TRUE(cq.Resize(10).ok());
  EXPECT_EQ(cq.capacity(), 10u);
  EXPECT_EQ(cq.depth(), 4u);
  for (uint64_t i = 6; i < 12; ++i) ASSERT_TRUE(cq.Push(Make(i)));
  EXPECT_FALSE(cq.Push(Make(12))) << "the new capacity is 10";
  ASSERT_EQ(cq.Poll(16, out), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[i].wr_id, static_cast<uint64_t>(i + 2));
}

TEST_F(CqTest, ResizeRefusesShrinkingBelowDepth) {
  Cq cq(8, nullptr);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(cq.Push(Make(i)));
  Status s = cq.Resize(4);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_EQ(cq.capacity(), 8u) << "a refused resize changes nothing";
  EXPECT_EQ(cq.depth(), 5u);
  ASSERT_TRUE(cq.Resize(5).ok()) << "exactly the depth fits";
  EXPECT_EQ(cq.capacity(), 5u);
  EXPECT_FALSE(cq.Push(Make(5)));
  Cqe out[8];
  ASSERT_EQ(cq.Poll(8, out), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i].wr_id, static_cast<uint64_t>(i));
}

TEST_F(CqTest, ResizeKeepsTheArm) {
  Cq cq(4, Count());
  cq.Arm(false);
  ASSERT_TRUE(cq.Resize(8).ok());
  ASSERT_TRUE(cq.Push(Make(1)));
  EXPECT_EQ(notified_, 1);
}

TEST_F(CqTest, ConcurrentPushAndPollLoseNothing) {
  Cq cq(64, nullptr);
  constexpr uint64_t kCount = 20000;
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount;) {
      if (cq.Push(Make(i))) {
        ++i;
      } else {
        FAIL() << "overrun";  // the consumer keeps up because the producer waits below
        return;
      }
      while (cq.depth() >= 60) std::this_thread::yield();
    }
  });
  uint64_t expect = 0;
  Cqe out[16];
  while (expect < kCount) {
    int n = cq.Poll(16, out);
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i].wr_id, expect++);
    if (n == 0) std::this_thread::yield();
  }
  producer.join();
  EXPECT_FALSE(cq.overrun());
}

TEST_F(CqTest, RemoveQpTakesOnlyThatQpsCqesAndKeepsTheOrder) {
  Cq cq(4, Count());
  for (uint64_t i = 1; i <= 4; ++i) {
    Cqe c = Make(i);
    c.qp_num = (i % 2) ? 17 : 18;  // 1, 3 from qp 17; 2, 4 from qp 18
    ASSERT_TRUE(cq.Push(c));
  }
  Cqe out[4];
  ASSERT_EQ(cq.Poll(1, out), 1);  // the head moves: the ring is not at index 0
  EXPECT_EQ(cq.RemoveQp(17), 1u);
  EXPECT_EQ(cq.depth(), 2u);
  Cqe c = Make(5);
  c.qp_num = 17;
  ASSERT_TRUE(cq.Push(c));
  ASSERT_TRUE(cq.Push(Make(6))) << "the removed CQE's slot is free again";
  EXPECT_FALSE(cq.Push(Make(7)));
  ASSERT_EQ(cq.Poll(4, out), 4);
  EXPECT_EQ(out[0].wr_id, 2u);
  EXPECT_EQ(out[1].wr_id, 4u);
  EXPECT_EQ(out[2].wr_id, 5u);
  EXPECT_EQ(out[3].wr_id, 6u);
  EXPECT_EQ(cq.RemoveQp(17), 0u);
}

}  // namespace
}  // namespace rdmaemu::objects
