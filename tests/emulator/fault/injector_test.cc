// The injector with a fake sink and a fake clock: each rule kind does what
// it says to exactly the packets its filter and trigger pick, decisions are
// reproducible whatever the interleaving, and held packets (delay, reorder,
// shaping) leave when they should.
#include "emulator/fault/injector.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "emulator/fault/decide.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/packet.h"

namespace rdmaemu::fault {
namespace {

using namespace std::chrono_literals;
using wire::Opcode;

constexpr uint32_t kSrcIp = 0x7f000001;
constexpr uint32_t kDstIp = 0x7f000002;
constexpr uint64_t kRate100G = 100000000000ull;

struct Sent {
  bool tx;
  uint32_t qpn;
  uint32_t psn;
  uint8_t opcode;
  std::vector<uint8_t> bytes;
  Clock::time_point at;
  uint8_t port = 0;  // tx: the port to send from; rx: the receiving socket + 1
};

class FakeSink : public PacketSink {
 public:
  void SendNow(uint8_t port, const sockaddr_in& to, std::span<const uint8_t> bytes, uint8_t) override {
    Record(true, bytes, port);
  }
  void Deliver(const net::Datagram& d) override {
    Record(false, d.data, static_cast<uint8_t>(d.socket + 1));
  }
  void Counted(FaultEvent what, uint8_t port, uint32_t local_qpn, uint64_t n) override {
    counted.push_back({what, port, local_qpn, n});
  }
  struct Report {
    FaultEvent what;
    uint8_t port;
    uint32_t local_qpn;
    uint64_t n;
    bool operator==(const Report&) const = default;
  };
  Clock::time_point now{};
  std::vector<Sent> out;
  std::vector<Report> counted;  // what Counted was told, in order

 private:
  void Record(bool tx, std::span<const uint8_t> bytes, uint8_t port) {
    wire::ConstBthView bth(bytes);
    out.push_back(
        {tx, bth.dest_qpn(), bth.psn(), bth.opcode(), {bytes.begin(), bytes.end()}, now, port});
  }
};

// A real packet (correct ICRC for kSrcIp -> kDstIp).
std::vector<uint8_t> Build(Opcode op, uint32_t qpn, uint32_t psn, size_t payload = 64) {
  wire::PacketFields f;
  f.opcode = op;
  f.bth.dest_qpn = qpn;
  f.bth.psn = psn;
  std::vector<uint8_t> data(wire::InfoOf(op).Has(wire::kPayloadMask) ? payload : 0, 0x5a);
  std::vector<uint8_t> out(wire::kMaxPacketBytes);
  wire::IcrcAddressing addr{kSrcIp, kDstIp, 4791, 4791};
  auto len = wire::BuildPacket(f, std::span<const uint8_t>(data), out, &addr);
  EXPECT_TRUE(len.ok()) << len.status().message();
  out.resize(len.ok() ? *len : 0);
  return out;
}

struct Harness {
  explicit Harness(std::string_view rules, std::vector<uint64_t> rates = {kRate100G})
      : owned(std::make_unique<Injector>("emu0", std::move(rates))), injector(*owned) {
    Status s = injector.Add(rules);
    EXPECT_TRUE(s.ok()) << s.message();
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(kDstIp);
    to.sin_port = htons(4791);
  }
  void Tx(Opcode op, uint32_t qpn, uint32_t psn, uint32_t local_qpn = 0x11, size_t payload = 64,
          uint8_t port = 1) {
    auto bytes = Build(op, qpn, psn, payload);
    PacketMeta m{kTx, port, local_qpn, qpn, psn, static_cast<uint8_t>(op)};
    injector.Egress(m, bytes, to, sink.now, sink);
  }
  void Rx(Opcode op, uint32_t qpn, uint32_t psn, uint8_t port = 1) {
    auto bytes = Build(op, qpn, psn);
    net::Datagram d{to, in_addr{htonl(kDstIp)}, bytes, port - 1};
    PacketMeta m{kRx, port, qpn, qpn, psn, static_cast<uint8_t>(op)};
    injector.Ingress(m, d, sink.now, sink);
  }
  std::optional<Clock::time_point> Advance(Duration d) {
    sink.now += d;
    return injector.Flush(sink.now, sink);
  }
  // On the heap: an Injector holds two 1 MiB occurrence tables, and a test
  // with several Harnesses in one frame overflowed the stack under ASan.
  std::unique_ptr<Injector> owned;
  Injector& injector;
  FakeSink sink;
  sockaddr_in to{};
};

// Which (qpn, psn) pairs got through.
std::set<std::pair<uint32_t, uint32_t>> Through(const FakeSink& sink) {
  std::set<std::pair<uint32_t, uint32_t>> s;
  for (const Sent& p : sink.out) s.insert({p.qpn, p.psn});
  return s;
}

TEST(FaultDecide, SameSeedSameDecisionsWhateverTheInterleaving) {
  // Two QPs' packets in two different orders: every packet meets the same fate.
  Harness a("drop=0.3,seed=7");
  Harness b("drop=0.3,seed=7");
  for (uint32_t psn = 0; psn < 500; ++psn) {
    a.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
    a.Tx(Opcode::RC_SEND_ONLY, 0x200, psn);
  }
  for (uint32_t psn = 0; psn < 500; ++psn) b.Tx(Opcode::RC_SEND_ONLY, 0x200, psn);
  for (uint32_t psn = 0; psn < 500; ++psn) b.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
  EXPECT_EQ(Through(a.sink), Through(b.sink));
  EXPECT_EQ(a.injector.counters().dropped, b.injector.counters().dropped);
  // Roughly the probability asked for.
  EXPECT_GT(a.injector.counters().dropped, 230u);
  EXPECT_LT(a.injector.counters().dropped, 370u);
  // Another seed, other decisions.
  Harness c("drop=0.3,seed=8");
  for (uint32_t psn = 0; psn < 500; ++psn) {
    c.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
    c.Tx(Opcode::RC_SEND_ONLY, 0x200, psn);
  }
  EXPECT_NE(Through(a.sink), Through(c.sink));
}

TEST(FaultDecide, NoSeedIsTheDefaultSeed) {
  Harness a("drop=0.5");
  Harness b("drop=0.5,seed=1");
  for (uint32_t psn = 0; psn < 200; ++psn) {
    a.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
    b.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
  }
  EXPECT_EQ(Through(a.sink), Through(b.sink));
}

TEST(FaultDecide, ARetransmissionGetsAFreshDecision) {
  // The same packet sent again is another occurrence: at 50% it cannot be
  // lost 40 times running, or RC could never recover.
  Harness h("drop=0.5");
  for (int i = 0; i < 40; ++i) h.Tx(Opcode::RC_SEND_ONLY, 0x100, 7);
  EXPECT_GT(h.sink.out.size(), 5u);
  EXPECT_LT(h.sink.out.size(), 35u);
  // ... and the sequence of fates replays.
  Harness again("drop=0.5");
  for (int i = 0; i < 40; ++i) again.Tx(Opcode::RC_SEND_ONLY, 0x100, 7);
  EXPECT_EQ(again.sink.out.size(), h.sink.out.size());
}

TEST(FaultDecide, OccurrenceTableCountsEachPacket) {
  OccurrenceTable t;
  EXPECT_EQ(t.Next(kTx, 5, 100, 4), 0u);
  EXPECT_EQ(t.Next(kTx, 5, 100, 4), 1u);
  EXPECT_EQ(t.Next(kTx, 5, 101, 4), 0u);
  EXPECT_EQ(t.Next(kRx, 5, 100, 4), 0u);
  EXPECT_EQ(t.Next(kTx, 5, 100, 0x11), 0u);
  EXPECT_EQ(t.Next(kTx, 6, 100, 4), 0u);
  EXPECT_EQ(t.Next(kTx, 5, 100, 4), 2u);
  // A window of consecutive PSNs of one QP never collides.
  for (uint32_t psn = 0; psn < 4096; ++psn) t.Next(kTx, 9, psn, 4);
  for (uint32_t psn = 0; psn < 4096; ++psn) EXPECT_EQ(t.Next(kTx, 9, psn, 4), 1u) << psn;
}

TEST(FaultInjector, CountTriggerDropsExactlyTheThirdReadResponse) {
  Harness h("drop=#3@op=READ_RESPONSE");
  uint32_t psn = 0;
  for (int i = 0; i < 4; ++i) {
    h.Tx(Opcode::RC_ACKNOWLEDGE, 0x100, psn++);
    h.Tx(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0x100, psn++);
  }
  // psn 5 is the third read response.
  auto through = Through(h.sink);
  EXPECT_EQ(through.size(), 7u);
  EXPECT_FALSE(through.contains({0x100, 5}));
  EXPECT_EQ(h.injector.counters().dropped, 1u);
  EXPECT_NE(h.injector.List().find("drop=#3@op=READ_RESPONSE  (matched 4 packets)"), std::string::npos)
      << h.injector.List();
}

TEST(FaultInjector, CountRanges) {
  Harness h("dup=#2..3");
  for (uint32_t psn = 0; psn < 5; ++psn) h.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
  ASSERT_EQ(h.sink.out.size(), 7u);
  EXPECT_EQ(h.injector.counters().duplicated, 2u);
  std::map<uint32_t, int> copies;
  for (const Sent& s : h.sink.out) ++copies[s.psn];
  EXPECT_EQ(copies[0], 1);
  EXPECT_EQ(copies[1], 2);
  EXPECT_EQ(copies[2], 2);
  EXPECT_EQ(copies[3], 1);
}

TEST(FaultInjector, FiltersByDirectionQpnDeviceAndOpcode) {
  {
    Harness h("drop");  // tx by default
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
    h.Rx(Opcode::RC_SEND_ONLY, 0x100, 1);
    ASSERT_EQ(h.sink.out.size(), 1u);
    EXPECT_FALSE(h.sink.out[0].tx);
  }
  {
    Harness h("drop@dir=rx");
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
    h.Rx(Opcode::RC_SEND_ONLY, 0x100, 1);
    ASSERT_EQ(h.sink.out.size(), 1u);
    EXPECT_TRUE(h.sink.out[0].tx);
  }
  {
    Harness h("drop@dir=both");
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
    h.Rx(Opcode::RC_SEND_ONLY, 0x100, 1);
    EXPECT_TRUE(h.sink.out.empty());
  }
  {
    Harness h("drop@qpn=0x12");  // the local (sending) QP
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1, /*local_qpn=*/0x11);
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 2, /*local_qpn=*/0x12);
    ASSERT_EQ(h.sink.out.size(), 1u);
    EXPECT_EQ(h.sink.out[0].psn, 1u);
  }
  {
    Harness h("drop@dst_qpn=0x200");
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
    h.Tx(Opcode::RC_SEND_ONLY, 0x200, 2);
    ASSERT_EQ(h.sink.out.size(), 1u);
    EXPECT_EQ(h.sink.out[0].qpn, 0x100u);
  }
  {
    Harness h("drop@dev=emu1");  // another device: nothing here
    h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
    EXPECT_EQ(h.sink.out.size(), 1u);
  }
  {
    Harness h("drop@op=ACK|RC_SEND_FIRST");
    h.Tx(Opcode::RC_SEND_FIRST, 0x100, 1);
    h.Tx(Opcode::RC_SEND_LAST, 0x100, 2);
    h.Tx(Opcode::RC_ACKNOWLEDGE, 0x100, 3);
    ASSERT_EQ(h.sink.out.size(), 1u);
    EXPECT_EQ(h.sink.out[0].opcode, static_cast<uint8_t>(Opcode::RC_SEND_LAST));
  }
}

TEST(FaultInjector, CorruptFlipsOneBitAndBreaksOnlyTheIcrc) {
  for (bool with_payload : {true, false}) {
    Harness h("corrupt");
    const Opcode op = with_payload ? Opcode::RC_SEND_ONLY : Opcode::RC_ACKNOWLEDGE;
    auto original = Build(op, 0x100, 9);
    h.Tx(op, 0x100, 9);
    ASSERT_EQ(h.sink.out.size(), 1u);
    const auto& bytes = h.sink.out[0].bytes;
    ASSERT_EQ(bytes.size(), original.size());
    int bits = 0;
    size_t where = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      bits += __builtin_popcount(bytes[i] ^ original[i]);
      if (bytes[i] != original[i]) where = i;
    }
    EXPECT_EQ(bits, 1);
    if (with_payload) {
      EXPECT_GE(where, wire::InfoOf(op).length);
      EXPECT_LT(where, bytes.size() - wire::kIcrcBytes);
    } else {
      EXPECT_GE(where, bytes.size() - wire::kIcrcBytes);
    }
    EXPECT_TRUE(wire::ParsePacket(bytes).ok()) << "a corrupt packet must still parse";
    wire::IcrcAddressing addr{kSrcIp, kDstIp, 4791, 4791};
    EXPECT_TRUE(wire::CheckIcrc(addr, original).ok());
    EXPECT_FALSE(wire::CheckIcrc(addr, bytes).ok());
    EXPECT_EQ(h.injector.counters().corrupted, 1u);
  }
}

TEST(FaultInjector, DelayHoldsUntilDueAndJitterStaysInRange) {
  Harness h("delay=200us@dir=both");
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
  h.Rx(Opcode::RC_SEND_ONLY, 0x100, 2);
  EXPECT_TRUE(h.sink.out.empty());
  auto next = h.Advance(150us);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, h.sink.now + 50us);
  EXPECT_TRUE(h.sink.out.empty());
  EXPECT_FALSE(h.Advance(50us).has_value());
  ASSERT_EQ(h.sink.out.size(), 2u);
  EXPECT_EQ(h.injector.counters().delayed, 2u);

  Harness j("delay=100us~50us");
  const auto start = j.sink.now;
  for (uint32_t psn = 0; psn < 200; ++psn) j.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
  std::set<int64_t> seen;
  for (int step = 0; step < 200; ++step) {
    const size_t before = j.sink.out.size();
    j.Advance(1us);
    for (size_t i = before; i < j.sink.out.size(); ++i) seen.insert((j.sink.out[i].at - start) / 1us);
  }
  ASSERT_EQ(j.sink.out.size(), 200u);
  EXPECT_GE(*seen.begin(), 50);
  EXPECT_LE(*seen.rbegin(), 150);
  EXPECT_GT(seen.size(), 20u) << "jitter should spread the delays";
}

TEST(FaultInjector, PortFilterAndHeldPacketsKeepTheirPort) {
  // Two ports: a rule for port 2 leaves port 1 alone, and a packet held
  // back goes out from (or is delivered as received on) its own port.
  Harness h("delay=1ms@port=2,dir=both", {kRate100G, kRate100G});
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1, 0x11, 64, 1);
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 2, 0x11, 64, 2);
  h.Rx(Opcode::RC_ACKNOWLEDGE, 0x11, 3, 1);
  h.Rx(Opcode::RC_ACKNOWLEDGE, 0x11, 4, 2);
  ASSERT_EQ(h.sink.out.size(), 2u) << "port 1's packets pass at once";
  EXPECT_EQ(h.sink.out[0].psn, 1u);
  EXPECT_EQ(h.sink.out[0].port, 1);
  EXPECT_EQ(h.sink.out[1].psn, 3u);
  EXPECT_EQ(h.sink.out[1].port, 1);
  h.Advance(std::chrono::milliseconds(2));
  ASSERT_EQ(h.sink.out.size(), 4u) << "port 2's were held, then released";
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(h.sink.out[i].port, 2) << "psn " << h.sink.out[i].psn;
  }
  EXPECT_EQ(h.injector.counters().delayed, 2u);
}

TEST(FaultInjector, ReorderLetsLaterPacketsOvertake) {
  Harness h("reorder=#1");
  for (uint32_t psn = 0; psn < 6; ++psn) h.Tx(Opcode::RC_SEND_ONLY, 0x100, psn);
  ASSERT_EQ(h.sink.out.size(), 6u);
  EXPECT_NE(h.sink.out[0].psn, 0u) << "the first packet was not held back";
  size_t pos = 0;
  for (size_t i = 0; i < h.sink.out.size(); ++i) {
    if (h.sink.out[i].psn == 0) pos = i;
  }
  EXPECT_GE(pos, 1u);
  EXPECT_LE(pos, Injector::kReorderMaxPackets);
  EXPECT_EQ(h.injector.counters().reordered, 1u);

  // With no later traffic it still leaves, after the hold time.
  Harness lone("reorder");
  lone.Tx(Opcode::RC_SEND_ONLY, 0x100, 0);
  EXPECT_TRUE(lone.sink.out.empty());
  auto next = lone.Advance(0us);
  ASSERT_TRUE(next.has_value());
  lone.Advance(Injector::kReorderMaxHold);
  EXPECT_EQ(lone.sink.out.size(), 1u);
}

TEST(FaultInjector, ForcedEventsCountRequestMessages) {
  Harness h("rnr=#2@qpn=0x11; nak=access/#1@op=RDMA_WRITE_ONLY; error=#3@qpn=0x12");
  auto req = [&](uint32_t qpn, Opcode op, uint32_t psn) {
    return h.injector.ForcedOnRequest({kRx, 1, qpn, qpn, psn, static_cast<uint8_t>(op)});
  };
  auto pkt = [&](uint32_t qpn, uint32_t psn) {
    return h.injector.ForcedOnPacket({kRx, 1, qpn, qpn, psn, static_cast<uint8_t>(Opcode::RC_ACKNOWLEDGE)});
  };
  EXPECT_FALSE(req(0x11, Opcode::RC_SEND_ONLY, 1));
  auto rnr = req(0x11, Opcode::RC_SEND_ONLY, 2);
  ASSERT_TRUE(rnr);
  EXPECT_EQ(rnr->action, Action::kRnr);
  EXPECT_EQ(rnr->rule, "rnr=#2@qpn=0x11");
  EXPECT_FALSE(req(0x11, Opcode::RC_SEND_ONLY, 2));
  auto nak = req(0x13, Opcode::RC_RDMA_WRITE_ONLY, 7);
  ASSERT_TRUE(nak);
  EXPECT_EQ(nak->action, Action::kNak);
  EXPECT_EQ(nak->nak, wire::NakCode::kRemoteAccessError);
  EXPECT_FALSE(pkt(0x12, 1));
  EXPECT_FALSE(pkt(0x12, 2));
  auto err = pkt(0x12, 3);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->action, Action::kError);
  const FaultCounters c = h.injector.counters();
  EXPECT_EQ(c.rnr_forced, 1u);
  EXPECT_EQ(c.naks_forced, 1u);
  EXPECT_EQ(c.errors_forced, 1u);
  // Forced rules do not touch packets.
  h.Tx(Opcode::RC_SEND_ONLY, 0x11, 1);
  h.Rx(Opcode::RC_SEND_ONLY, 0x11, 1);
  EXPECT_EQ(h.sink.out.size(), 2u);
}

TEST(FaultInjector, ReportsEachDecisionWithThePacketsPortAndLocalQp) {
  // Two ports; each rule picks one packet of one QP.
  Harness h("drop=#1@qpn=0x11; dup=#1@qpn=0x12,port=2; corrupt=#1@dir=rx,qpn=0x13; "
            "delay=1ms/#1@qpn=0x14; reorder=#1@dir=rx,qpn=0x15; rate=8mbps@port=2",
            {kRate100G, kRate100G});
  using R = FakeSink::Report;
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1, 0x11);
  EXPECT_EQ(h.sink.counted, (std::vector<R>{{FaultEvent::kDropped, 1, 0x11, 1}}));
  h.sink.counted.clear();
  // Two copies on a shaped port: the second waits for the link.
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 2, 0x12, 1000 - 16, 2);
  EXPECT_EQ(h.sink.counted, (std::vector<R>{{FaultEvent::kDuplicated, 2, 0x12, 1},
                                            {FaultEvent::kShaped, 2, 0x12, 1}}));
  h.sink.counted.clear();
  h.Rx(Opcode::RC_SEND_ONLY, 0x13, 3);
  EXPECT_EQ(h.sink.counted, (std::vector<R>{{FaultEvent::kCorrupted, 1, 0x13, 1}}));
  h.sink.counted.clear();
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 4, 0x14);
  h.Rx(Opcode::RC_SEND_ONLY, 0x15, 5);
  EXPECT_EQ(h.sink.counted, (std::vector<R>{{FaultEvent::kDelayed, 1, 0x14, 1},
                                            {FaultEvent::kReordered, 1, 0x15, 1}}));
  h.sink.counted.clear();
  // A delayed packet released later onto a shaped link keeps its QP.
  Harness late("delay=1ms; rate=8mbps", {kRate100G});
  late.Tx(Opcode::RC_SEND_ONLY, 0x100, 1, 0x21, 1000 - 16);
  late.Tx(Opcode::RC_SEND_ONLY, 0x100, 2, 0x22, 1000 - 16);
  late.Advance(1ms);
  EXPECT_EQ(late.sink.counted, (std::vector<R>{{FaultEvent::kDelayed, 1, 0x21, 1},
                                               {FaultEvent::kDelayed, 1, 0x22, 1},
                                               {FaultEvent::kShaped, 1, 0x22, 1}}));
  // The device-wide counters are the sum of the reports.
  const FaultCounters c = h.injector.counters();
  EXPECT_EQ(c.dropped, 1u);
  EXPECT_EQ(c.duplicated, 1u);
  EXPECT_EQ(c.corrupted, 1u);
  EXPECT_EQ(c.delayed, 1u);
  EXPECT_EQ(c.reordered, 1u);
  EXPECT_EQ(c.shaped, 1u);
  EXPECT_EQ(late.injector.counters().shaped, 1u);
}

TEST(FaultInjector, ShapingPacesAtTheRate) {
  // 80 Mb/s: a 1000-byte UDP payload is 1046 bytes on the link, 104.6 us.
  Harness h("rate=80mbps");
  for (uint32_t psn = 0; psn < 20; ++psn) h.Tx(Opcode::RC_SEND_ONLY, 0x100, psn, 0x11, 1000 - 16);
  // The burst lets the first ones out at once; the rest wait.
  const size_t at_once = h.sink.out.size();
  EXPECT_GE(at_once, 1u);
  EXPECT_LE(at_once, 2u);
  while (h.sink.out.size() < 20) {
    auto next = h.injector.Flush(h.sink.now, h.sink);
    ASSERT_TRUE(next.has_value() || h.sink.out.size() == 20);
    if (next) h.sink.now = std::max(h.sink.now, *next);
  }
  const auto span = h.sink.out.back().at - h.sink.out.front().at;
  // 19 intervals of 104.6 us, less up to one burst.
  EXPECT_GE(span, 19 * 104us - kShaperBurst);
  EXPECT_LE(span, 19 * 105us);
  EXPECT_GE(h.injector.counters().shaped, 18u);
  // In order.
  for (size_t i = 0; i < h.sink.out.size(); ++i) EXPECT_EQ(h.sink.out[i].psn, i);
}

TEST(FaultInjector, LatencyAndAutoRate) {
  Harness h("latency=1ms@port=1");
  h.Tx(Opcode::RC_SEND_ONLY, 0x100, 1);
  EXPECT_TRUE(h.sink.out.empty());
  h.Advance(900us);
  EXPECT_TRUE(h.sink.out.empty());
  h.Advance(100us);
  EXPECT_EQ(h.sink.out.size(), 1u);
  EXPECT_EQ(PortRateBps(2, 32), 100000000000ull);  // 4x EDR
  EXPECT_EQ(PortRateBps(1, 1), 2500000000ull);     // 1x SDR
  Harness a("rate=auto", {8000000});                // a port of 8 Mb/s
  for (uint32_t psn = 0; psn < 3; ++psn) a.Tx(Opcode::RC_SEND_ONLY, 0x100, psn, 0x11, 1000 - 16);
  EXPECT_EQ(a.sink.out.size(), 1u) << "rate=auto follows the port's speed x width";
}

TEST(FaultInjector, AddListAndClear) {
  Injector inj("emu0", {kRate100G});
  EXPECT_FALSE(inj.active());
  EXPECT_EQ(inj.List(), "");
  Status bad = inj.Add("drop@port=2");
  EXPECT_EQ(bad.code(), EINVAL);
  EXPECT_NE(bad.message().find("port=2: emu0 has 1 port"), std::string::npos) << bad.message();
  EXPECT_FALSE(inj.active()) << "a refused rule changes nothing";
  ASSERT_TRUE(inj.Add("drop=0.1,seed=9").ok());
  ASSERT_TRUE(inj.Add("rate=10gbps,latency=50us").ok());
  EXPECT_TRUE(inj.active());
  EXPECT_EQ(inj.List(), "seed=9\ndrop=0.1  (matched 0 packets)\nrate=10gbps,latency=50us\n");
  inj.Clear();
  EXPECT_FALSE(inj.active());
  EXPECT_EQ(inj.List(), "");
  // A rule for another device may name ports this one lacks.
  EXPECT_TRUE(inj.Add("drop@dev=emu1,port=2").ok());
}

TEST(FaultInjector, HeldQueuesAreBounded) {
  Harness h("delay=1s");
  for (uint32_t psn = 0; psn < Injector::kMaxHeld + 10; ++psn) h.Tx(Opcode::RC_SEND_ONLY, 0x100, psn & 0xffffff);
  EXPECT_EQ(h.injector.counters().overflows, 10u);
  h.Advance(1s);
  EXPECT_EQ(h.sink.out.size(), Injector::kMaxHeld);
}

}  // namespace
}  // namespace rdmaemu::fault
