// Writes a pcap of whole RoCE v2 packets, one CM MAD of each kind to QP1,
// each field set to a value unlike its neighbours', and prints what
// Wireshark should decode, for mad_tshark_test.sh to compare with tshark's
// reading, one line each:
//   FRAME field NAME VALUE   tshark -e NAME shows VALUE (numbers as numbers)
//   FRAME bytes OFF HEX      infiniband.mad.data, the message, has the bytes
//                            HEX ("abcd...") at the IBA table's offset OFF
//   mad_tshark_pcap PCAP > EXPECTED
// Wireshark 4.0 (Debian 12) decodes no field of MRA, SIDR_REQ or SIDR_REP,
// and misreads REQ's primary flow label and packet rate (it takes both from
// byte 88; the IBA and the kernel put the rate at 91.2): those are checked
// as bytes of infiniband.mad.data, written out here by hand from the IBA
// tables rather than from the views under test.
// The packets are built as the device will send them: wire::BuildPacket
// (UD SEND_ONLY, P_Key 0xffff, DETH with the GSI Q_Key and source QP 1, the
// ICRC for the addressing) and recorded with capture::PcapWriter.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/capture/pcap.h"
#include "emulator/cm/mad.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/packet.h"

namespace rdmaemu::cm {
namespace {

constexpr uint32_t kSrcIp = 0x0a000101;  // 10.0.1.1
constexpr uint32_t kDstIp = 0x0a000202;  // 10.0.2.2
constexpr uint16_t kSrcPort = 0xc123;

struct Expectation {
  int frame;
  std::string kind;  // "field" or "bytes"
  std::string text;  // "NAME VALUE" or "OFF HEX"
};

class Writer {
 public:
  explicit Writer(capture::PcapWriter* pcap) : pcap_(pcap) {}

  // Builds one MAD (InitMad, then `fill` on the message), sends it in its
  // packet, and expects the MAD header Wireshark should show.
  void Add(AttributeId id, uint64_t tid, const std::function<void(std::span<uint8_t>)>& fill) {
    std::array<uint8_t, kMadBytes> mad;
    InitMad(mad, id, tid);
    fill(MessageBytes(std::span<uint8_t>(mad)));
    ++frame_;
    Expect("infiniband.bth.opcode", 0x64);
    Expect("infiniband.bth.destqp", kGsiQpn);
    Expect("infiniband.deth.q_key", kGsiQkey);
    Expect("infiniband.deth.srcqp", kGsiQpn);
    Expect("infiniband.mad.baseversion", kBaseVersion);
    Expect("infiniband.mad.mgmtclass", kMgmtClassCm);
    Expect("infiniband.mad.classversion", kCmClassVersion);
    Expect("infiniband.mad.method", kMethodSend);
    Expect("infiniband.mad.transactionid", tid);
    Expect("infiniband.mad.attributeid", static_cast<uint16_t>(id));

    wire::PacketFields f;
    f.opcode = wire::Opcode::UD_SEND_ONLY;
    f.bth.pkey = wire::kDefaultPkey;
    f.bth.dest_qpn = kGsiQpn;
    f.bth.psn = static_cast<uint32_t>(0x100 + frame_);
    f.deth.qkey = kGsiQkey;
    f.deth.src_qpn = kGsiQpn;
    const wire::IcrcAddressing addr{.src_ip = kSrcIp, .dst_ip = kDstIp, .src_port = kSrcPort};
    std::vector<uint8_t> packet(wire::PacketLength(f.opcode, mad.size()));
    const Result<size_t> n = wire::BuildPacket(f, mad, packet, &addr);
    if (!n.ok()) {
      std::fprintf(stderr, "BuildPacket: %s\n", n.status().message().c_str());
      std::exit(1);
    }
    packet.resize(n.value());
    if (Status s = wire::CheckIcrc(addr, packet); !s.ok()) {
      std::fprintf(stderr, "CheckIcrc: %s\n", s.message().c_str());
      std::exit(1);
    }
    pcap_->Record(
        {.src_ip = kSrcIp, .dst_ip = kDstIp, .src_port = kSrcPort, .dst_port = wire::kRoceUdpPort},
        packet);
  }

  // `value` is what tshark prints; numbers are compared as numbers.
  void Expect(std::string_view field, uint64_t value) {
    expected_.push_back({frame_, "field", fmt::format("{} {:#x}", field, value)});
  }
  void Expect(std::string_view field, std::string_view value) {
    expected_.push_back({frame_, "field", fmt::format("{} {}", field, value)});
  }
  // The message's bytes from `off`, the IBA table's offset, are `hex`
  // ("ab:cd:...").
  void ExpectBytes(size_t off, std::string_view hex) {
    std::string digits;
    for (char c : hex) {
      if (c != ':') digits += c;
    }
    expected_.push_back({frame_, "bytes", fmt::format("{} {}", off, digits)});
  }

  const std::vector<Expectation>& expected() const { return expected_; }

 private:
  capture::PcapWriter* pcap_;
  int frame_ = 0;
  std::vector<Expectation> expected_;
};

Gid MappedIpv4(uint32_t ip) {
  Gid g{};
  g[10] = g[11] = 0xff;
  StoreBe32(g.data() + 12, ip);
  return g;
}

void WriteAll(Writer& w) {
  w.Add(AttributeId::kReq, 0x1122334400000001ull, [](std::span<uint8_t> m) {
    ReqView req(m);
    req.set_local_comm_id(0x0a0b0c0d);
    req.set_service_id(MakeServiceId(PortSpace::kTcp, 7471));
    req.set_local_ca_guid(0x0002c903001a2b3cull);
    req.set_local_qkey(0x1234abcd);
    req.set_local_qpn(0x00a1b2);
    req.set_responder_resources(0x11);
    req.set_local_eecn(0x0000e1);
    req.set_initiator_depth(0x22);
    req.set_remote_eecn(0x0000e2);
    req.set_remote_cm_response_timeout(20);
    req.set_transport_service_type(TransportServiceType::kUc);
    req.set_end_to_end_flow_control(true);
    req.set_starting_psn(0xc0ffee);
    req.set_local_cm_response_timeout(18);
    req.set_retry_count(6);
    req.set_partition_key(0xfffe);
    req.set_path_mtu(3);
    req.set_rdc_exists(true);
    req.set_rnr_retry_count(5);
    req.set_max_cm_retries(15);
    req.set_srq(true);
    req.set_extended_transport_type(2);
    ReqPathView path = req.primary_path();
    path.set_local_lid(0xfffa);
    path.set_remote_lid(0xfffb);
    path.set_local_gid(MappedIpv4(kSrcIp));
    path.set_remote_gid(MappedIpv4(kDstIp));
    path.set_flow_label(0xabcde);
    path.set_packet_rate(0x2d);
    path.set_traffic_class(0x68);
    path.set_hop_limit(0x40);
    path.set_sl(0x9);
    path.set_subnet_local(true);
    path.set_local_ack_timeout(19);
    CmaHeaderView cma(req.private_data());
    cma.set_cma_version(CmaHeaderView::kVersion);
    cma.set_ip_version(4);
    cma.set_port(0xd431);
    cma.set_src_ipv4(kSrcIp);
    cma.set_dst_ipv4(kDstIp);
    req.private_data()[kCmaHeaderBytes] = 0x5a;
  });
  w.Expect("infiniband.cm.req", 0x0a0b0c0d);
  w.Expect("infiniband.cm.req.serviceid", 0x1061d2f);
  w.Expect("infiniband.cm.req.serviceid.protocol", 0x06);
  w.Expect("infiniband.cm.req.serviceid.dport", 7471);
  w.Expect("infiniband.cm.req.localcaguid", 0x0002c903001a2b3cull);
  w.Expect("infiniband.cm.req.localqkey", 0x1234abcd);
  w.Expect("infiniband.cm.req.localqpn", 0x00a1b2);
  w.Expect("infiniband.cm.req.responderres", 0x11);
  w.Expect("infiniband.cm.req.localeecn", 0xe1);
  w.Expect("infiniband.cm.req.initdepth", 0x22);
  w.Expect("infiniband.cm.req.remoteeecn", 0xe2);
  w.Expect("infiniband.cm.req.remoteresptout", 20);
  w.Expect("infiniband.cm.req.transpsvctype", 1);
  w.Expect("infiniband.cm.req.e2eflowctrl", 1);
  w.Expect("infiniband.cm.req.startpsn", 0xc0ffee);
  w.Expect("infiniband.cm.req.localresptout", 18);
  w.Expect("infiniband.cm.req.retrcount", 6);
  w.Expect("infiniband.cm.req.pkey", 0xfffe);
  w.Expect("infiniband.cm.req.pppmtu", 3);
  w.Expect("infiniband.cm.req.rdcexist", 1);
  w.Expect("infiniband.cm.req.rnrretrcount", 5);
  w.Expect("infiniband.cm.req.maxcmretr", 15);
  w.Expect("infiniband.cm.req.srq", 1);
  w.Expect("infiniband.cm.req.ext_transport", 2);
  w.Expect("infiniband.cm.req.prim_locallid", 0xfffa);
  w.Expect("infiniband.cm.req.prim_remotelid", 0xfffb);
  w.Expect("infiniband.cm.req.prim_localgid_ipv4", "10.0.1.1");
  w.Expect("infiniband.cm.req.prim_remotegid_ipv4", "10.0.2.2");
  // Flow label 0xabcde in 88-90.3, reserved 90.4-91.1, packet rate 0x2d at
  // 91.2 (Wireshark 4.0 shows 0xabc and 0x2b, both from byte 88).
  w.ExpectBytes(88, "ab:cd:e0:2d");
  w.Expect("infiniband.cm.req.prim_tfcclass", 0x68);
  w.Expect("infiniband.cm.req.prim_hoplim", 0x40);
  w.Expect("infiniband.cm.req.prim_sl", 0x9);
  w.Expect("infiniband.cm.req.prim_subnetlocal", 1);
  w.Expect("infiniband.cm.req.prim_localacktout", 19);
  w.Expect("infiniband.cm.req.alt_locallid", 0);
  w.Expect("infiniband.cm.req.ip_cm.majv", 0);
  w.Expect("infiniband.cm.req.ip_cm.minv", 0);
  w.Expect("infiniband.cm.req.ip_cm.ipv", 4);
  w.Expect("infiniband.cm.req.ip_cm.sport", 0xd431);
  w.Expect("infiniband.cm.req.ip_cm.sip4", "10.0.1.1");
  w.Expect("infiniband.cm.req.ip_cm.dip4", "10.0.2.2");
  w.ExpectBytes(176, "5a");  // the user's private data, after the CMA header

  w.Add(AttributeId::kMra, 0x1122334400000002ull, [](std::span<uint8_t> m) {
    MraView mra(m);
    mra.set_local_comm_id(0x0b0c0d0e);
    mra.set_remote_comm_id(0x0a0b0c0d);
    mra.set_message_mraed(MessageKind::kRep);
    mra.set_service_timeout(24);
    mra.private_data()[0] = 0x77;
  });
  w.ExpectBytes(0, "0b:0c:0d:0e:0a:0b:0c:0d");  // local, remote comm ID
  w.ExpectBytes(8, "40");                       // MRAed 1 (REP) at 8.0
  w.ExpectBytes(9, "c0");                       // service timeout 24 at 9.0
  w.ExpectBytes(10, "77");                      // private data

  w.Add(AttributeId::kRej, 0x1122334400000003ull, [](std::span<uint8_t> m) {
    RejView rej(m);
    rej.set_local_comm_id(0x0c0d0e0f);
    rej.set_remote_comm_id(0x0a0b0c0d);
    rej.set_message_rejected(MessageKind::kRep);
    rej.set_reject_info_length(8);
    rej.set_reason(RejReason::kInvalidServiceId);
    StoreBe64(rej.ari().data(), 0x0002c903001a2b3cull);
  });
  w.Expect("infiniband.cm.rej.localcommid", 0x0c0d0e0f);
  w.Expect("infiniband.cm.rej.remotecommid", 0x0a0b0c0d);
  w.Expect("infiniband.cm.rej.msgrej", 1);
  w.Expect("infiniband.cm.rej.rejinfolen", 8);
  w.Expect("infiniband.cm.rej.reason", 8);
  w.ExpectBytes(12, "00:02:c9:03:00:1a:2b:3c");  // ARI: a GUID

  w.Add(AttributeId::kRep, 0x1122334400000001ull, [](std::span<uint8_t> m) {
    RepView rep(m);
    rep.set_local_comm_id(0x0d0e0f10);
    rep.set_remote_comm_id(0x0a0b0c0d);
    rep.set_local_qkey(0x5678ef01);
    rep.set_local_qpn(0x00c3d4);
    rep.set_local_eecn(0x0000e3);
    rep.set_starting_psn(0xbadcab);
    rep.set_responder_resources(0x33);
    rep.set_initiator_depth(0x44);
    rep.set_target_ack_delay(15);
    rep.set_failover_accepted(2);
    rep.set_end_to_end_flow_control(true);
    rep.set_rnr_retry_count(7);
    rep.set_srq(true);
    rep.set_local_ca_guid(0x0002c903004d5e6full);
    rep.private_data()[0] = 0xa5;
  });
  w.Expect("infiniband.cm.rep", 0x0d0e0f10);
  w.Expect("infiniband.cm.rep.remotecommid", 0x0a0b0c0d);
  w.Expect("infiniband.cm.rep.localqkey", 0x5678ef01);
  w.Expect("infiniband.cm.rep.localqpn", 0x00c3d4);
  w.Expect("infiniband.cm.rep.localeecn", 0xe3);
  w.Expect("infiniband.cm.rep.startpsn", 0xbadcab);
  w.Expect("infiniband.cm.rep.respres", 0x33);
  w.Expect("infiniband.cm.rep.initdepth", 0x44);
  w.Expect("infiniband.cm.rep.tgtackdelay", 15);
  w.Expect("infiniband.cm.rep.failoveracc", 2);
  w.Expect("infiniband.cm.rep.e2eflowctrl", 1);
  w.Expect("infiniband.cm.rep.rnrretrcount", 7);
  w.Expect("infiniband.cm.rep.srq", 1);
  w.Expect("infiniband.cm.rep.localcaguid", 0x0002c903004d5e6full);
  w.ExpectBytes(36, "a5");  // private data

  w.Add(AttributeId::kRtu, 0x1122334400000001ull, [](std::span<uint8_t> m) {
    RtuView rtu(m);
    rtu.set_local_comm_id(0x0a0b0c0d);
    rtu.set_remote_comm_id(0x0d0e0f10);
  });
  w.Expect("infiniband.cm.rtu.localcommid", 0x0a0b0c0d);
  w.Expect("infiniband.cm.rtu.remotecommid", 0x0d0e0f10);

  w.Add(AttributeId::kDreq, 0x1122334400000004ull, [](std::span<uint8_t> m) {
    DreqView dreq(m);
    dreq.set_local_comm_id(0x0a0b0c0d);
    dreq.set_remote_comm_id(0x0d0e0f10);
    dreq.set_remote_qpn_eecn(0x00c3d4);
  });
  w.Expect("infiniband.cm.dreq.localcommid", 0x0a0b0c0d);
  w.Expect("infiniband.cm.dreq.remotecommid", 0x0d0e0f10);
  w.Expect("infiniband.cm.req.remoteqpneecn", 0x00c3d4);

  w.Add(AttributeId::kDrep, 0x1122334400000004ull, [](std::span<uint8_t> m) {
    DrepView drep(m);
    drep.set_local_comm_id(0x0d0e0f10);
    drep.set_remote_comm_id(0x0a0b0c0d);
  });
  w.Expect("infiniband.cm.drsp.localcommid", 0x0d0e0f10);
  w.Expect("infiniband.cm.drsp.remotecommid", 0x0a0b0c0d);

  w.Add(AttributeId::kSidrReq, 0x1122334400000005ull, [](std::span<uint8_t> m) {
    SidrReqView req(m);
    req.set_request_id(0x01020304);
    req.set_partition_key(0xffff);
    req.set_service_id(MakeServiceId(PortSpace::kUdp, 4000));
    CmaHeaderView cma(req.private_data());
    cma.set_ip_version(4);
    cma.set_port(0xd432);
    cma.set_src_ipv4(kSrcIp);
    cma.set_dst_ipv4(kDstIp);
  });
  w.ExpectBytes(0, "01:02:03:04");              // request ID
  w.ExpectBytes(4, "ff:ff");                    // P_Key
  w.ExpectBytes(8, "00:00:00:00:01:11:0f:a0");  // service ID: UDP port 4000
  w.ExpectBytes(16, "00:40:d4:32");             // CMA version, IPv4, port
  w.ExpectBytes(32, "0a:00:01:01");             // source IP
  w.ExpectBytes(48, "0a:00:02:02");             // destination IP

  w.Add(AttributeId::kSidrRep, 0x1122334400000005ull, [](std::span<uint8_t> m) {
    SidrRepView rep(m);
    rep.set_request_id(0x01020304);
    rep.set_status(SidrStatus::kNoQp);
    rep.set_additional_info_length(9);
    rep.set_qpn(0x00e5f6);
    rep.set_service_id(MakeServiceId(PortSpace::kUdp, 4000));
    rep.set_qkey(0x01234567);
    rep.private_data()[0] = 0x66;
  });
  w.ExpectBytes(0, "01:02:03:04");               // request ID
  w.ExpectBytes(4, "03:09");                     // status, info length
  w.ExpectBytes(8, "00:e5:f6");                  // QPN
  w.ExpectBytes(12, "00:00:00:00:01:11:0f:a0");  // service ID
  w.ExpectBytes(20, "01:23:45:67");              // Q_Key
  w.ExpectBytes(96, "66");                       // private data
}

}  // namespace
}  // namespace rdmaemu::cm

int main(int argc, char** argv) {
  using namespace rdmaemu;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PCAP > EXPECTED\n", argv[0]);
    return 2;
  }
  Result<std::unique_ptr<capture::PcapWriter>> pcap = capture::PcapWriter::Open(argv[1]);
  if (!pcap.ok()) {
    std::fprintf(stderr, "%s\n", pcap.status().message().c_str());
    return 1;
  }
  cm::Writer w(pcap->get());
  cm::WriteAll(w);
  if (Status s = (*pcap)->Flush(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  for (const cm::Expectation& e : w.expected()) {
    std::printf("%d %s %s\n", e.frame, e.kind.c_str(), e.text.c_str());
  }
  return 0;
}
