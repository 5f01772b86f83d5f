// Port and device async events from their causes (rdmaemu/rdmaemu.h),
// through the public verbs API: each event reaches ibv_get_async_event with
// its port number, the query verbs show the change, and a fatal error
// flushes the device's QPs and leaves only cleanup verbs working.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdlib.h>
#include <gtest/gtest.h>
#include <rdmaemu/rdmaemu.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/testing/verbs_test.h"

#ifndef IBV_EVENT_DEVICE_SPEED_CHANGE
#define IBV_EVENT_DEVICE_SPEED_CHANGE static_cast<ibv_event_type>(20)
#endif

namespace {

class DeviceEventsTest : public rdmaemu::testing::VerbsTest {
 protected:
  static void SetUpTestSuite() {
    // LID records go to a directory of this test only.
    const char* tmp = getenv("TEST_TMPDIR");
    std::string dir = std::string(tmp ? tmp : "/tmp") + "/subnet";
    setenv("RDMAEMU_SUBNET_DIR", dir.c_str(), 1);
  }

  ibv_device* Find(const char* name) {
    if (!list_) list_ = ibv_get_device_list(nullptr);
    for (int i = 0; list_ && list_[i]; ++i) {
      if (std::strcmp(ibv_get_device_name(list_[i]), name) == 0) return list_[i];
    }
    return nullptr;
  }

  // Opens `name` with a PD, a CQ and a registered buffer.
  void Open(const char* name) {
    ibv_device* dev = Find(name);
    ASSERT_NE(dev, nullptr) << name;
    ctx_ = ibv_open_device(dev);
    ASSERT_NE(ctx_, nullptr);
    ASSERT_NO_FATAL_FAILURE(VerbsTest::Open(
        64, 1 << 14, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
    ASSERT_NO_FATAL_FAILURE(AsyncFdNonBlocking());
  }

  bool NextEvent(ibv_async_event* ev, int ms = 3000) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    return ibv_get_async_event(ctx_, ev) == 0;
  }

  // The next event is `type` on port 1.
  void ExpectPortEvent(ibv_event_type type) {
    ibv_async_event ev;
    ASSERT_TRUE(NextEvent(&ev)) << ibv_event_type_str(type) << " never arrived";
    EXPECT_EQ(ev.event_type, type) << ibv_event_type_str(ev.event_type);
    EXPECT_EQ(ev.element.port_num, 1);
    ibv_ack_async_event(&ev);
  }

  void ExpectNoEvent() {
    ibv_async_event ev;
    if (NextEvent(&ev, 100)) {
      ADD_FAILURE() << "unexpected " << ibv_event_type_str(ev.event_type);
      ibv_ack_async_event(&ev);
    }
  }

  ibv_port_attr Port() {
    ibv_port_attr p{};
    EXPECT_EQ(ibv_query_port(ctx_, 1, &p), 0);
    return p;
  }

  ibv_qp* CreateRc() {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap = {16, 16, 1, 1, 0};
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    if (qp) qps_.push_back(qp);
    return qp;
  }

  // RESET -> INIT -> RTR -> RTS towards `peer`: by GID on RoCE, by `dlid`
  // (no GRH) on InfiniBand.
  void Connect(ibv_qp* qp, uint32_t peer, uint16_t dlid, uint16_t pkey_index = 0, uint8_t timeout = 14) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = pkey_index;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer;
    a.rq_psn = 1;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.port_num = 1;
    if (dlid != 0) {
      a.ah_attr.dlid = dlid;
    } else {
      a.ah_attr.is_global = 1;
      ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &a.ah_attr.grh.dgid), 0);
      a.ah_attr.grh.hop_limit = 1;
    }
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 1;
    a.timeout = timeout;
    a.retry_cnt = 2;
    a.rnr_retry = 2;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }

  int PostWrite(ibv_qp* qp, uint64_t wr_id = 1) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 64, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf_.data()) + 4096;
    wr.wr.rdma.rkey = mr_->rkey;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &wr, &bad);
  }

  int PostRecv(ibv_qp* qp, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()) + 8192, 64, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(qp, &wr, &bad);
  }

  std::vector<ibv_wc> Drain(size_t want, int seconds = 5) {
    std::vector<ibv_wc> out;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (out.size() < want && std::chrono::steady_clock::now() < until) {
      ibv_wc wc;
      if (ibv_poll_cq(cq_, 1, &wc) == 1) out.push_back(wc);
    }
    return out;
  }

};

TEST_F(DeviceEventsTest, LidChangeReachesTheHandlerAndTheNewLidRoutes) {
  Open("ib0");
  const uint16_t old_lid = Port().lid;
  const uint16_t new_lid = old_lid == 0x0321 ? 0x0322 : 0x0321;
  ASSERT_EQ(rdmaemu_set_port_lid(ctx_, 1, new_lid), 0);
  ExpectPortEvent(IBV_EVENT_LID_CHANGE);
  EXPECT_EQ(Port().lid, new_lid);

  // A peer that addresses the port by its new LID (no GRH) reaches it.
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  ASSERT_TRUE(a && b);
  Connect(a, b->qp_num, new_lid);
  Connect(b, a->qp_num, new_lid);
  ASSERT_EQ(PostWrite(a), 0);
  auto wcs = Drain(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);

  EXPECT_EQ(rdmaemu_set_port_lid(ctx_, 1, 0), EINVAL);
  EXPECT_EQ(rdmaemu_set_port_lid(ctx_, 1, 0xc000), EINVAL);
  EXPECT_EQ(rdmaemu_set_port_lid(ctx_, 2, 5), EINVAL);
  ASSERT_EQ(rdmaemu_set_port_lid(ctx_, 1, old_lid), 0);
  ExpectPortEvent(IBV_EVENT_LID_CHANGE);
  ExpectNoEvent();
}

TEST_F(DeviceEventsTest, SmChangeAndClientReregisterReachTheHandler) {
  Open("ib0");
  ASSERT_EQ(rdmaemu_set_sm_lid(ctx_, 1, 0x44), 0);
  ExpectPortEvent(IBV_EVENT_SM_CHANGE);
  EXPECT_EQ(Port().sm_lid, 0x44);
  ASSERT_EQ(rdmaemu_client_reregister(ctx_, 1), 0);
  ExpectPortEvent(IBV_EVENT_CLIENT_REREGISTER);
  EXPECT_EQ(rdmaemu_set_sm_lid(ctx_, 1, 0xffff), EINVAL);
  ExpectNoEvent();
}

TEST_F(DeviceEventsTest, SubnetManagerEventsAreRefusedOnRoce) {
  Open("emu0");
  EXPECT_EQ(rdmaemu_set_port_lid(ctx_, 1, 5), EINVAL);
  EXPECT_EQ(rdmaemu_set_sm_lid(ctx_, 1, 5), EINVAL);
  EXPECT_EQ(rdmaemu_client_reregister(ctx_, 1), EINVAL);
  EXPECT_EQ(rdmaemu_set_pkey(ctx_, 1, 0, 0x8001), EINVAL);
  ExpectNoEvent();
  EXPECT_EQ(Port().lid, 0);
  EXPECT_EQ(Port().pkey_tbl_len, 1);
}

TEST_F(DeviceEventsTest, PkeyChangeShowsInQueryPkeyAndDropsPacketsThatNoLongerMatch) {
  Open("ib0");
  EXPECT_EQ(Port().pkey_tbl_len, 16);
  const uint16_t lid = Port().lid;
  // Entry 1 starts as a second default P_Key: B, on index 1, talks to A.
  ASSERT_EQ(rdmaemu_set_pkey(ctx_, 1, 1, 0xffff), 0);
  ExpectPortEvent(IBV_EVENT_PKEY_CHANGE);
  uint16_t pkey = 0;
  ASSERT_EQ(ibv_query_pkey(ctx_, 1, 1, &pkey), 0);
  EXPECT_EQ(ntohs(pkey), 0xffff);
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  ASSERT_TRUE(a && b);
  Connect(a, b->qp_num, lid, /*pkey_index=*/0, /*timeout=*/10);
  Connect(b, a->qp_num, lid, /*pkey_index=*/1, /*timeout=*/10);
  ASSERT_EQ(PostWrite(a, 1), 0);
  auto wcs = Drain(1);
  ASSERT_EQ(wcs.size(), 1u);
  ASSERT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  const uint32_t bad_before = Port().bad_pkey_cntr;

  // Entry 1 moves B to another partition: A's packets no longer match.
  ASSERT_EQ(rdmaemu_set_pkey(ctx_, 1, 1, 0x8005), 0);
  ExpectPortEvent(IBV_EVENT_PKEY_CHANGE);
  ASSERT_EQ(ibv_query_pkey(ctx_, 1, 1, &pkey), 0);
  EXPECT_EQ(ntohs(pkey), 0x8005);
  ASSERT_EQ(PostWrite(a, 2), 0);
  wcs = Drain(1, 10);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(wcs[0].status);
  EXPECT_GT(Port().bad_pkey_cntr, bad_before);

  EXPECT_EQ(rdmaemu_set_pkey(ctx_, 1, 16, 0x8001), EINVAL);
  EXPECT_EQ(rdmaemu_set_pkey(ctx_, 1, 2, 0x8000), EINVAL);
  EXPECT_NE(ibv_query_pkey(ctx_, 1, 16, &pkey), 0) << "index 16 is outside the table";
  ASSERT_EQ(rdmaemu_set_pkey(ctx_, 1, 1, 0), 0);
  ExpectPortEvent(IBV_EVENT_PKEY_CHANGE);
}

TEST_F(DeviceEventsTest, SpeedAndWidthChangeRaiseDeviceSpeedChange) {
  Open("emu0");
  ASSERT_EQ(rdmaemu_set_port_speed(ctx_, 1, 64 /* HDR */, 1 /* 1x */), 0);
  ExpectPortEvent(IBV_EVENT_DEVICE_SPEED_CHANGE);
  EXPECT_EQ(Port().active_speed, 64);
  EXPECT_EQ(Port().active_width, 1);
  ASSERT_EQ(rdmaemu_set_port_speed(ctx_, 1, 0, 8 /* 12x; speed kept */), 0);
  ExpectPortEvent(IBV_EVENT_DEVICE_SPEED_CHANGE);
  EXPECT_EQ(Port().active_speed, 64);
  EXPECT_EQ(Port().active_width, 8);
  EXPECT_EQ(rdmaemu_set_port_speed(ctx_, 1, 3, 2), EINVAL);
  EXPECT_EQ(rdmaemu_set_port_speed(ctx_, 1, 32, 3), EINVAL);
  ASSERT_EQ(rdmaemu_set_port_speed(ctx_, 1, 32, 2), 0);  // back to 4x EDR
  ExpectPortEvent(IBV_EVENT_DEVICE_SPEED_CHANGE);
  ASSERT_EQ(rdmaemu_set_port_speed(ctx_, 1, 32, 2), 0);
  ExpectNoEvent();
}

TEST_F(DeviceEventsTest, QueryPortAddressGivesGid0sAddressAndSaysItWasPickedAtOpen) {
  ASSERT_NO_FATAL_FAILURE(Open("emu0"));
  in_addr address{};
  int fixed = -1;
  ASSERT_EQ(rdmaemu_query_port_address(ctx_, 1, &address, &fixed), 0);
  EXPECT_EQ(fixed, 0);  // no configuration: the first free address of 127/8
  ibv_gid gid{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  EXPECT_EQ(std::memcmp(gid.raw + 12, &address.s_addr, 4), 0);
  EXPECT_EQ(ntohl(address.s_addr) >> 24, 127u);
  EXPECT_EQ(rdmaemu_query_port_address(ctx_, 1, nullptr, nullptr), 0);
  EXPECT_EQ(rdmaemu_query_port_address(ctx_, 2, &address, &fixed), EINVAL);
  EXPECT_EQ(rdmaemu_query_port_address(ctx_, 0, &address, &fixed), EINVAL);
}

TEST_F(DeviceEventsTest, GidSetAndClearRaiseGidChangeAndShowInEveryGidQuery) {
  Open("emu0");
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = 10;
  g.raw[13] = 9;
  g.raw[14] = 8;
  g.raw[15] = 7;
  ASSERT_EQ(rdmaemu_set_gid(ctx_, 1, 3, &g), 0);
  ExpectPortEvent(IBV_EVENT_GID_CHANGE);
  ibv_gid got{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 3, &got), 0);
  EXPECT_EQ(std::memcmp(got.raw, g.raw, 16), 0);
  ibv_gid_entry entry{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 3, &entry, 0), 0);
  EXPECT_EQ(std::memcmp(entry.gid.raw, g.raw, 16), 0);
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
  ibv_gid_entry table[32];
  ssize_t n = ibv_query_gid_table(ctx_, table, 32, 0);
  ASSERT_EQ(n, 2) << "GID 0 and the new entry";
  EXPECT_EQ(table[1].gid_index, 3u);

  EXPECT_EQ(rdmaemu_set_gid(ctx_, 1, 0, &g), EBUSY);
  EXPECT_EQ(rdmaemu_clear_gid(ctx_, 1, 0), EBUSY);
  EXPECT_EQ(rdmaemu_set_gid(ctx_, 1, 4, &g), EEXIST);
  EXPECT_EQ(rdmaemu_set_gid(ctx_, 1, 16, &g), EINVAL);
  ExpectNoEvent();

  ASSERT_EQ(rdmaemu_clear_gid(ctx_, 1, 3), 0);
  ExpectPortEvent(IBV_EVENT_GID_CHANGE);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 3, &entry, 0), ENODATA);
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 3, &got), 0);
  EXPECT_EQ(std::memcmp(got.raw, ibv_gid{}.raw, 16), 0) << "an empty index reads as the zero GID";
  EXPECT_EQ(ibv_query_gid_table(ctx_, table, 32, 0), 1);
}

TEST_F(DeviceEventsTest, DeviceFatalFlushesQpsAndLeavesOnlyCleanupVerbs) {
  Open("fatal0");
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  ASSERT_TRUE(a && b);
  Connect(a, b->qp_num, 0, 0, /*timeout=*/20);  // ~4 s: the writes stay outstanding
  Connect(b, a->qp_num, 0, 0, 20);
  ASSERT_EQ(PostRecv(b, 100), 0);
  ASSERT_EQ(PostRecv(b, 101), 0);
  ASSERT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_DOWN), 0);  // nothing completes on its own
  ExpectPortEvent(IBV_EVENT_PORT_ERR);
  ASSERT_EQ(PostWrite(a, 1), 0);
  ASSERT_EQ(PostWrite(a, 2), 0);
  ibv_wc early;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &early), 0);

  ASSERT_EQ(rdmaemu_device_fatal(ctx_, "test"), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_DEVICE_FATAL);
  ibv_ack_async_event(&ev);

  // Every posted WR completes with a flush error; poll_cq still drains.
  auto wcs = Drain(4);
  ASSERT_EQ(wcs.size(), 4u);
  std::vector<uint64_t> ids;
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << wc.wr_id;
    ids.push_back(wc.wr_id);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 100, 101}));

  // Creation, modify and query verbs fail as on a dead device.
  errno = 0;
  EXPECT_EQ(ibv_alloc_pd(ctx_), nullptr);
  EXPECT_EQ(errno, EIO);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 4, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EIO);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {1, 1, 1, 1, 0};
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &qa), nullptr);
  EXPECT_EQ(errno, EIO);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EIO);
  errno = 0;
  EXPECT_EQ(ibv_create_comp_channel(ctx_), nullptr);
  EXPECT_EQ(errno, EIO);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE), EIO);
  ibv_qp_init_attr init;
  EXPECT_EQ(ibv_query_qp(a, &attr, IBV_QP_STATE, &init), EIO);
  ibv_port_attr port;
  EXPECT_EQ(ibv_query_port(ctx_, 1, &port), EIO);
  ibv_device_attr dattr;
  EXPECT_EQ(ibv_query_device(ctx_, &dattr), EIO);
  errno = 0;
  EXPECT_EQ(ibv_open_device(Find("fatal0")), nullptr);
  EXPECT_EQ(errno, EIO);
  EXPECT_EQ(rdmaemu_set_port_state(ctx_, 1, IBV_PORT_ACTIVE), EIO);
  EXPECT_EQ(rdmaemu_device_fatal(ctx_, nullptr), 0) << "one-way: a second call changes nothing";
  ExpectNoEvent();
  // TearDown: destroy verbs and ibv_close_device succeed.
}

TEST_F(DeviceEventsTest, ADeadDeviceIsFreshAfterItsLastContextCloses) {
  Open("fatal0");
  ASSERT_EQ(rdmaemu_device_fatal(ctx_, "first"), 0);
  ibv_async_event ev;
  ASSERT_TRUE(NextEvent(&ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_DEVICE_FATAL);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(ibv_dereg_mr(mr_), 0);
  EXPECT_EQ(ibv_destroy_cq(cq_), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
  EXPECT_EQ(ibv_close_device(ctx_), 0);
  mr_ = nullptr;
  cq_ = nullptr;
  pd_ = nullptr;
  ctx_ = nullptr;
  Open("fatal0");  // as after a reset
  EXPECT_EQ(Port().state, IBV_PORT_ACTIVE);
}

}  // namespace
