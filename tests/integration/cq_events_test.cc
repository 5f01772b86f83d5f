// Completion and async events through the public API. The test plays the
// device: it pushes a CQE into the provider's CQ ring (as the engine does
// when work completes) and raises async events on the provider's device.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "emulator/device/device.h"
#include "emulator/objects/cq.h"
#include "provider/objects.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdmaemu::objects::Cqe;
using rdmaemu::objects::WcOpcode;
using rdmaemu::objects::WcStatus;

bool Readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

Cqe MakeCqe(uint64_t wr_id) {
  Cqe c;
  c.wr_id = wr_id;
  c.status = WcStatus::kSuccess;
  c.opcode = WcOpcode::kRecv;
  c.byte_len = 1234;
  c.imm_data = 0xdeadbeef;
  c.qp_num = 0x11;
  c.src_qp = 0x22;
  c.wc_flags = rdmaemu::objects::kWcWithImm | rdmaemu::objects::kWcGrh;
  c.pkey_index = 0;
  c.slid = 0;
  c.sl = 3;
  return c;
}

// What the device does when work completes.
bool Complete(ibv_cq* cq, const Cqe& cqe) { return rdmaemu::provider::ToCq(cq)->cq->Push(cqe); }

void RaiseAsync(ibv_context* ctx, rdmaemu::device::AsyncEventType type, uint64_t handle, uint8_t port) {
  rdmaemu::provider::ToContext(ctx)->device->Raise(rdmaemu::device::AsyncEvent{type, handle, port});
}

class CqEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    list_ = ibv_get_device_list(nullptr);
    ASSERT_NE(list_, nullptr);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr);
    ch_ = ibv_create_comp_channel(ctx_);
    ASSERT_NE(ch_, nullptr);
    cq_ = ibv_create_cq(ctx_, 16, &tag_, ch_, 0);
    ASSERT_NE(cq_, nullptr);
  }
  void TearDown() override {
    if (cq_ != nullptr) {
      EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    }
    if (ch_ != nullptr) {
      EXPECT_EQ(ibv_destroy_comp_channel(ch_), 0);
    }
    if (ctx_ != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_ != nullptr) ibv_free_device_list(list_);
  }
  void SetNonBlocking(int fd) {
    int flags = ::fcntl(fd, F_GETFL);
    ASSERT_EQ(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0);
  }
  int tag_ = 0;
  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq* cq_ = nullptr;
};

TEST_F(CqEventsTest, ArmedCqDeliversOneEventToItsChannel) {
  EXPECT_FALSE(Readable(ch_->fd));
  ASSERT_TRUE(Complete(cq_, MakeCqe(1))) << "not armed yet";
  EXPECT_FALSE(Readable(ch_->fd)) << "no event without ibv_req_notify_cq";
  ibv_wc wc;
  ASSERT_EQ(ibv_poll_cq(cq_, 1, &wc), 1);

  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(2)));
  EXPECT_TRUE(Readable(ch_->fd));
  ASSERT_TRUE(Complete(cq_, MakeCqe(3)));

  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq_);
  EXPECT_EQ(ev_ctx, &tag_);
  EXPECT_FALSE(Readable(ch_->fd)) << "one-shot: one event for two completions";
  ibv_ack_cq_events(cq_, 1);
  ibv_wc wcs[4];
  EXPECT_EQ(ibv_poll_cq(cq_, 4, wcs), 2);
}

TEST_F(CqEventsTest, ManPageBlockingFlow) {
  // ibv_get_cq_event(3): arm, wait, ack, re-arm, poll until empty.
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  std::thread device([&] {
    std::this_thread::sleep_for(50ms);
    Complete(cq_, MakeCqe(42));
  });
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);  // blocks until the completion
  device.join();
  EXPECT_EQ(ev_cq, cq_);
  ibv_ack_cq_events(ev_cq, 1);
  ASSERT_EQ(ibv_req_notify_cq(ev_cq, 0), 0);
  ibv_wc wc;
  int n, total = 0;
  while ((n = ibv_poll_cq(ev_cq, 1, &wc)) > 0) {
    ++total;
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 42u);
  }
  EXPECT_EQ(n, 0);
  EXPECT_EQ(total, 1);
}

TEST_F(CqEventsTest, ManPageNonBlockingFlow) {
  SetNonBlocking(ch_->fd);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);

  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  std::thread device([&] {
    std::this_thread::sleep_for(30ms);
    Complete(cq_, MakeCqe(7));
  });
  pollfd p{ch_->fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  device.join();
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq_);
  ibv_ack_cq_events(ev_cq, 1);
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  ibv_wc wc;
  ASSERT_EQ(ibv_poll_cq(cq_, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 7u);
}

TEST_F(CqEventsTest, SolicitedOnlyArmWaitsForASolicitedCompletion) {
  ASSERT_EQ(ibv_req_notify_cq(cq_, 1), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(1)));
  EXPECT_FALSE(Readable(ch_->fd));
  Cqe s = MakeCqe(2);
  s.solicited = true;
  ASSERT_TRUE(Complete(cq_, s));
  EXPECT_TRUE(Readable(ch_->fd));
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
}

TEST_F(CqEventsTest, PollCqReturnsTheCqeFields) {
  Cqe c = MakeCqe(0x1122334455667788ull);
  c.status = WcStatus::kRemAccessErr;
  c.vendor_err = 0x55;
  ASSERT_TRUE(Complete(cq_, c));
  ibv_wc wc;
  std::memset(&wc, 0xcc, sizeof wc);
  ASSERT_EQ(ibv_poll_cq(cq_, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 0x1122334455667788ull);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.vendor_err, 0x55u);
  EXPECT_EQ(wc.byte_len, 1234u);
  EXPECT_EQ(wc.imm_data, 0xdeadbeefu);
  EXPECT_EQ(wc.qp_num, 0x11u);
  EXPECT_EQ(wc.src_qp, 0x22u);
  EXPECT_EQ(wc.wc_flags, unsigned{IBV_WC_WITH_IMM | IBV_WC_GRH});
  EXPECT_EQ(wc.sl, 3);
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &wc), 0);
}

TEST_F(CqEventsTest, PollCqTakesManyInOrder) {
  ibv_cq* big = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_NE(big, nullptr);
  for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(Complete(big, MakeCqe(i)));
  ibv_wc wc[64];
  ASSERT_EQ(ibv_poll_cq(big, 25, wc), 25) << "more than one internal batch";
  for (int i = 0; i < 25; ++i) EXPECT_EQ(wc[i].wr_id, static_cast<uint64_t>(i));
  ASSERT_EQ(ibv_poll_cq(big, 64, wc), 15);
  EXPECT_EQ(wc[14].wr_id, 39u);
  EXPECT_EQ(ibv_destroy_cq(big), 0);
}

TEST_F(CqEventsTest, ExtendedPollReturnsTheCqeFields) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 8;
  attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
                  uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK};
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cq, nullptr);
  ibv_cq* base = ibv_cq_ex_to_cq(cq);
  Cqe a = MakeCqe(100);
  Cqe b = MakeCqe(101);
  b.status = WcStatus::kWrFlushErr;
  b.opcode = WcOpcode::kRdmaWrite;
  ASSERT_TRUE(Complete(base, a));
  ASSERT_TRUE(Complete(base, b));

  ibv_poll_cq_attr pattr{};
  ASSERT_EQ(ibv_start_poll(cq, &pattr), 0);
  EXPECT_EQ(cq->wr_id, 100u);
  EXPECT_EQ(cq->status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_wc_read_opcode(cq), IBV_WC_RECV);
  EXPECT_EQ(ibv_wc_read_byte_len(cq), 1234u);
  EXPECT_EQ(ibv_wc_read_imm_data(cq), 0xdeadbeefu);
  EXPECT_EQ(ibv_wc_read_qp_num(cq), 0x11u);
  EXPECT_EQ(ibv_wc_read_src_qp(cq), 0x22u);
  EXPECT_EQ(ibv_wc_read_wc_flags(cq), unsigned{IBV_WC_WITH_IMM | IBV_WC_GRH});
  EXPECT_EQ(ibv_wc_read_sl(cq), 3);
  // Stamped by the CQ as the device pushed the CQE (the producer sets none).
  EXPECT_GT(ibv_wc_read_completion_ts(cq), 0u);
  EXPECT_GT(ibv_wc_read_completion_wallclock_ns(cq), 0u);
  ASSERT_EQ(ibv_next_poll(cq), 0);
  EXPECT_EQ(cq->wr_id, 101u);
  EXPECT_EQ(cq->status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(ibv_wc_read_opcode(cq), IBV_WC_RDMA_WRITE);
  EXPECT_EQ(ibv_next_poll(cq), ENOENT);
  ibv_end_poll(cq);

  EXPECT_EQ(ibv_start_poll(cq, &pattr), ENOENT) << "both CQEs were consumed";
  ASSERT_TRUE(Complete(base, MakeCqe(102)));
  ASSERT_EQ(ibv_start_poll(cq, &pattr), 0);
  EXPECT_EQ(cq->wr_id, 102u);
  ibv_end_poll(cq);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(base, 1, &wc), 0) << "end_poll consumed the CQE";
  EXPECT_EQ(ibv_destroy_cq(base), 0);
}

TEST_F(CqEventsTest, DestroyWaitsUntilEveryEventIsAcked) {
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(1)));
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(2)));
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  // Two events taken; ack one now, one while destroy waits.
  ibv_ack_cq_events(cq_, 1);

  std::atomic<bool> done{false};
  Clock::time_point returned;
  auto result = std::async(std::launch::async, [&] {
    int rc = ibv_destroy_cq(cq_);
    returned = Clock::now();
    done = true;
    return rc;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(done) << "destroy returned with an unacknowledged event";
  Clock::time_point acked = Clock::now();
  ibv_ack_cq_events(cq_, 1);
  ASSERT_EQ(result.wait_for(10s), std::future_status::ready) << "destroy did not return after the ack";
  EXPECT_EQ(result.get(), 0);
  EXPECT_LT(returned - acked, 2s) << "destroy returned long after the ack";
  cq_ = nullptr;
  EXPECT_EQ(ch_->refcnt, 0);
}

TEST_F(CqEventsTest, WaitingDestroyLogsAfterASecond) {
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(1)));
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  ::testing::internal::CaptureStderr();
  auto result = std::async(std::launch::async, [&] { return ibv_destroy_cq(cq_); });
  std::this_thread::sleep_for(1600ms);
  ibv_ack_cq_events(cq_, 1);
  ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(result.get(), 0);
  std::string err = ::testing::internal::GetCapturedStderr();
  cq_ = nullptr;
  EXPECT_NE(err.find("unacknowledged"), std::string::npos) << "stderr was: " << err;
  EXPECT_NE(err.find("1 unacknowledged"), std::string::npos) << "names the count: " << err;
}

TEST_F(CqEventsTest, QueuedButUnreadEventIsDiscardedAtDestroy) {
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(1)));
  ASSERT_TRUE(Readable(ch_->fd));
  auto result = std::async(std::launch::async, [&] { return ibv_destroy_cq(cq_); });
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready) << "destroy waited for an event never read";
  EXPECT_EQ(result.get(), 0);
  cq_ = nullptr;
  EXPECT_FALSE(Readable(ch_->fd)) << "the discarded event left the fd readable";
  SetNonBlocking(ch_->fd);
  ibv_cq* ev_cq;
  void* ev_ctx;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(CqEventsTest, DiscardKeepsOtherCqsEvents) {
  ibv_cq* other = ibv_create_cq(ctx_, 4, nullptr, ch_, 0);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  ASSERT_EQ(ibv_req_notify_cq(other, 0), 0);
  ASSERT_TRUE(Complete(cq_, MakeCqe(1)));
  ASSERT_TRUE(Complete(other, MakeCqe(2)));
  EXPECT_EQ(ibv_destroy_cq(cq_), 0);
  cq_ = nullptr;
  ASSERT_TRUE(Readable(ch_->fd));
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, other);
  EXPECT_FALSE(Readable(ch_->fd));
  ibv_ack_cq_events(other, 1);
  EXPECT_EQ(ibv_destroy_cq(other), 0);
}

TEST_F(CqEventsTest, BatchedAcksAreEnough) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
    ASSERT_TRUE(Complete(cq_, MakeCqe(i)));
    ibv_cq* ev_cq;
    void* ev_ctx;
    ASSERT_EQ(ibv_get_cq_event(ch_, &ev_cq, &ev_ctx), 0);
  }
  ibv_ack_cq_events(cq_, 3);
  auto result = std::async(std::launch::async, [&] { return ibv_destroy_cq(cq_); });
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(result.get(), 0);
  cq_ = nullptr;
}

TEST_F(CqEventsTest, CqWithoutChannelNeverQueuesEvents) {
  ibv_cq* plain = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(ibv_req_notify_cq(plain, 0), EINVAL) << "no channel to deliver the event to";
  ASSERT_TRUE(Complete(plain, MakeCqe(1)));
  EXPECT_FALSE(Readable(ch_->fd));
  EXPECT_EQ(ibv_destroy_cq(plain), 0);
}

TEST_F(CqEventsTest, PortEventReachesTheAsyncFd) {
  EXPECT_FALSE(Readable(ctx_->async_fd));
  RaiseAsync(ctx_, rdmaemu::device::AsyncEventType::kPortErr, 0, 1);
  ASSERT_TRUE(Readable(ctx_->async_fd));
  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(ev.element.port_num, 1);
  ibv_ack_async_event(&ev);
  EXPECT_FALSE(Readable(ctx_->async_fd));
}

TEST_F(CqEventsTest, CqErrGoesOnlyToTheOwningContextAndMustBeAcked) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  RaiseAsync(ctx_, rdmaemu::device::AsyncEventType::kCqErr, reinterpret_cast<uint64_t>(cq_), 0);
  EXPECT_FALSE(Readable(other->async_fd)) << "another context's CQ event leaked";
  ASSERT_TRUE(Readable(ctx_->async_fd));
  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, cq_);

  std::atomic<bool> done{false};
  auto result = std::async(std::launch::async, [&] {
    int rc = ibv_destroy_cq(cq_);
    done = true;
    return rc;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(done) << "destroy did not wait for the async event's ack";
  ibv_ack_async_event(&ev);
  ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(result.get(), 0);
  cq_ = nullptr;
  EXPECT_EQ(ibv_close_device(other), 0);
}

TEST_F(CqEventsTest, UnreadCqErrIsDiscardedAtDestroy) {
  RaiseAsync(ctx_, rdmaemu::device::AsyncEventType::kCqErr, reinterpret_cast<uint64_t>(cq_), 0);
  ASSERT_TRUE(Readable(ctx_->async_fd));
  auto result = std::async(std::launch::async, [&] { return ibv_destroy_cq(cq_); });
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(result.get(), 0);
  cq_ = nullptr;
  EXPECT_FALSE(Readable(ctx_->async_fd));
}

TEST_F(CqEventsTest, ClosedContextGetsNoMoreEvents) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(ibv_close_device(other), 0);
  // Raising now must not touch the freed context (ASan would see it).
  RaiseAsync(ctx_, rdmaemu::device::AsyncEventType::kPortActive, 0, 1);
  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
  ibv_ack_async_event(&ev);
}

}  // namespace
