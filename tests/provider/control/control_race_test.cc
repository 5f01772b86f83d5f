// Events raised by the control plane (`rdmaemu event`) on objects the
// application is destroying at that moment: never an event naming freed
// memory (ASan would see it), and none left queued once the object is gone
// (the directory drops the object before its queued events are discarded).
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "emulator/control/command.h"

namespace {

using namespace std::chrono_literals;

TEST(ControlRaceTest, EventsOnObjectsBeingDestroyed) {
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  ibv_context* ctx = ibv_open_device(list[0]);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  int flags = fcntl(ctx->async_fd, F_GETFL);
  fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);

  std::atomic<uint32_t> qpn{0}, cqn{0};
  std::atomic<bool> stop{false};
  std::atomic<int> raised{0};
  std::thread control([&] {
    while (!stop) {
      std::vector<std::string> qp_words = {"event", "qp_fatal", "--qp", std::to_string(qpn.load())};
      std::vector<std::string> cq_words = {"event", "cq_err", "--cq", std::to_string(cqn.load())};
      if (rdmaemu::control::Dispatch(qp_words).status == 0) ++raised;
      if (rdmaemu::control::Dispatch(cq_words).status == 0) ++raised;
    }
  });

  // CQ numbers count from 1 on this device, in creation order.
  uint32_t next_cq = 1;
  auto deadline = std::chrono::steady_clock::now() + 3s;
  int rounds = 0;
  while (std::chrono::steady_clock::now() < deadline || rounds < 50) {
    ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    cqn = next_cq++;
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap = {1, 1, 1, 1, 0};
    ibv_qp* qp = ibv_create_qp(pd, &a);
    ASSERT_NE(qp, nullptr);
    qpn = qp->qp_num;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    // Some events are read (and must be acked before destroy returns), the
    // rest stay queued and are discarded by the destroys.
    ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev) == 0) {
      if (ev.event_type == IBV_EVENT_QP_FATAL) {
        EXPECT_EQ(ev.element.qp, qp);
      } else {
        EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
        EXPECT_EQ(ev.element.cq, cq);
      }
      ibv_ack_async_event(&ev);
    }
    ASSERT_EQ(ibv_destroy_qp(qp), 0);
    ASSERT_EQ(ibv_destroy_cq(cq), 0);
    ++rounds;
  }
  stop = true;
  control.join();
  EXPECT_GT(raised.load(), 0) << "the control thread never hit a live object";
  // Every object is gone, and so is every event that named one.
  ibv_async_event ev;
  EXPECT_NE(ibv_get_async_event(ctx, &ev), 0) << "an event outlived its object: type " << ev.event_type;
  ASSERT_EQ(ibv_dealloc_pd(pd), 0);
  ASSERT_EQ(ibv_close_device(ctx), 0);
  ibv_free_device_list(list);
}

}  // namespace
