// The checker's send queues (provider/check/sends.h), driven as the op
// wrappers drive them, including the interleavings a second thread makes: a
// completion polled while the post that made it has not returned yet.
#include "provider/check/sends.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "provider/check/check.h"
#include "provider/check/stack.h"

namespace rdmaemu::check {
namespace {

class Sends : public ::testing::Test {
 protected:
  void SetUp() override {
    Configure(Mode::kWarn, nullptr);
    qp_.context = &context_;
    qp_.qp_num = 17;
    TrackQp(&qp_, /*sq_sig_all=*/false, /*max_send_wr=*/2);
    std::memset(buf_, 'a', sizeof(buf_));
  }
  void TearDown() override {
    ForgetQp(&qp_);
    Configure(Mode::kOff, nullptr);
  }

  // A signaled SEND of the first 16 bytes of buf_.
  ibv_send_wr Send(uint64_t wr_id) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge_;
    wr.num_sge = 1;
    return wr;
  }
  void Complete(uint64_t wr_id) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_SEND;
    wc.qp_num = qp_.qp_num;
    SendCompleted(&context_, wc);
  }
  int Changed() const { return Count(Kind::kSendBufferChanged); }

  ibv_context context_{};
  ibv_qp qp_{};
  char buf_[64];
  ibv_sge sge_{reinterpret_cast<uintptr_t>(buf_), 16, 0x201};
};

TEST_F(Sends, ABufferChangedBeforeItsCompletionIsReported) {
  const int before = Changed();
  ibv_send_wr wr = Send(1);
  SendPost post(&qp_, &wr, CaptureStack());
  ASSERT_TRUE(post.room());
  post.Finish(0, nullptr);
  buf_[3] = 'b';
  Complete(1);
  EXPECT_EQ(Changed(), before + 1);
}

// The device can complete a WR, and another thread poll it, before the
// provider's post returns: the program may then reuse the buffer at once.
// rping's client does (its CQ thread polls while main posts).
TEST_F(Sends, ACompletionPolledBeforeThePostReturnsRetiresIt) {
  const int before = Changed();
  ibv_send_wr first = Send(1);
  {
    SendPost post(&qp_, &first, CaptureStack());
    ASSERT_TRUE(post.room());
    Complete(1);  // the CQ thread, while the post is still in the provider
    buf_[3] = 'b';
    post.Finish(0, nullptr);
  }
  ibv_send_wr second = Send(2);
  SendPost post(&qp_, &second, CaptureStack());
  post.Finish(0, nullptr);
  Complete(2);
  EXPECT_EQ(Changed(), before) << "the first WR was retired by its own completion";
}

// rdma-core's test_tm_rndv: the peer acknowledged the SEND and the device
// produced its completion; then a receive lands in the same buffer before
// the program polls. Nothing reads the buffer for that WR again.
TEST_F(Sends, AChangeAfterTheDeviceProducedTheCompletionIsNotReported) {
  const int before = Changed();
  ibv_send_wr a = Send(1), b = Send(2);
  b.send_flags = 0;  // unsignaled: retired by c's completion
  ibv_send_wr c = Send(3);
  for (ibv_send_wr* wr : {&a, &b}) {
    SendPost post(&qp_, wr, CaptureStack());
    post.Finish(0, nullptr);
  }
  SendProduced(&context_, qp_.qp_num, 1);
  buf_[3] = 'b';
  Complete(1);
  EXPECT_EQ(Changed(), before);
  // b is still outstanding and reads the changed bytes from here on.
  SendPost post(&qp_, &c, CaptureStack());
  post.Finish(0, nullptr);
  buf_[5] = 'c';
  SendProduced(&context_, qp_.qp_num, 3);
  Complete(3);
  EXPECT_EQ(Changed(), before + 2) << "b and c changed before the device was done";
}

TEST_F(Sends, WrsThePostRefusedAreTakenBack) {
  ibv_send_wr a = Send(1), b = Send(2);
  a.next = &b;
  {
    SendPost post(&qp_, &a, CaptureStack());
    ASSERT_TRUE(post.room());
    post.Finish(EINVAL, &b);  // a posted, b not
  }
  ibv_send_wr c = Send(3);
  {
    SendPost post(&qp_, &c, CaptureStack());
    EXPECT_TRUE(post.room()) << "b holds no slot of the two";
    post.Finish(0, nullptr);
  }
  ibv_send_wr d = Send(4);
  {
    SendPost post(&qp_, &d, CaptureStack());
    EXPECT_FALSE(post.room()) << "a and c fill the queue until a completion is polled";
    post.Finish(ENOMEM, &d);
  }
  Complete(3);  // retires a too
  ibv_send_wr e = Send(5);
  SendPost post(&qp_, &e, CaptureStack());
  EXPECT_TRUE(post.room());
  post.Finish(0, nullptr);
}

}  // namespace
}  // namespace rdmaemu::check
