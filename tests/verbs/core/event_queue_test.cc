// Tests of EventQueue, the queue behind a completion channel fd and a
// context's async_fd: the semantics of the kernel's uverbs event files.
#include "verbs/core/event_queue.h"

#include <fcntl.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace rdmaemu::verbs {
namespace {

using namespace std::chrono_literals;

ibv_async_event Port(int n) {
  ibv_async_event e{};
  e.event_type = IBV_EVENT_PORT_ACTIVE;
  e.element.port_num = n;
  return e;
}

ibv_async_event CqEvent(const void* cq) {
  ibv_async_event e{};
  e.event_type = IBV_EVENT_CQ_ERR;
  e.element.cq = const_cast<ibv_cq*>(static_cast<const ibv_cq*>(cq));
  return e;
}

bool Readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  int n = ::poll(&p, 1, timeout_ms);
  return n == 1 && (p.revents & POLLIN);
}

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  ASSERT_GE(flags, 0);
  ASSERT_EQ(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0);
}

// Counts what the fd holds by draining it with non-blocking reads, then
// puts the counts back.
uint64_t FdCounter(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  uint64_t n = 0, v;
  while (::read(fd, &v, sizeof v) == sizeof v) ++n;
  uint64_t back = n;
  if (back > 0) (void)!::write(fd, &back, sizeof back);
  ::fcntl(fd, F_SETFL, flags);
  return n;
}

class EventQueueTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(q_.Open().ok()); }
  EventQueue q_;
};

TEST_F(EventQueueTest, FdIsACloseOnExecEventfd) {
  ASSERT_GE(q_.fd(), 0);
  EXPECT_TRUE(::fcntl(q_.fd(), F_GETFD) & FD_CLOEXEC);
  EXPECT_FALSE(::fcntl(q_.fd(), F_GETFL) & O_NONBLOCK) << "blocking until the app says otherwise";
  EXPECT_FALSE(Readable(q_.fd()));
}

TEST_F(EventQueueTest, EventsComeOutInOrderOnePerGet) {
  q_.Push(Port(1), nullptr);
  q_.Push(Port(2), nullptr);
  q_.Push(Port(3), nullptr);
  EXPECT_EQ(q_.size(), 3u);
  EXPECT_EQ(FdCounter(q_.fd()), 3u);
  for (int i = 1; i <= 3; ++i) {
    ibv_async_event e{};
    ASSERT_EQ(q_.Get(&e), 0);
    EXPECT_EQ(e.event_type, IBV_EVENT_PORT_ACTIVE);
    EXPECT_EQ(e.element.port_num, i);
    EXPECT_EQ(q_.size(), static_cast<size_t>(3 - i));
    EXPECT_EQ(FdCounter(q_.fd()), static_cast<uint64_t>(3 - i));
  }
}

TEST_F(EventQueueTest, BlockingGetWaitsUntilPush) {
  std::atomic<bool> got{false};
  ibv_async_event e{};
  std::thread reader([&] {
    EXPECT_EQ(q_.Get(&e), 0);
    got = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(got) << "Get returned with nothing queued";
  q_.Push(Port(7), nullptr);
  reader.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(e.element.port_num, 7);
}

TEST_F(EventQueueTest, NonBlockingGetOnEmptyQueueIsEagain) {
  SetNonBlocking(q_.fd());
  ibv_async_event e{};
  errno = 0;
  EXPECT_EQ(q_.Get(&e), -1);
  EXPECT_EQ(errno, EAGAIN);
  q_.Push(Port(1), nullptr);
  EXPECT_EQ(q_.Get(&e), 0);
  errno = 0;
  EXPECT_EQ(q_.Get(&e), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(EventQueueTest, PollReportsPollinExactlyWhileEventsAreQueued) {
  EXPECT_FALSE(Readable(q_.fd()));
  q_.Push(Port(1), nullptr);
  EXPECT_TRUE(Readable(q_.fd()));
  q_.Push(Port(2), nullptr);
  EXPECT_TRUE(Readable(q_.fd()));
  ibv_async_event e{};
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_TRUE(Readable(q_.fd())) << "one event is still queued";
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_FALSE(Readable(q_.fd()));
}

TEST_F(EventQueueTest, PollWakesOnPushFromAnotherThread) {
  std::thread pusher([&] {
    std::this_thread::sleep_for(50ms);
    q_.Push(Port(1), nullptr);
  });
  EXPECT_TRUE(Readable(q_.fd(), 5000));
  pusher.join();
}

TEST_F(EventQueueTest, NThreadsNEventsEachGetsExactlyOne) {
  constexpr int kThreads = 8;
  std::mutex mu;
  std::vector<int> got;
  std::vector<std::thread> readers;
  for (int i = 0; i < kThreads; ++i) {
    readers.emplace_back([&] {
      ibv_async_event e{};
      ASSERT_EQ(q_.Get(&e), 0);
      std::lock_guard lock(mu);
      got.push_back(e.element.port_num);
    });
  }
  std::this_thread::sleep_for(50ms);  // let them block
  for (int i = 0; i < kThreads; ++i) q_.Push(Port(i + 1), nullptr);
  for (auto& t : readers) t.join();
  std::set<int> distinct(got.begin(), got.end());
  EXPECT_EQ(got.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads)) << "an event was delivered twice";
  EXPECT_EQ(q_.size(), 0u);
  EXPECT_FALSE(Readable(q_.fd()));
}

TEST_F(EventQueueTest, DiscardRemovesOnlyThatObjectsEventsAndFixesTheCounter) {
  int a = 0, b = 0;
  q_.Push(CqEvent(&a), &a);
  q_.Push(CqEvent(&b), &b);
  q_.Push(Port(1), nullptr);
  q_.Push(CqEvent(&a), &a);
  q_.Push(CqEvent(&b), &b);
  ASSERT_EQ(q_.size(), 5u);

  EXPECT_EQ(q_.Discard(&a), 0u) << "nothing of a was taken yet";
  EXPECT_EQ(q_.size(), 3u);
  EXPECT_EQ(FdCounter(q_.fd()), 3u) << "the fd counter equals the queue size";
  EXPECT_TRUE(Readable(q_.fd()));

  SetNonBlocking(q_.fd());
  ibv_async_event e{};
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.cq, reinterpret_cast<ibv_cq*>(&b));
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.event_type, IBV_EVENT_PORT_ACTIVE);
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.cq, reinterpret_cast<ibv_cq*>(&b));
  errno = 0;
  EXPECT_EQ(q_.Get(&e), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_FALSE(Readable(q_.fd()));
}

TEST_F(EventQueueTest, DiscardOnABlockingFdDoesNotBlockAndKeepsItBlocking) {
  int a = 0;
  q_.Push(CqEvent(&a), &a);
  q_.Push(CqEvent(&a), &a);
  EXPECT_EQ(q_.Discard(&a), 0u);
  EXPECT_EQ(q_.size(), 0u);
  EXPECT_FALSE(Readable(q_.fd()));
  EXPECT_FALSE(::fcntl(q_.fd(), F_GETFL) & O_NONBLOCK) << "the app's blocking mode is restored";
  // The app's non-blocking mode is kept too.
  SetNonBlocking(q_.fd());
  q_.Push(CqEvent(&a), &a);
  q_.Discard(&a);
  EXPECT_TRUE(::fcntl(q_.fd(), F_GETFL) & O_NONBLOCK);
}

TEST_F(EventQueueTest, DiscardReturnsTheCountTheApplicationTook) {
  int a = 0, b = 0;
  for (int i = 0; i < 3; ++i) q_.Push(CqEvent(&a), &a);
  q_.Push(CqEvent(&b), &b);
  q_.Push(Port(1), nullptr);
  ibv_async_event e{};
  ASSERT_EQ(q_.Get(&e), 0);  // a
  ASSERT_EQ(q_.Get(&e), 0);  // a
  q_.Push(CqEvent(&a), &a);
  EXPECT_EQ(q_.Discard(&a), 2u) << "taken, not generated: 2 of 4";
  EXPECT_EQ(q_.size(), 2u);
  EXPECT_EQ(FdCounter(q_.fd()), 2u);
  EXPECT_EQ(q_.Discard(&a), 0u) << "the count is forgotten with the object";
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.cq, reinterpret_cast<ibv_cq*>(&b));
  EXPECT_EQ(q_.Discard(&b), 1u);
  EXPECT_EQ(q_.Discard(nullptr), 0u) << "port events are never counted";
}

TEST_F(EventQueueTest, EveryEventIsTakenOrDiscardedNeverBoth) {
  // A blocking reader races with push+discard of one object's events. Each
  // event is either taken by the reader (and counted as reported) or
  // discarded, the reader never fails or returns garbage, and at the end the
  // fd counter is back to the queue size (0).
  int a = 0;
  std::atomic<uint32_t> taken{0};
  std::atomic<bool> reader_failed{false};
  std::thread reader([&] {
    for (;;) {
      ibv_async_event e{};
      if (q_.Get(&e) != 0) {
        reader_failed = true;
        ADD_FAILURE() << "blocking Get failed: " << std::strerror(errno);
        return;
      }
      if (e.event_type == IBV_EVENT_PORT_ACTIVE) return;  // stop marker
      ASSERT_EQ(e.element.cq, reinterpret_cast<ibv_cq*>(&a));
      ++taken;
    }
  });
  uint32_t reported = 0;
  for (int i = 0; i < 2000 && !reader_failed; ++i) {
    q_.Push(CqEvent(&a), &a);
    if (i % 3 == 0) std::this_thread::yield();
    reported += q_.Discard(&a);
  }
  q_.Push(Port(1), nullptr);
  reader.join();
  reported += q_.Discard(&a);
  EXPECT_EQ(reported, taken.load()) << "reported must count exactly the events the reader took";
  EXPECT_EQ(q_.size(), 0u);
  EXPECT_EQ(FdCounter(q_.fd()), 0u);
}

TEST_F(EventQueueTest, ReaderHoldingACountWaitsAgainDeterministically) {
  // Deterministic form: take the count ourselves with read(), as a woken
  // reader has, discard the event, give the count back the way Get would
  // consume it: Get must then block until a new event arrives.
  int a = 0;
  q_.Push(CqEvent(&a), &a);
  uint64_t v;
  ASSERT_EQ(::read(q_.fd(), &v, sizeof v), static_cast<ssize_t>(sizeof v));  // a reader's count
  EXPECT_EQ(q_.Discard(&a), 0u);  // takes back nothing: the count is held
  EXPECT_EQ(q_.size(), 0u);
  EXPECT_EQ(FdCounter(q_.fd()), 0u);
  // Hand the held count back as a stray wake-up: Get consumes it, finds the
  // queue empty and must wait again instead of returning garbage.
  uint64_t one = 1;
  ASSERT_EQ(::write(q_.fd(), &one, sizeof one), static_cast<ssize_t>(sizeof one));
  std::atomic<bool> got{false};
  ibv_async_event e{};
  std::thread reader([&] {
    EXPECT_EQ(q_.Get(&e), 0);
    got = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(got) << "Get returned although its event was discarded";
  q_.Push(Port(9), nullptr);
  reader.join();
  EXPECT_EQ(e.element.port_num, 9);
}

TEST_F(EventQueueTest, ANewEventDoesNotInheritADiscardedEventsCount) {
  // The race CI once caught: a reader holds E1's count, a destroy discards
  // E1 (its take-back finds nothing), E2 arrives, then the reader locks.
  // The reader must pay the discarded count and take E2 with E2's own
  // count, leaving the fd at 0 with the queue empty.
  int a = 0, b = 0;
  q_.Push(CqEvent(&a), &a);
  uint64_t v;
  ASSERT_EQ(::read(q_.fd(), &v, sizeof v), static_cast<ssize_t>(sizeof v));  // the reader's count
  EXPECT_EQ(q_.Discard(&a), 0u);
  q_.Push(CqEvent(&b), &b);
  uint64_t one = 1;  // the reader, back from read(), now takes the lock in Get
  ASSERT_EQ(::write(q_.fd(), &one, sizeof one), static_cast<ssize_t>(sizeof one));
  ibv_async_event e{};
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.cq, reinterpret_cast<ibv_cq*>(&b));
  EXPECT_EQ(q_.size(), 0u);
  EXPECT_EQ(FdCounter(q_.fd()), 0u) << "a count left with nothing queued: poll would lie";
}

TEST_F(EventQueueTest, ReportedCountsEventsTakenFromManyThreads) {
  constexpr int kEvents = 400;
  int a = 0;
  std::atomic<int> taken{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      ibv_async_event e{};
      while (q_.Get(&e) == 0) {
        if (e.event_type == IBV_EVENT_PORT_ERR) return;  // stop marker
        ++taken;
      }
    });
  }
  for (int i = 0; i < kEvents; ++i) q_.Push(CqEvent(&a), &a);
  while (taken < kEvents) std::this_thread::sleep_for(1ms);
  for (int t = 0; t < 4; ++t) {
    ibv_async_event stop{};
    stop.event_type = IBV_EVENT_PORT_ERR;
    q_.Push(stop, nullptr);
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(taken, kEvents);
  EXPECT_EQ(q_.Discard(&a), static_cast<uint32_t>(kEvents));
}

// A thread that waits for an event defers the counts of the events it
// queues itself: its Get takes one with no count in the fd, and the rest
// are signalled then, so the fd's counter still equals the queue.
TEST_F(EventQueueTest, DeferredEventIsTakenWithoutItsCountAndTheRestAreSignalled) {
  int a = 0;
  q_.Push(CqEvent(&a), &a);  // signalled, before the deferring scope
  {
    EventQueue::DeferSignals defer(q_);
    q_.Push(Port(1), nullptr);
    q_.Push(Port(2), nullptr);
    EXPECT_EQ(FdCounter(q_.fd()), 1u);  // only the first is in the fd
    EXPECT_EQ(q_.size(), 3u);
  }
  ibv_async_event e{};
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.cq, CqEvent(&a).element.cq);  // the oldest, as always
  EXPECT_EQ(q_.Reported(&a), 1u);
  // Two events left, and now both counts are in the fd.
  EXPECT_EQ(FdCounter(q_.fd()), 2u);
  SetNonBlocking(q_.fd());
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.port_num, 1);
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.port_num, 2);
  EXPECT_EQ(q_.Get(&e), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_FALSE(Readable(q_.fd()));
}

TEST_F(EventQueueTest, DeferringOneQueueSignalsAnotherAsUsual) {
  EventQueue other;
  ASSERT_TRUE(other.Open().ok());
  EventQueue::DeferSignals defer(q_);
  other.Push(Port(1), nullptr);
  EXPECT_TRUE(Readable(other.fd()));
  q_.Push(Port(2), nullptr);
  EXPECT_FALSE(Readable(q_.fd()));
}

TEST_F(EventQueueTest, DiscardOfADeferredEventLeavesTheCounterRight) {
  int a = 0, b = 0;
  {
    EventQueue::DeferSignals defer(q_);
    q_.Push(CqEvent(&a), &a);
    q_.Push(CqEvent(&b), &b);
  }
  EXPECT_EQ(q_.Discard(&a), 0u);
  EXPECT_EQ(q_.size(), 1u);
  ibv_async_event e{};
  ASSERT_EQ(q_.Get(&e), 0);
  EXPECT_EQ(e.element.cq, CqEvent(&b).element.cq);
  EXPECT_EQ(FdCounter(q_.fd()), 0u);
  EXPECT_FALSE(Readable(q_.fd()));
}

}  // namespace
}  // namespace rdmaemu::verbs
