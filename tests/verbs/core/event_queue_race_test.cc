// A blocking ibv_get_cq_event / ibv_get_async_event must never fail with
// EAGAIN while another thread discards events (destroying a CQ or QP): the
// discard takes its counts back without touching the fd's flags.
#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "verbs/core/event_queue.h"

namespace rdmaemu::verbs {
namespace {

TEST(EventQueueRaceTest, BlockingGetNeverFailsWithEagainWhileAnotherThreadDiscards) {
  EventQueue q;
  ASSERT_TRUE(q.Open().ok());
  ASSERT_FALSE(::fcntl(q.fd(), F_GETFL) & O_NONBLOCK);
  int a = 0;
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_CQ_ERR;
  ev.element.cq = reinterpret_cast<ibv_cq*>(&a);
  std::atomic<bool> stop{false};
  std::atomic<int> eagain{0};
  std::atomic<long> gets{0};
  std::thread reader([&] {
    ibv_async_event got{};
    while (!stop) {
      if (q.Get(&got) != 0) {
        if (errno == EAGAIN) ++eagain;
        continue;
      }
      ++gets;
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline && eagain == 0) {
    for (int i = 0; i < 1000; ++i) {
      q.Push(ev, &a);
      q.Discard(&a);
    }
  }
  stop = true;
  ibv_async_event wake{};
  wake.event_type = IBV_EVENT_PORT_ACTIVE;
  q.Push(wake, nullptr);  // unblock the reader
  reader.join();
  EXPECT_EQ(eagain, 0) << "a blocking Get returned EAGAIN (" << gets << " events taken)";
}

}  // namespace
}  // namespace rdmaemu::verbs
