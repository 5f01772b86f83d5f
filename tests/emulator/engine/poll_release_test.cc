// Engine::AwaitsNothing and what TookCompletions learns from the program's
// next poll, through the verbs a program calls, on a pair of QPs of one
// device connected to each other.
#include <infiniband/verbs.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "emulator/engine/engine.h"
#include "provider/objects.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using namespace std::chrono_literals;

class PollReleaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    std::tie(a_, b_) = emu_.ConnectedPair();
    ASSERT_NE(a_, nullptr);
    data_ = emu_.Register(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(data_, nullptr);
  }
  engine::Engine& engine() { return *provider::ToContext(emu_.ctx())->engine; }
  // A's RDMA WRITE into the buffer, completed and polled.
  void WriteAndPoll(uint64_t wr_id) {
    ASSERT_EQ(emu_.PostSend(a_, wr_id, IBV_WR_RDMA_WRITE, *data_, 0, 64, data_->addr() + 1024, data_->mr->rkey), 0);
    auto wc = emu_.Poll();
    ASSERT_TRUE(wc.has_value());
    EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc->wr_id, wr_id);
  }
  // Polls `n` completions, each a success.
  void PollSuccesses(int n) {
    for (int i = 0; i < n; ++i) {
      auto wc = emu_.Poll();
      ASSERT_TRUE(wc.has_value()) << "completion " << i << " of " << n;
      EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
    }
  }
  // B's RDMA WRITE into A's memory while nobody polls (perftest's
  // ib_write_lat spins on its buffer): posting does not poll, so the write
  // and its ACK are taken in by the engine's thread. Returns once both
  // have reached the device; the completion is left on the CQ.
  void WriteWithoutPolling(uint64_t wr_id) {
    const uint64_t before = provider::QueryCounters(emu_.ctx(), 1).value().packets_received;
    ASSERT_EQ(emu_.PostSend(b_, wr_id, IBV_WR_RDMA_WRITE, *data_, 0, 64, data_->addr() + 1024, data_->mr->rkey), 0);
    const auto give_up = std::chrono::steady_clock::now() + 2s;
    while (provider::QueryCounters(emu_.ctx(), 1).value().packets_received < before + 2) {
      ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the WRITE and its ACK never arrived";
      std::this_thread::sleep_for(1ms);
    }
  }

  EmuRc emu_{/*with_channel=*/true};
  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
  EmuRc::Buffer* data_ = nullptr;
};

TEST_F(PollReleaseTest, AwaitsNothingOnlyWithNoWorkRequestPosted) {
  EXPECT_TRUE(engine().AwaitsNothing());
  ASSERT_EQ(emu_.PostRecv(b_, 7, *data_, 0, 256), 0);
  EXPECT_FALSE(engine().AwaitsNothing()) << "a receive is posted";
  ASSERT_EQ(emu_.PostSend(a_, 8, IBV_WR_SEND, *data_, 512, 32), 0);
  // Both completions taken: the send's and the receive's.
  ASSERT_NO_FATAL_FAILURE(PollSuccesses(2));
  EXPECT_TRUE(engine().AwaitsNothing());
  // An unsignaled WRITE is outstanding until the device has finished it,
  // though it never completes on the CQ.
  ibv_sge sge{data_->addr(), 64, data_->mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = data_->addr() + 2048;
  wr.wr.rdma.rkey = data_->mr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a_, &wr, &bad), 0);
  WriteAndPoll(9);  // completes after the unsignaled one (in order)
  EXPECT_TRUE(engine().AwaitsNothing());
}

TEST_F(PollReleaseTest, AProgramThatPollsAgainKeepsTheReceiveSide) {
  // A program that, having taken its last completion, polls again before
  // anything arrives (qperf's rc_lat posts and polls): no release.
  for (uint64_t i = 0; i < 3; ++i) {
    WriteAndPoll(i);
    ibv_wc wc;
    EXPECT_EQ(ibv_poll_cq(emu_.cq(), 1, &wc), 0);
    EXPECT_FALSE(engine().releases_when_done()) << "round " << i;
  }
}

TEST_F(PollReleaseTest, AProgramThatStopsPollingAfterItsLastCompletionIsLearned) {
  WriteAndPoll(1);
  ASSERT_FALSE(engine().releases_when_done());
  ASSERT_NO_FATAL_FAILURE(WriteWithoutPolling(2));
  // The program polls again: it was not polling for what came.
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 2u);
  EXPECT_TRUE(engine().releases_when_done());
  // And it unlearns it when it next polls at once.
  ibv_wc none;
  EXPECT_EQ(ibv_poll_cq(emu_.cq(), 1, &none), 0);
  EXPECT_FALSE(engine().releases_when_done());
}

TEST_F(PollReleaseTest, AProgramThatTakesAReceiveIsNeverReleased) {
  WriteAndPoll(1);
  ASSERT_NO_FATAL_FAILURE(WriteWithoutPolling(2));
  ASSERT_TRUE(emu_.Poll().has_value());
  ASSERT_TRUE(engine().releases_when_done());
  // Now it polls for what comes in, with a receive posted the while.
  ASSERT_EQ(emu_.PostRecv(a_, 3, *data_, 0, 256), 0);
  ASSERT_EQ(emu_.PostSend(b_, 4, IBV_WR_SEND, *data_, 512, 32), 0);
  ASSERT_NO_FATAL_FAILURE(PollSuccesses(2));
  EXPECT_FALSE(engine().releases_when_done());
}

TEST_F(PollReleaseTest, AProgramThatWaitsForItsCompletionEventIsNeverReleased) {
  // qperf's rc_rdma_read_lat: post, wait for the completion's event, poll
  // it, post again. The datagrams come while it waits, whichever thread
  // takes them in: it is waiting for them, not done.
  WriteAndPoll(1);
  for (uint64_t i = 2; i < 6; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(emu_.cq(), 0), 0);
    ASSERT_EQ(emu_.PostSend(a_, i, IBV_WR_RDMA_WRITE, *data_, 0, 64, data_->addr() + 1024, data_->mr->rkey), 0);
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    ASSERT_EQ(ibv_get_cq_event(emu_.channel(), &cq, &cq_context), 0);
    ibv_ack_cq_events(cq, 1);
    ibv_wc wc;
    ASSERT_EQ(ibv_poll_cq(emu_.cq(), 1, &wc), 1);
    EXPECT_EQ(wc.wr_id, i);
    EXPECT_FALSE(engine().releases_when_done()) << "round " << i;
  }
}

}  // namespace
}  // namespace rdmaemu::testing
