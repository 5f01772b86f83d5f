// Counters per device, port and QP (issue 5, item 6), read through the C
// API in rdmaemu/rdmaemu.h while a fake peer sends the engine exactly known
// packets: packets and bytes each way, drops, RNR NAKs, duplicates,
// out-of-sequence requests, rkey violations, timeouts and retransmissions;
// and what fault rules did, between two QPs of the device, on the QP each
// rule hit. Built twice, once per engine backend.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>

#include "emulator/engine/engine.h"
#include "rdmaemu/rdmaemu.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {
namespace {

using wire::Opcode;

rdmaemu_counters Qp(ibv_qp* qp) {
  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_qp_counters(qp, &c), 0);
  return c;
}

rdmaemu_counters Port(ibv_context* ctx, uint8_t port) {
  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_counters(ctx, port, &c), 0);
  return c;
}

class CountersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok());
    buf_ = emu_.Register(16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(buf_, nullptr);
  }
  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
};

TEST_F(CountersTest, PacketsAndBytesEachWayOnTheQpAndThePort) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostRecv(qp, 1, *buf_, 0, 256), 0);
  const auto q0 = Qp(qp);
  const auto p0 = Port(emu_.ctx(), 1);
  EXPECT_EQ(q0.size, sizeof(rdmaemu_counters));
  EXPECT_EQ(q0.packets_received, 0u) << "a new QP starts at zero";

  auto sent = peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100),
                          std::vector<uint8_t>(50, 7));
  auto ack = peer_->Receive();
  ASSERT_TRUE(ack.has_value());
  ASSERT_TRUE(emu_.Poll().has_value());

  const auto q = Qp(qp);
  EXPECT_EQ(q.packets_received, 1u);
  EXPECT_EQ(q.bytes_received, sent.size());
  EXPECT_EQ(sent.size(), 12u + 52u + 4u) << "BTH, 50 bytes padded to 52, ICRC";
  EXPECT_EQ(q.packets_sent, 1u);
  EXPECT_EQ(q.bytes_sent, ack->bytes.size());
  EXPECT_EQ(ack->bytes.size(), 20u) << "BTH, AETH, ICRC";
  const auto p = Port(emu_.ctx(), 1);
  EXPECT_EQ(p.packets_received - p0.packets_received, 1u);
  EXPECT_EQ(p.bytes_received - p0.bytes_received, sent.size());
  EXPECT_EQ(p.packets_sent - p0.packets_sent, 1u);
  EXPECT_EQ(p.bytes_sent - p0.bytes_sent, 20u);
}

TEST_F(CountersTest, DropsCountOnThePortAndTheQpTheyReached) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  const auto q0 = Qp(qp);
  const auto p0 = Port(emu_.ctx(), 1);
  // A corrupted packet (ICRC wrong) for the QP: no QP can trust it.
  auto bytes = peer_->Build(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100),
                            std::vector<uint8_t>(16, 1));
  bytes[bytes.size() - 1] ^= 1;
  peer_->SendRaw(bytes);
  // A packet for a QP that does not exist.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, 0xfedcb, 100), std::vector<uint8_t>(16, 1));
  // Wrong P_Key: another partition (0x7fff, the limited member of the QP's
  // default partition, would match). Checked against the QP's own P_Key, so
  // the violation is the QP's too.
  auto f = FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100);
  f.bth.pkey = 0x8001;
  peer_->Send(f, std::vector<uint8_t>(16, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  const auto p = Port(emu_.ctx(), 1);
  EXPECT_EQ(p.packets_received - p0.packets_received, 3u);
  EXPECT_EQ(p.dropped_icrc - p0.dropped_icrc, 1u);
  EXPECT_EQ(p.dropped_unknown_qpn - p0.dropped_unknown_qpn, 1u);
  EXPECT_EQ(p.dropped_pkey - p0.dropped_pkey, 1u);
  const auto q = Qp(qp);
  EXPECT_EQ(q.packets_received - q0.packets_received, 1u) << "only the P_Key violation reached the QP";
  EXPECT_EQ(q.dropped_pkey - q0.dropped_pkey, 1u);
  EXPECT_EQ(q.dropped_icrc, 0u);
}

// A packet of another transport for one of our QP numbers (a UC peer of an
// earlier process that had our address, say) is dropped and counted on the
// port it arrived on, while the application modifies the QP: counting it
// must not read the QP's path, which ibv_modify_qp writes under the QP's
// lock (a data race ThreadSanitizer reported with ibv_srq_pingpong).
TEST_F(CountersTest, WrongTransportCountsOnThePortItArrivedOnDuringModify) {
  ibv_qp* qp = emu_.CreateQp();
  ASSERT_NE(qp, nullptr);
  const auto q0 = Qp(qp);
  const auto p0 = Port(emu_.ctx(), 1);
  constexpr int kPackets = 200;
  std::thread stray([&] {
    for (int i = 0; i < kPackets; ++i) {
      peer_->Send(FakePeer::Request(Opcode::UC_SEND_ONLY, qp->qp_num, 100 + i), std::vector<uint8_t>(16, 1));
    }
  });
  RcParams p;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(emu_.ToInit(qp, p), 0);  // writes the QP's port
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &reset, IBV_QP_STATE), 0);
  }
  stray.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Qp(qp).dropped_bad_state - q0.dropped_bad_state, uint64_t{kPackets});
  EXPECT_EQ(Port(emu_.ctx(), 1).dropped_bad_state - p0.dropped_bad_state, uint64_t{kPackets});
}

TEST_F(CountersTest, RnrNakDuplicateOutOfSequenceAndRkeyViolation) {
  ibv_qp* qp = emu_.ConnectedQp();
  ASSERT_NE(qp, nullptr);
  // No receive posted: RNR NAK.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  auto rx = peer_->Receive();
  ASSERT_TRUE(rx.has_value());
  EXPECT_EQ(rx->aeth_type(), wire::AethType::kRnrNak);
  EXPECT_EQ(Qp(qp).rnr_naks_sent, 1u);

  ASSERT_EQ(emu_.PostRecv(qp, 1, *buf_, 0, 256), 0);
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  // The same PSN again: a duplicate, acknowledged again.
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 100), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  EXPECT_EQ(Qp(qp).duplicates, 1u);
  // PSN 103 when 101 is expected: out of sequence (one NAK).
  peer_->Send(FakePeer::Request(Opcode::RC_SEND_ONLY, qp->qp_num, 103), std::vector<uint8_t>(8, 1));
  ASSERT_TRUE(peer_->Receive().has_value());
  EXPECT_EQ(Qp(qp).out_of_sequence, 1u);
  // A WRITE with an rkey no region has: remote access NAK, the QP to ERR.
  auto w = FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qp->qp_num, 101);
  w.reth = {buf_->addr(), 0x123456, 8};
  peer_->Send(w, std::vector<uint8_t>(8, 1));
  rx = peer_->Receive();
  ASSERT_TRUE(rx.has_value());
  EXPECT_EQ(rx->aeth_type(), wire::AethType::kNak);
  const auto q = Qp(qp);
  EXPECT_EQ(q.rkey_violations, 1u);
  EXPECT_EQ(q.packets_received, 5u);
  EXPECT_EQ(q.packets_sent, 5u);
}

TEST_F(CountersTest, TimeoutsAndRetransmissions) {
  RcParams params;
  params.timeout = 12;  // ~16.8 ms
  params.retry_cnt = 2;
  ibv_qp* qp = emu_.ConnectedQp(params);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(emu_.PostSend(qp, 9, IBV_WR_SEND, *buf_, 0, 64), 0);
  // The peer never answers: the first send and two retries, then ERR.
  auto first = peer_->Receive();
  ASSERT_TRUE(first.has_value());
  auto retry1 = peer_->Receive();
  auto retry2 = peer_->Receive();
  ASSERT_TRUE(retry1.has_value() && retry2.has_value());
  EXPECT_EQ(retry1->psn, first->psn);
  auto wc = emu_.Poll();
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_RETRY_EXC_ERR);
  const auto q = Qp(qp);
  EXPECT_EQ(q.timeouts, 3u) << "two that retried, one that gave up";
  EXPECT_EQ(q.retransmissions, 2u);
  EXPECT_EQ(q.packets_sent, 3u);
}

TEST_F(CountersTest, DeviceIsTheSumOfPortsAndSizeIsHonoured) {
  const auto dev = Port(emu_.ctx(), 0);
  const auto p1 = Port(emu_.ctx(), 1);
  EXPECT_GE(p1.packets_received, dev.packets_received) << "one port: the device is port 1";

  rdmaemu_counters c{};
  c.size = sizeof(c);
  EXPECT_EQ(rdmaemu_query_counters(emu_.ctx(), 3, &c), EINVAL) << "no port 3";
  c.size = 4;
  EXPECT_EQ(rdmaemu_query_counters(emu_.ctx(), 1, &c), EINVAL) << "size below the header";
  EXPECT_EQ(rdmaemu_query_counters(emu_.ctx(), 1, nullptr), EINVAL);

  // An older caller that knows only the first two counters gets only them.
  rdmaemu_counters old;
  std::memset(&old, 0xee, sizeof(old));
  old.size = offsetof(rdmaemu_counters, packets_received);
  ASSERT_EQ(rdmaemu_query_counters(emu_.ctx(), 1, &old), 0);
  EXPECT_EQ(old.size, offsetof(rdmaemu_counters, packets_received));
  EXPECT_EQ(old.reserved, 0u);
  EXPECT_NE(old.packets_sent, 0xeeeeeeeeeeeeeeeeull);
  EXPECT_EQ(old.packets_received, 0xeeeeeeeeeeeeeeeeull) << "nothing past `size` is written";
}

// Fault rules (docs/faults.md) on a real transfer between two QPs of the
// device, each rule picking one packet of one QP by a count trigger: however
// the retransmissions they cause interleave, each rule fires exactly once
// (every rule matches more packets than its count).
class FaultCountersTest : public CountersTest {
 protected:
  void SetUp() override {
    CountersTest::SetUp();
    ASSERT_FALSE(HasFatalFailure());
    engine_ = engine::AcquireEngine(0).value();
    ASSERT_EQ(rdmaemu_fault_clear(emu_.ctx()), 0);
    RcParams p;
    p.timeout = 1;  // the engine's floor, 5 ms: a lost last packet costs little
    p.min_rnr_timer = 1;
    std::tie(a_, b_) = emu_.ConnectedPair(p);
    ASSERT_NE(a_, nullptr);
    data_ = emu_.Register(256 * 1024, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(data_, nullptr);
  }
  void TearDown() override {
    if (emu_.ok()) rdmaemu_fault_clear(emu_.ctx());
  }
  void AddFaults(const std::string& rules) {
    ASSERT_EQ(rdmaemu_fault_add(emu_.ctx(), rules.c_str()), 0) << rules;
  }
  std::string Qpn(ibv_qp* qp) { return std::to_string(qp->qp_num); }

  // `n` SENDs of 64 bytes from a_ to b_, every one delivered once and in
  // order, every completion a success.
  void Transfer(int n) {
    for (int i = 0; i < n; ++i) ASSERT_EQ(emu_.PostRecv(b_, 100 + i, *data_, 8192 + i * 64, 64), 0);
    for (int i = 0; i < n; ++i) ASSERT_EQ(emu_.PostSend(a_, i, IBV_WR_SEND, *data_, i * 64, 64), 0);
    int sends = 0, recvs = 0;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((sends < n || recvs < n) && std::chrono::steady_clock::now() < deadline) {
      for (const ibv_wc& wc : emu_.PollAll(10ms)) {
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
        if (wc.opcode == IBV_WC_RECV) {
          EXPECT_EQ(wc.wr_id, 100u + recvs++);
        } else {
          EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(sends++));
        }
      }
    }
    ASSERT_EQ(sends, n);
    ASSERT_EQ(recvs, n);
  }

  std::shared_ptr<engine::Engine> engine_;
  EmuRc::Buffer* data_ = nullptr;
  ibv_qp* a_ = nullptr;  // the requester
  ibv_qp* b_ = nullptr;  // the responder
};

// The fault_ counters of c, for comparing whole sets.
struct FaultCounts {
  uint64_t dropped, duplicated, corrupted, delayed, reordered, forced, shaped, overflows;
  bool operator==(const FaultCounts&) const = default;
  friend std::ostream& operator<<(std::ostream& os, const FaultCounts& f) {
    return os << "{dropped " << f.dropped << ", duplicated " << f.duplicated << ", corrupted "
              << f.corrupted << ", delayed " << f.delayed << ", reordered " << f.reordered
              << ", forced " << f.forced << ", shaped " << f.shaped << ", overflows "
              << f.overflows << "}";
  }
};

FaultCounts FaultsOf(const rdmaemu_counters& c) {
  return {c.fault_dropped, c.fault_duplicated, c.fault_corrupted, c.fault_delayed,
          c.fault_reordered, c.fault_forced, c.fault_shaped, c.fault_overflows};
}

FaultCounts operator-(const FaultCounts& x, const FaultCounts& y) {
  return {x.dropped - y.dropped,     x.duplicated - y.duplicated, x.corrupted - y.corrupted,
          x.delayed - y.delayed,     x.reordered - y.reordered,   x.forced - y.forced,
          x.shaped - y.shaped,       x.overflows - y.overflows};
}

TEST_F(FaultCountersTest, PacketFaultsCountOnThePortAndOnTheQpTheyHit) {
  const FaultCounts port0 = FaultsOf(Port(emu_.ctx(), 1));
  const FaultCounts dev0 = FaultsOf(Port(emu_.ctx(), 0));
  const fault::FaultCounters inj0 = engine_->fault_counters();
  const uint64_t icrc0 = Port(emu_.ctx(), 1).dropped_icrc;
  // Sent by a_ (a packet sent counts on its sender) ...
  AddFaults("drop=#3@qpn=" + Qpn(a_) + ",op=SEND; dup=#2@qpn=" + Qpn(a_) +
            ",op=SEND; corrupt=#1@qpn=" + Qpn(a_) + ",op=SEND");
  // ... and received by b_ (a packet received counts on its destination).
  AddFaults("delay=1ms/#2@dir=rx,qpn=" + Qpn(b_) + "; reorder=#4@dir=rx,qpn=" + Qpn(b_));
  Transfer(8);

  const FaultCounts on_a{1, 1, 1, 0, 0, 0, 0, 0};
  const FaultCounts on_b{0, 0, 0, 1, 1, 0, 0, 0};
  const FaultCounts both{1, 1, 1, 1, 1, 0, 0, 0};
  EXPECT_EQ(FaultsOf(Qp(a_)), on_a);
  EXPECT_EQ(FaultsOf(Qp(b_)), on_b);
  EXPECT_EQ(FaultsOf(Port(emu_.ctx(), 1)) - port0, both);
  EXPECT_EQ(FaultsOf(Port(emu_.ctx(), 0)) - dev0, both) << "the device is its one port";
  // The device-wide counters of the injector (rdmaemu_fault_list's) agree.
  const fault::FaultCounters inj = engine_->fault_counters();
  EXPECT_EQ(inj.dropped - inj0.dropped, 1u);
  EXPECT_EQ(inj.duplicated - inj0.duplicated, 1u);
  EXPECT_EQ(inj.corrupted - inj0.corrupted, 1u);
  EXPECT_EQ(inj.delayed - inj0.delayed, 1u);
  EXPECT_EQ(inj.reordered - inj0.reordered, 1u);
  // What a fault caused is counted where it always was: the corrupted packet
  // was dropped for its ICRC before it was known to be b_'s (the port only).
  EXPECT_EQ(Port(emu_.ctx(), 1).dropped_icrc - icrc0, 1u);
  EXPECT_EQ(Qp(b_).dropped_icrc, 0u);
}

TEST_F(FaultCountersTest, ForcedEventsCountOnTheQpThatReceived) {
  const FaultCounts port0 = FaultsOf(Port(emu_.ctx(), 1));
  AddFaults("rnr=#1@qpn=" + Qpn(b_) + "; nak=seq/#2@qpn=" + Qpn(b_));
  Transfer(4);
  EXPECT_EQ(FaultsOf(Qp(b_)), (FaultCounts{0, 0, 0, 0, 0, 2, 0, 0}));
  EXPECT_EQ(FaultsOf(Qp(a_)), (FaultCounts{}));
  EXPECT_EQ(FaultsOf(Port(emu_.ctx(), 1)) - port0, (FaultCounts{0, 0, 0, 0, 0, 2, 0, 0}));
  EXPECT_EQ(Qp(b_).rnr_naks_sent, 1u);
  EXPECT_EQ(Qp(a_).rnr_naks_received, 1u);
}

TEST_F(FaultCountersTest, ShapedPacketsCountOnTheirSender) {
  const FaultCounts port0 = FaultsOf(Port(emu_.ctx(), 1));
  // 64 KiB of WRITE at 20 Mb/s: about 27 ms, nearly every packet waits.
  AddFaults("rate=20mbps");
  ASSERT_EQ(emu_.PostSend(a_, 1, IBV_WR_RDMA_WRITE, *data_, 0, 65536, data_->addr() + 65536,
                          data_->mr->rkey),
            0);
  auto wc = emu_.Poll(5000ms);
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, IBV_WC_SUCCESS);
  // The 5 ms timer fires behind a 27 ms burst, so retransmissions and the
  // ACKs they draw may still be crossing the shaped link after the
  // completion: read once nothing has moved for 50 ms.
  rdmaemu_counters qa{}, qb{}, port{};
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (uint64_t last = ~0ull; std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
    qa = Qp(a_);
    qb = Qp(b_);
    port = Port(emu_.ctx(), 1);
    const uint64_t total = qa.fault_shaped + qb.fault_shaped + port.fault_shaped + port.packets_sent;
    if (total == last) break;
    last = total;
  }
  const uint64_t on_a = qa.fault_shaped, on_b = qb.fault_shaped;
  EXPECT_GE(on_a, 32u) << "64 packets of 1 KiB, most of them behind the burst";
  // (More than 64 when the 5 ms timer fired first: retransmissions wait too.)
  EXPECT_LE(on_a, qa.packets_sent);
  EXPECT_LE(on_b, qb.packets_sent);
  EXPECT_EQ(FaultsOf(port).shaped - port0.shaped, on_a + on_b)
      << "b_'s ACKs are shaped too, and nothing else";
  EXPECT_EQ(Qp(a_).fault_dropped + Qp(b_).fault_dropped, 0u);
}

}  // namespace
}  // namespace rdmaemu::testing
