// UD multicast through the verbs API (IBA 10.5), as an unmodified program
// uses it: ibv_attach_mcast with the IPv4-mapped MGID of a group, a UD send
// to the group (DQPN 0xFFFFFF), a copy for every attached QP, nothing after
// ibv_detach_mcast or after the QP is destroyed; and the errors a NIC's
// stack gives for the wrong QP type or GID. Every QP lives in this process
// (one emulated host): the group's datagrams come back through the host's
// IP multicast loopback, as they would to a NIC's own members.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <gtest/gtest.h>

#include "tests/testing/verbs_test.h"

namespace rdmaemu {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMulticastQpn = 0xFFFFFF;
constexpr size_t kGrh = 40;
constexpr size_t kSlot = 256;  // one receive or send buffer in buf_

// The MGID of IPv4 group `group` (host order): ::ffff:a.b.c.d.
ibv_gid Mgid(uint32_t group) {
  ibv_gid gid{};
  gid.raw[10] = gid.raw[11] = 0xff;
  const uint32_t be = htonl(group);
  std::memcpy(gid.raw + 12, &be, 4);
  return gid;
}

class MulticastTest : public testing::VerbsTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Open(64, 8 * kSlot, IBV_ACCESS_LOCAL_WRITE));
    // A random group of 239/8, so tests running at once (Bazel's sandboxes
    // share the host's network, but not its PIDs) never share one.
    group_ = 0xef000000u | (std::random_device{}() & 0xfffffe);
    mgid_ = Mgid(group_);
  }

  ibv_qp* NewUd() {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = IBV_QPT_UD;
    a.cap.max_send_wr = a.cap.max_recv_wr = 8;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    ibv_qp* qp = Own(ibv_create_qp(pd_, &a));
    EXPECT_NE(qp, nullptr);
    if (qp != nullptr) {
      EXPECT_EQ(UdToRts(qp, kQkey, 0), 0);
    }
    return qp;
  }

  void PostRecv(ibv_qp* qp, int slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + slot * kSlot), kSlot, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  }

  // Sends `text` from `qp` to the group, signaled.
  void SendToGroup(ibv_qp* qp, const char* text) {
    if (ah_ == nullptr) {
      ibv_ah_attr a{};
      a.is_global = 1;
      a.grh.dgid = mgid_;
      a.grh.hop_limit = 1;
      a.port_num = 1;
      ah_ = ibv_create_ah(pd_, &a);
      ASSERT_NE(ah_, nullptr) << std::strerror(errno);
    }
    uint8_t* at = buf_.data() + 7 * kSlot;
    std::strcpy(reinterpret_cast<char*>(at), text);
    ibv_sge sge{reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(std::strlen(text) + 1),
                mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 99;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah_;
    wr.wr.ud.remote_qpn = kMulticastQpn;
    wr.wr.ud.remote_qkey = kQkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  }

  // Completions within `wait` (polling), until `want` or the time is up.
  std::vector<ibv_wc> Poll(size_t want, std::chrono::milliseconds wait) {
    std::vector<ibv_wc> got;
    const auto until = std::chrono::steady_clock::now() + wait;
    while (got.size() < want && std::chrono::steady_clock::now() < until) {
      ibv_wc wc[8];
      int n = ibv_poll_cq(cq_, 8, wc);
      EXPECT_GE(n, 0);
      for (int i = 0; i < n; ++i) got.push_back(wc[i]);
      if (n == 0) std::this_thread::sleep_for(200us);
    }
    return got;
  }

  void DestroyExtras() override {
    if (ah_ != nullptr) {
      EXPECT_EQ(ibv_destroy_ah(ah_), 0);
    }
  }

  uint32_t group_ = 0;
  ibv_gid mgid_{};
  ibv_ah* ah_ = nullptr;
};

TEST_F(MulticastTest, DeviceReportsItsMulticastLimits) {
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_EQ(attr.max_mcast_grp, 256);
  EXPECT_EQ(attr.max_mcast_qp_attach, 56);
  EXPECT_EQ(attr.max_total_mcast_qp_attach, 256 * 56);
}

TEST_F(MulticastTest, EveryAttachedQpGetsACopyUntilItDetaches) {
  ibv_qp* a = NewUd();
  ibv_qp* b = NewUd();
  ibv_qp* sender = NewUd();
  ASSERT_TRUE(a && b && sender);
  for (int slot = 0; slot < 2; ++slot) {
    PostRecv(a, slot);
    PostRecv(b, 2 + slot);
  }
  ASSERT_EQ(ibv_attach_mcast(a, &mgid_, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(b, &mgid_, 0), 0);
  EXPECT_EQ(ibv_attach_mcast(b, &mgid_, 0), 0) << "attaching again is no error (as rxe)";

  SendToGroup(sender, "hello group");
  std::vector<ibv_wc> wcs = Poll(3, 5s);
  ASSERT_EQ(wcs.size(), 3u) << "the send and one receive per member";
  int received_a = 0, received_b = 0;
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    if (wc.opcode != IBV_WC_RECV) continue;
    EXPECT_EQ(wc.src_qp, sender->qp_num);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    EXPECT_EQ(wc.byte_len, kGrh + sizeof("hello group"));
    const char* text = reinterpret_cast<const char*>(buf_.data() + wc.wr_id * kSlot + kGrh);
    EXPECT_STREQ(text, "hello group");
    if (wc.qp_num == a->qp_num) ++received_a;
    if (wc.qp_num == b->qp_num) ++received_b;
  }
  EXPECT_EQ(received_a, 1);
  EXPECT_EQ(received_b, 1);

  ASSERT_EQ(ibv_detach_mcast(a, &mgid_, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(a, &mgid_, 0), EINVAL) << "a QP not attached";
  SendToGroup(sender, "b only");
  wcs = Poll(3, 300ms);
  ASSERT_EQ(wcs.size(), 2u) << "the send and b's receive; a left the group";
  for (const ibv_wc& wc : wcs) {
    if (wc.opcode == IBV_WC_RECV) {
      EXPECT_EQ(wc.qp_num, b->qp_num);
    }
  }
}

TEST_F(MulticastTest, ADestroyedQpLeavesItsGroups) {
  ibv_qp* member = NewUd();
  ibv_qp* sender = NewUd();
  ASSERT_TRUE(member && sender);
  PostRecv(member, 0);
  ASSERT_EQ(ibv_attach_mcast(member, &mgid_, 0), 0);
  Forget(member);
  ASSERT_EQ(ibv_destroy_qp(member), 0);
  ibv_qp* later = NewUd();  // not attached: must hear nothing
  ASSERT_NE(later, nullptr);
  PostRecv(later, 1);
  SendToGroup(sender, "anyone?");
  std::vector<ibv_wc> wcs = Poll(2, 300ms);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

TEST_F(MulticastTest, OnlyUdQpsAndMulticastGidsAttach) {
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq_;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 1;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ibv_qp* rc = Own(ibv_create_qp(pd_, &a));
  ASSERT_NE(rc, nullptr);
  EXPECT_EQ(ibv_attach_mcast(rc, &mgid_, 0), EINVAL) << "an RC QP";

  ibv_qp* ud = NewUd();
  ASSERT_NE(ud, nullptr);
  const ibv_gid unicast = Mgid(0x7f000001);
  EXPECT_EQ(ibv_attach_mcast(ud, &unicast, 0), EINVAL) << "::ffff:127.0.0.1";
  ibv_gid ib_mgid{};
  ib_mgid.raw[0] = 0xff;
  ib_mgid.raw[1] = 0x12;
  EXPECT_EQ(ibv_attach_mcast(ud, &ib_mgid, 0), EINVAL) << "an IB MGID, not IPv4-mapped";
  EXPECT_EQ(ibv_detach_mcast(ud, &mgid_, 0), EINVAL) << "never attached";
  EXPECT_EQ(ibv_attach_mcast(nullptr, &mgid_, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(ud, nullptr, 0), EINVAL);
}

TEST_F(MulticastTest, AGroupHoldsAtMostMaxMcastQpAttachQps) {
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  std::vector<ibv_qp*> qps;
  for (int i = 0; i < attr.max_mcast_qp_attach; ++i) {
    ibv_qp* qp = NewUd();
    ASSERT_NE(qp, nullptr);
    ASSERT_EQ(ibv_attach_mcast(qp, &mgid_, 0), 0) << "QP " << i;
  }
  ibv_qp* one_more = NewUd();
  ASSERT_NE(one_more, nullptr);
  EXPECT_EQ(ibv_attach_mcast(one_more, &mgid_, 0), ENOMEM);
  const ibv_gid other = Mgid(group_ + 1);
  EXPECT_EQ(ibv_attach_mcast(one_more, &other, 0), 0) << "another group has room";
}

}  // namespace
}  // namespace rdmaemu
