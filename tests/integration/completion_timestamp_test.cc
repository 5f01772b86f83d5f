// Completion timestamps through the verbs API (ibv_create_cq_ex(3)): an
// extended CQ created with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP gives each
// completion the core clock's ticks when it was produced, which
// hca_core_clock converts to time and ibv_query_rt_values_ex reads too;
// with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, the wall time in ns.
// Run once per engine backend, over RC traffic between two QPs.
#include <infiniband/verbs.h>
#include <time.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

uint64_t Now(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

struct Stamped {
  ibv_wc_status status = IBV_WC_GENERAL_ERR;
  uint64_t wr_id = 0;
  uint64_t ts = 0;
  uint64_t wallclock_ns = 0;
};

class CompletionTimestampTest : public RcPairTest {
 protected:
  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    qps_.clear();
    for (ibv_cq_ex* cq : cqs_) EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    RcPairTest::TearDown();
  }

  ibv_cq_ex* CreateCqEx(uint64_t wc_flags) {
    ibv_cq_init_attr_ex a{};
    a.cqe = 64;
    a.wc_flags = IBV_WC_STANDARD_FLAGS | wc_flags;
    ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &a);
    if (cq != nullptr) cqs_.push_back(cq);
    return cq;
  }
  ibv_qp* CreateRcOn(ibv_cq_ex* cq) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = ibv_cq_ex_to_cq(cq);
    a.qp_type = IBV_QPT_RC;
    a.cap = {16, 16, 1, 1, 0};
    return Own(ibv_create_qp(pd_, &a));
  }
  // The next completion of `cq`, with the timestamps its flags ask for.
  Stamped Next(ibv_cq_ex* cq, uint64_t wc_flags) {
    Stamped out;
    ibv_poll_cq_attr attr{};
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int rc;
    while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && std::chrono::steady_clock::now() < until) {
    }
    EXPECT_EQ(rc, 0) << "no completion";
    if (rc != 0) return out;
    out.status = cq->status;
    out.wr_id = cq->wr_id;
    if (wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) out.ts = ibv_wc_read_completion_ts(cq);
    if (wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) {
      out.wallclock_ns = ibv_wc_read_completion_wallclock_ns(cq);
    }
    ibv_end_poll(cq);
    return out;
  }
  // A SEND of 64 bytes from `from` to `to` (a receive posted first).
  void Send(ibv_qp* from, ibv_qp* to) {
    ASSERT_EQ(PostRecv(to, 1, Sge(4096, 64)), 0);
    ibv_sge sge = Sge(0, 64);
    ibv_send_wr wr{};
    wr.wr_id = 2;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(from, &wr, &bad), 0);
  }
  uint64_t RawClock() {
    ibv_values_ex v{};
    v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
    return static_cast<uint64_t>(v.raw_clock.tv_sec) * 1000000000u +
           static_cast<uint64_t>(v.raw_clock.tv_nsec);
  }

  std::vector<ibv_cq_ex*> cqs_;
};

TEST_F(CompletionTimestampTest, QueryDeviceExDescribesTheClock) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  EXPECT_EQ(attr.hca_core_clock, 1000000u) << "kHz: one tick a nanosecond";
  EXPECT_EQ(attr.completion_timestamp_mask, ~uint64_t{0}) << "64 bits: never wraps";
}

// Both clocks on both sides: each completion's ticks lie between raw clock
// reads before the post and after the poll, and convert, through
// hca_core_clock, to the time that passed; its wall time lies between
// CLOCK_REALTIME reads around the same span.
TEST_F(CompletionTimestampTest, SendAndReceiveCompletionsCarryBothClocks) {
  const uint64_t flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  ibv_cq_ex* cq = CreateCqEx(flags);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  ibv_qp* a = CreateRcOn(cq);
  ibv_qp* b = CreateRcOn(cq);
  ASSERT_NO_FATAL_FAILURE(Connect(a, b));
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);

  const uint64_t raw0 = RawClock(), real0 = Now(CLOCK_REALTIME);
  ASSERT_NO_FATAL_FAILURE(Send(a, b));
  Stamped first = Next(cq, flags);
  Stamped second = Next(cq, flags);
  const uint64_t raw1 = RawClock(), real1 = Now(CLOCK_REALTIME);
  for (const Stamped& c : {first, second}) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_GE(c.ts, raw0);
    EXPECT_LE(c.ts, raw1);
    EXPECT_GE(c.wallclock_ns, real0);
    EXPECT_LE(c.wallclock_ns, real1);
    const uint64_t ns_since = (raw1 - c.ts) * 1000000u / attr.hca_core_clock;
    EXPECT_LE(ns_since, raw1 - raw0) << "ticks convert to ns through hca_core_clock (kHz)";
  }
}

// A CQ stamps only what it was created for; reading the other field gives
// 0 (a NIC's CQE would hold whatever it held), with a line in the log.
TEST_F(CompletionTimestampTest, ACqCarriesOnlyTheClocksItAskedFor) {
  ibv_cq_ex* cq = CreateCqEx(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  ibv_qp* a = CreateRcOn(cq);
  ibv_qp* b = CreateRcOn(cq);
  ASSERT_NO_FATAL_FAILURE(Connect(a, b));
  const uint64_t real0 = Now(CLOCK_REALTIME);
  ASSERT_NO_FATAL_FAILURE(Send(a, b));
  Stamped c = Next(cq, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(c.ts, 0u) << "not asked for";
  EXPECT_GE(c.wallclock_ns, real0);
  // The classic poll reads the same CQ.
  ibv_wc wc{};
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int n = 0;
  while ((n = ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc)) == 0 && std::chrono::steady_clock::now() < until) {
  }
  EXPECT_EQ(n, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

TEST_F(CompletionTimestampTest, UnknownWcFlagsAreRefused) {
  errno = 0;
  EXPECT_EQ(CreateCqEx(uint64_t{1} << 40), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

}  // namespace
}  // namespace rdmaemu::testing
