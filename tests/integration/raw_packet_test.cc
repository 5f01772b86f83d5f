// Raw packet QPs and flow steering through the verbs API, as a program
// written for mlx5 uses them: RAW_PACKET QPs on two contexts of one device
// exchange whole Ethernet frames; ibv_create_flow rules (ETH, IPv4, UDP,
// with masks and priorities; default rules) pick which QP gets a frame; a
// frame no rule matches is dropped and counted; ibv_destroy_flow stops
// delivery; bad specs are EINVAL and missing features EOPNOTSUPP. A frame
// sent to the port's own MAC comes back to it through its socket, a
// broadcast one through the segment's multicast group (kernel loopback).
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdmaemu/rdmaemu.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <gtest/gtest.h>


namespace rdmaemu {
namespace {

using namespace std::chrono_literals;
using Mac = std::array<uint8_t, 6>;

constexpr size_t kSlot = 2048;      // one frame buffer
constexpr int kRecvSlots = 8;
constexpr Mac kBroadcast = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
constexpr Mac kOtherMac = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55};

// An Ethernet + IPv4 + UDP frame with `payload` bytes after the UDP header.
std::vector<uint8_t> UdpFrame(const Mac& dst, const Mac& src, uint32_t src_ip, uint32_t dst_ip,
                              uint16_t src_port, uint16_t dst_port, size_t payload = 32) {
  std::vector<uint8_t> f(14 + 20 + 8 + payload, 0);
  std::memcpy(f.data(), dst.data(), 6);
  std::memcpy(f.data() + 6, src.data(), 6);
  f[12] = 0x08;
  f[13] = 0x00;
  uint8_t* ip = f.data() + 14;
  ip[0] = 0x45;
  const uint16_t ip_len = htons(static_cast<uint16_t>(20 + 8 + payload));
  std::memcpy(ip + 2, &ip_len, 2);
  ip[8] = 64;
  ip[9] = IPPROTO_UDP;
  const uint32_t s = htonl(src_ip), d = htonl(dst_ip);
  std::memcpy(ip + 12, &s, 4);
  std::memcpy(ip + 16, &d, 4);
  uint8_t* udp = ip + 20;
  const uint16_t sp = htons(src_port), dp = htons(dst_port), ul = htons(static_cast<uint16_t>(8 + payload));
  std::memcpy(udp, &sp, 2);
  std::memcpy(udp + 2, &dp, 2);
  std::memcpy(udp + 4, &ul, 2);
  for (size_t i = 0; i < payload; ++i) udp[8 + i] = static_cast<uint8_t>(i * 7 + dst_port);
  return f;
}

// A rule attribute with its specs behind it, as verbs.h lays them out
// (every struct is a multiple of 4 bytes with 4-byte alignment: no padding).
struct EthIpUdpRule {
  ibv_flow_attr attr;
  ibv_flow_spec_eth eth;
  ibv_flow_spec_ipv4 ipv4;
  ibv_flow_spec_tcp_udp udp;
};

struct EthRule {
  ibv_flow_attr attr;
  ibv_flow_spec_eth eth;
};

static_assert(sizeof(EthRule) == sizeof(ibv_flow_attr) + sizeof(ibv_flow_spec_eth));
static_assert(sizeof(EthIpUdpRule) == sizeof(ibv_flow_attr) + sizeof(ibv_flow_spec_eth) +
                                         sizeof(ibv_flow_spec_ipv4) + sizeof(ibv_flow_spec_tcp_udp));

EthRule DstMacRule(const Mac& mac, uint16_t priority = 0) {
  EthRule r{};
  r.attr.type = IBV_FLOW_ATTR_NORMAL;
  r.attr.size = sizeof r;
  r.attr.priority = priority;
  r.attr.num_of_specs = 1;
  r.attr.port = 1;
  r.eth.type = IBV_FLOW_SPEC_ETH;
  r.eth.size = sizeof r.eth;
  std::memcpy(r.eth.val.dst_mac, mac.data(), 6);
  std::memset(r.eth.mask.dst_mac, 0xff, 6);
  return r;
}

EthIpUdpRule UdpPortRule(const Mac& mac, uint32_t dst_ip, uint16_t dst_port) {
  EthIpUdpRule r{};
  r.attr.type = IBV_FLOW_ATTR_NORMAL;
  r.attr.size = sizeof r;
  r.attr.num_of_specs = 3;
  r.attr.port = 1;
  r.eth.type = IBV_FLOW_SPEC_ETH;
  r.eth.size = sizeof r.eth;
  std::memcpy(r.eth.val.dst_mac, mac.data(), 6);
  std::memset(r.eth.mask.dst_mac, 0xff, 6);
  r.eth.val.ether_type = htons(0x0800);
  r.eth.mask.ether_type = 0xffff;
  r.ipv4.type = IBV_FLOW_SPEC_IPV4;
  r.ipv4.size = sizeof r.ipv4;
  r.ipv4.val.dst_ip = htonl(dst_ip);
  r.ipv4.mask.dst_ip = 0xffffffff;
  r.udp.type = IBV_FLOW_SPEC_UDP;
  r.udp.size = sizeof r.udp;
  r.udp.val.dst_port = htons(dst_port);
  r.udp.mask.dst_port = 0xffff;
  return r;
}

// One context's side: a PD, a CQ, a registered buffer and raw QPs on port 1.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<uint8_t> buf;
  ibv_mr* mr = nullptr;
  std::vector<ibv_qp*> qps;
  std::vector<ibv_flow*> flows;

  void Open(ibv_device* dev) {
    ctx = ibv_open_device(dev);
    ASSERT_NE(ctx, nullptr);
    pd = ibv_alloc_pd(ctx);
    ASSERT_NE(pd, nullptr);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    buf.assign(4 * kRecvSlots * kSlot, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
  }
  void Close() {
    for (ibv_flow* f : flows) EXPECT_EQ(ibv_destroy_flow(f), 0);
    for (ibv_qp* q : qps) EXPECT_EQ(ibv_destroy_qp(q), 0);
    if (mr != nullptr) {
      EXPECT_EQ(ibv_dereg_mr(mr), 0);
    }
    if (cq != nullptr) {
      EXPECT_EQ(ibv_destroy_cq(cq), 0);
    }
    if (pd != nullptr) {
      EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    }
    if (ctx != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx), 0);
    }
  }

  ibv_qp* CreateRaw() {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RAW_PACKET;
    a.cap.max_send_wr = a.cap.max_recv_wr = kRecvSlots;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &a);
    if (qp != nullptr) qps.push_back(qp);
    return qp;
  }
  // RESET -> INIT (the port alone) -> RTR -> RTS, as on mlx5.
  static int ToRts(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT)) return rc;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return rc;
    a.qp_state = IBV_QPS_RTS;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE);
  }
  ibv_qp* ReadyRaw() {
    ibv_qp* qp = CreateRaw();
    EXPECT_NE(qp, nullptr);
    if (qp != nullptr) {
      EXPECT_EQ(ToRts(qp), 0);
    }
    return qp;
  }
  // Posts receive slot `slot` (cleared) on `qp`, wr_id = slot.
  void PostRecv(ibv_qp* qp, int slot) {
    std::memset(buf.data() + slot * kSlot, 0, kSlot);
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data() + slot * kSlot), kSlot, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  }
  // Sends `frame` from the send area (after the receive slots).
  void Send(ibv_qp* qp, const std::vector<uint8_t>& frame, uint64_t wr_id = 1000) {
    uint8_t* at = buf.data() + 2 * kRecvSlots * kSlot;
    std::memcpy(at, frame.data(), frame.size());
    ibv_sge sge{reinterpret_cast<uintptr_t>(at), static_cast<uint32_t>(frame.size()), mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  }
  // Completions until `n` arrived or `wait` passed.
  std::vector<ibv_wc> Poll(size_t n, std::chrono::milliseconds wait = 3000ms) {
    std::vector<ibv_wc> out;
    const auto until = std::chrono::steady_clock::now() + wait;
    while (out.size() < n && std::chrono::steady_clock::now() < until) {
      ibv_wc wc[8];
      int got = ibv_poll_cq(cq, 8, wc);
      EXPECT_GE(got, 0);
      for (int i = 0; i < got; ++i) out.push_back(wc[i]);
      if (got == 0) std::this_thread::sleep_for(200us);
    }
    return out;
  }
  ibv_flow* Flow(ibv_qp* qp, ibv_flow_attr* attr) {
    ibv_flow* f = ibv_create_flow(qp, attr);
    if (f != nullptr) flows.push_back(f);
    return f;
  }
  void DestroyFlow(ibv_flow* f) {
    std::erase(flows, f);
    EXPECT_EQ(ibv_destroy_flow(f), 0);
  }
};

class RawPacketTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A segment group of this process alone: tests running at once (both
    // engines, other suites) share the host's multicast, so each floods to
    // its own random group of 239/8.
    const uint32_t group = 0xef000000u | (std::random_device{}() & 0xfffffe);
    in_addr a{htonl(group)};
    setenv("RDMAEMU_RAW_SEGMENT", inet_ntoa(a), 1);
  }

  void SetUp() override {
    list_ = ibv_get_device_list(nullptr);
    ASSERT_NE(list_, nullptr);
    ASSERT_NE(list_[0], nullptr);
    ASSERT_NO_FATAL_FAILURE(tx_.Open(list_[0]));
    ASSERT_NO_FATAL_FAILURE(rx_.Open(list_[0]));
    in_addr address{};
    ASSERT_EQ(rdmaemu_query_port_address(tx_.ctx, 1, &address, nullptr), 0);
    ip_ = ntohl(address.s_addr);
    // The port's MAC: 02:00 and its IPv4 address (docs/raw-packet.md).
    mac_ = {0x02, 0x00, static_cast<uint8_t>(ip_ >> 24), static_cast<uint8_t>(ip_ >> 16),
            static_cast<uint8_t>(ip_ >> 8), static_cast<uint8_t>(ip_)};
  }
  void TearDown() override {
    rx_.Close();
    tx_.Close();
    if (list_ != nullptr) ibv_free_device_list(list_);
  }

  uint64_t PortCounter(uint64_t rdmaemu_counters::*field) {
    rdmaemu_counters c{};
    c.size = sizeof c;
    EXPECT_EQ(rdmaemu_query_counters(tx_.ctx, 1, &c), 0);
    return c.*field;
  }

  // Sends `frame` from `qp` and checks its send completion.
  void SendOk(ibv_qp* qp, const std::vector<uint8_t>& frame) {
    ASSERT_NO_FATAL_FAILURE(tx_.Send(qp, frame));
    auto wcs = tx_.Poll(1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
    EXPECT_EQ(wcs[0].opcode, IBV_WC_SEND);
  }

  // Checks that one receive completion for `qp` holds `frame` from byte 0.
  void ExpectFrame(const ibv_wc& wc, ibv_qp* qp, const std::vector<uint8_t>& frame) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.qp_num, qp->qp_num);
    EXPECT_EQ(wc.byte_len, frame.size());
    EXPECT_EQ(0, std::memcmp(rx_.buf.data() + wc.wr_id * kSlot, frame.data(), frame.size()));
  }

  ibv_device** list_ = nullptr;
  Side tx_, rx_;
  uint32_t ip_ = 0;
  Mac mac_{};
};

TEST_F(RawPacketTest, CapsAndStateMachineAreMlx5s) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(tx_.ctx, nullptr, &attr), 0);
  EXPECT_EQ(attr.raw_packet_caps, 0u);  // no offloads: none is claimed
  EXPECT_TRUE(attr.rss_caps.supported_qpts & (1u << IBV_QPT_RAW_PACKET));
  ibv_qp* qp = tx_.CreateRaw();
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 7;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_QKEY), EINVAL);
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);  // the port is required
  EXPECT_EQ(Side::ToRts(qp), 0);
  EXPECT_EQ(qp->state, IBV_QPS_RTS);
}

TEST_F(RawPacketTest, FrameToTheOwnMacReachesTheRuleWholeAndWithoutGrh) {
  ibv_qp* a = tx_.ReadyRaw();
  ibv_qp* b = rx_.ReadyRaw();
  ASSERT_TRUE(a && b);
  EthRule r = DstMacRule(mac_);
  ASSERT_NE(rx_.Flow(b, &r.attr), nullptr) << strerror(errno);
  rx_.PostRecv(b, 0);
  const auto frame = UdpFrame(mac_, kOtherMac, 0x0a000001, 0x0a000002, 1000, 2000, 100);
  SendOk(a, frame);
  auto wcs = rx_.Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  ExpectFrame(wcs[0], b, frame);
  EXPECT_EQ(wcs[0].wc_flags & IBV_WC_GRH, 0u);
}

TEST_F(RawPacketTest, RulesSteerByIpAndUdpPortAndUnmatchedFramesAreDropped) {
  ibv_qp* a = tx_.ReadyRaw();
  ibv_qp* b = rx_.ReadyRaw();
  ibv_qp* c = rx_.ReadyRaw();
  ASSERT_TRUE(a && b && c);
  EthIpUdpRule rb = UdpPortRule(mac_, 0x0a000002, 4000);
  EthIpUdpRule rc = UdpPortRule(mac_, 0x0a000002, 5000);
  ASSERT_NE(rx_.Flow(b, &rb.attr), nullptr) << strerror(errno);
  ASSERT_NE(rx_.Flow(c, &rc.attr), nullptr) << strerror(errno);
  for (int i = 0; i < 3; ++i) rx_.PostRecv(b, i);
  for (int i = 3; i < 6; ++i) rx_.PostRecv(c, i);
  const uint64_t dropped = PortCounter(&rdmaemu_counters::dropped_no_flow);
  const auto to_b = UdpFrame(mac_, kOtherMac, 0x0a000001, 0x0a000002, 9, 4000);
  const auto to_c = UdpFrame(mac_, kOtherMac, 0x0a000001, 0x0a000002, 9, 5000);
  const auto to_nobody = UdpFrame(mac_, kOtherMac, 0x0a000001, 0x0a000002, 9, 6000);
  const auto wrong_ip = UdpFrame(mac_, kOtherMac, 0x0a000001, 0x0a000003, 9, 4000);
  SendOk(a, to_nobody);
  SendOk(a, wrong_ip);
  SendOk(a, to_c);
  SendOk(a, to_b);
  auto wcs = rx_.Poll(2);
  ASSERT_EQ(wcs.size(), 2u);
  // Nothing else arrives.
  EXPECT_TRUE(rx_.Poll(1, 300ms).empty());
  for (const ibv_wc& wc : wcs) {
    if (wc.qp_num == b->qp_num) {
      ExpectFrame(wc, b, to_b);
    } else {
      ExpectFrame(wc, c, to_c);
    }
  }
  EXPECT_NE(wcs[0].qp_num, wcs[1].qp_num);
  EXPECT_EQ(PortCounter(&rdmaemu_counters::dropped_no_flow), dropped + 2);
}

TEST_F(RawPacketTest, DestroyFlowStopsDelivery) {
  ibv_qp* a = tx_.ReadyRaw();
  ibv_qp* b = rx_.ReadyRaw();
  ASSERT_TRUE(a && b);
  EthRule r = DstMacRule(mac_);
  ibv_flow* f = rx_.Flow(b, &r.attr);
  ASSERT_NE(f, nullptr);
  rx_.PostRecv(b, 0);
  rx_.PostRecv(b, 1);
  const auto frame = UdpFrame(mac_, kOtherMac, 1, 2, 3, 4);
  SendOk(a, frame);
  ASSERT_EQ(rx_.Poll(1).size(), 1u);
  // A QP that rules steer to cannot go (the kernel holds it for them).
  EXPECT_EQ(ibv_destroy_qp(b), EBUSY);
  rx_.DestroyFlow(f);
  SendOk(a, frame);
  EXPECT_TRUE(rx_.Poll(1, 300ms).empty());
}

TEST_F(RawPacketTest, BestPriorityWins) {
  ibv_qp* a = tx_.ReadyRaw();
  ibv_qp* b = rx_.ReadyRaw();
  ibv_qp* c = rx_.ReadyRaw();
  ASSERT_TRUE(a && b && c);
  EthRule weak = DstMacRule(mac_, 7);
  EthRule strong = DstMacRule(mac_, 2);
  ASSERT_NE(rx_.Flow(b, &weak.attr), nullptr);
  ASSERT_NE(rx_.Flow(c, &strong.attr), nullptr);
  rx_.PostRecv(b, 0);
  rx_.PostRecv(c, 1);
  SendOk(a, UdpFrame(mac_, kOtherMac, 1, 2, 3, 4));
  auto wcs = rx_.Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].qp_num, c->qp_num);
  EXPECT_TRUE(rx_.Poll(1, 300ms).empty());
}

TEST_F(RawPacketTest, BroadcastIsFloodedToTheSegmentAndDefaultRulesTakeTheRest) {
  ibv_qp* a = tx_.ReadyRaw();
  ibv_qp* b = rx_.ReadyRaw();
  ibv_qp* d = rx_.ReadyRaw();
  ASSERT_TRUE(a && b && d);
  EthRule r = DstMacRule(kBroadcast);
  ASSERT_NE(rx_.Flow(b, &r.attr), nullptr);
  ibv_flow_attr all{};
  all.type = IBV_FLOW_ATTR_ALL_DEFAULT;
  all.size = sizeof all;
  all.port = 1;
  ASSERT_NE(rx_.Flow(d, &all), nullptr) << strerror(errno);
  rx_.PostRecv(b, 0);
  rx_.PostRecv(d, 1);
  const auto broadcast = UdpFrame(kBroadcast, mac_, 1, 2, 3, 4);
  // Unknown unicast is flooded too: a MAC of no emulated port.
  const auto unknown = UdpFrame(kOtherMac, mac_, 1, 2, 3, 4);
  SendOk(a, broadcast);
  SendOk(a, unknown);
  auto wcs = rx_.Poll(2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) {
    if (wc.qp_num == b->qp_num) {
      ExpectFrame(wc, b, broadcast);
    } else {
      ExpectFrame(wc, d, unknown);
    }
  }
  EXPECT_NE(wcs[0].qp_num, wcs[1].qp_num);
}

TEST_F(RawPacketTest, BadRulesAreRefused) {
  ibv_qp* b = rx_.ReadyRaw();
  ASSERT_NE(b, nullptr);
  EthRule r = DstMacRule(mac_);
  r.eth.size = sizeof r.eth - 4;
  errno = 0;
  EXPECT_EQ(rx_.Flow(b, &r.attr), nullptr);
  EXPECT_EQ(errno, EINVAL);

  r = DstMacRule(mac_);
  r.attr.comp_mask = 1;
  EXPECT_EQ(rx_.Flow(b, &r.attr), nullptr);
  EXPECT_EQ(errno, EINVAL);

  r = DstMacRule(mac_);
  r.attr.port = 9;
  EXPECT_EQ(rx_.Flow(b, &r.attr), nullptr);
  EXPECT_EQ(errno, EINVAL);

  r = DstMacRule(mac_);
  r.attr.type = IBV_FLOW_ATTR_SNIFFER;  // default and sniffer rules take no specs
  EXPECT_EQ(rx_.Flow(b, &r.attr), nullptr);
  EXPECT_EQ(errno, EINVAL);

  r = DstMacRule(mac_);
  r.attr.flags = IBV_FLOW_ATTR_FLAGS_EGRESS;
  EXPECT_EQ(rx_.Flow(b, &r.attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);

  struct {
    ibv_flow_attr attr;
    ibv_flow_spec_tunnel vxlan;
  } t{};
  t.attr.size = sizeof t;
  t.attr.num_of_specs = 1;
  t.attr.port = 1;
  t.vxlan.type = IBV_FLOW_SPEC_VXLAN_TUNNEL;
  t.vxlan.size = sizeof t.vxlan;
  EXPECT_EQ(rx_.Flow(b, &t.attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);

  // Flows steer to raw packet QPs only.
  ibv_qp_init_attr ud{};
  ud.send_cq = ud.recv_cq = rx_.cq;
  ud.qp_type = IBV_QPT_UD;
  ud.cap.max_send_wr = ud.cap.max_recv_wr = 1;
  ud.cap.max_send_sge = ud.cap.max_recv_sge = 1;
  ibv_qp* udqp = ibv_create_qp(rx_.pd, &ud);
  ASSERT_NE(udqp, nullptr);
  rx_.qps.push_back(udqp);
  r = DstMacRule(mac_);
  EXPECT_EQ(rx_.Flow(udqp, &r.attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(RawPacketTest, BadFramesFailTheirSendAndImmediateDataIsRefused) {
  ibv_qp* a = tx_.ReadyRaw();
  ASSERT_NE(a, nullptr);
  ASSERT_NO_FATAL_FAILURE(tx_.Send(a, std::vector<uint8_t>(10, 0)));  // shorter than a header
  auto wcs = tx_.Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_LEN_ERR);
  ibv_sge sge{reinterpret_cast<uintptr_t>(tx_.buf.data()), 64, tx_.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
}

// Raw frames and RoCE packets share the port's socket and the engine; a
// small frame sent must leave nothing behind that a larger packet trips on.
TEST_F(RawPacketTest, RocePacketsStillFlowAfterRawFrames) {
  ibv_qp* a = tx_.ReadyRaw();
  ASSERT_NE(a, nullptr);
  SendOk(a, UdpFrame(mac_, kOtherMac, 1, 2, 3, 4, 8));  // a frame of 50 bytes
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = rx_.cq;
  init.qp_type = IBV_QPT_UD;
  init.cap.max_send_wr = init.cap.max_recv_wr = 2;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  ibv_qp* ud = ibv_create_qp(rx_.pd, &init);
  ASSERT_NE(ud, nullptr);
  rx_.qps.push_back(ud);
  ibv_qp_attr qa{};
  qa.qp_state = IBV_QPS_INIT;
  qa.port_num = 1;
  qa.qkey = 0x1234;
  ASSERT_EQ(ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  qa = {};
  qa.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(ibv_modify_qp(ud, &qa, IBV_QP_STATE), 0);
  qa.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(rx_.ctx, 1, 0, &gid), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = gid;
  ah_attr.grh.hop_limit = 1;
  ah_attr.port_num = 1;
  ibv_ah* ah = ibv_create_ah(rx_.pd, &ah_attr);
  ASSERT_NE(ah, nullptr);
  rx_.PostRecv(ud, 0);
  constexpr uint32_t kBytes = 1000;  // far more than the frame's
  ibv_sge sge{reinterpret_cast<uintptr_t>(rx_.buf.data() + 2 * kRecvSlots * kSlot), kBytes,
              rx_.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 77;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = ud->qp_num;
  wr.wr.ud.remote_qkey = 0x1234;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(ud, &wr, &bad), 0);
  auto wcs = rx_.Poll(2);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    if (wc.opcode == IBV_WC_RECV) {
      EXPECT_EQ(wc.byte_len, 40 + kBytes);
    }
  }
}

TEST_F(RawPacketTest, MalformedEncapsulationIsDroppedAndCounted) {
  ibv_qp* b = rx_.ReadyRaw();
  ASSERT_NE(b, nullptr);
  EthRule r = DstMacRule(mac_);
  ASSERT_NE(rx_.Flow(b, &r.attr), nullptr);
  rx_.PostRecv(b, 0);
  const uint64_t malformed = PortCounter(&rdmaemu_counters::dropped_malformed);
  // The raw frame marker with 5 bytes behind it: no Ethernet header.
  const uint8_t datagram[] = {0xff, 'E', 'T', 'H', 1, 0, 0, 0, 1, 2, 3, 4, 5};
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(4791);
  to.sin_addr.s_addr = htonl(ip_);
  ASSERT_EQ(sendto(fd, datagram, sizeof datagram, 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
            static_cast<ssize_t>(sizeof datagram));
  close(fd);
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (PortCounter(&rdmaemu_counters::dropped_malformed) == malformed &&
         std::chrono::steady_clock::now() < until) {
    rx_.Poll(1, 10ms);
  }
  EXPECT_EQ(PortCounter(&rdmaemu_counters::dropped_malformed), malformed + 1);
  EXPECT_TRUE(rx_.Poll(1, 100ms).empty());
}

}  // namespace
}  // namespace rdmaemu
