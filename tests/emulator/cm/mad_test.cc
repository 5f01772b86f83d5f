#include "emulator/cm/mad.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace rdmaemu::cm {
namespace {

using Mad = std::array<uint8_t, kMadBytes>;
// (offset in the whole MAD, byte) for each byte that is not `background`.
using Diff = std::vector<std::pair<size_t, uint8_t>>;

Diff Changed(const Mad& mad, uint8_t background = 0) {
  Diff d;
  for (size_t i = 0; i < mad.size(); ++i) {
    if (mad[i] != background) d.emplace_back(i, mad[i]);
  }
  return d;
}

// A byte of the message at IBA offset `off`, as an offset into the MAD.
constexpr size_t At(size_t off) { return kMadHeaderBytes + off; }

std::span<uint8_t> Msg(Mad& mad) { return MessageBytes(std::span<uint8_t>(mad)); }

Gid CountingGid(uint8_t first) {
  Gid g;
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<uint8_t>(first + i);
  return g;
}

// --- constants -------------------------------------------------------------

TEST(Constants, AreTheIbaAndKernelValues) {
  EXPECT_EQ(kMadBytes, 256u);
  EXPECT_EQ(kMadHeaderBytes, 24u);
  EXPECT_EQ(kMessageBytes, 232u);
  EXPECT_EQ(kBaseVersion, 1);
  EXPECT_EQ(kMgmtClassCm, 0x07);
  EXPECT_EQ(kCmClassVersion, 2);
  EXPECT_EQ(kMethodSend, 0x03);
  EXPECT_EQ(kGsiQkey, 0x80010000u);
  EXPECT_EQ(kGsiQpn, 1u);
  EXPECT_EQ(kCmaHeaderBytes, 36u);
  EXPECT_EQ(kReqUserPrivateDataBytes, 56u);
  EXPECT_EQ(kSidrReqUserPrivateDataBytes, 180u);
  EXPECT_EQ(static_cast<int>(RejReason::kTimeout), 4);
  EXPECT_EQ(static_cast<int>(RejReason::kInvalidServiceId), 8);
  EXPECT_EQ(static_cast<int>(RejReason::kStaleConn), 10);
  EXPECT_EQ(static_cast<int>(RejReason::kConsumerDefined), 28);
  EXPECT_EQ(static_cast<int>(RejReason::kInvalidAltFlowLabel), 33);
  EXPECT_EQ(static_cast<int>(RejReason::kVendorOptionNotSupported), 35);
  EXPECT_EQ(static_cast<int>(SidrStatus::kUnsupportedVersion), 5);
}

TEST(Constants, PrivateDataEndsEachMessageExactly) {
  EXPECT_EQ(ReqView::kPrivateDataOffset + kReqPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(RepView::kPrivateDataOffset + kRepPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(RtuView::kPrivateDataOffset + kRtuPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(DrepView::kPrivateDataOffset + kDrepPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(RejView::kPrivateDataOffset + kRejPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(RejView::kAriOffset + kAriBytes, RejView::kPrivateDataOffset);
  EXPECT_EQ(MraView::kPrivateDataOffset + kMraPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(DreqView::kPrivateDataOffset + kDreqPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(SidrReqView::kPrivateDataOffset + kSidrReqPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(SidrRepView::kPrivateDataOffset + kSidrRepPrivateDataBytes, kMessageBytes);
  EXPECT_EQ(SidrRepView::kAdditionalInfoOffset + kAriBytes, SidrRepView::kPrivateDataOffset);
  EXPECT_EQ(ReqView::kAlternatePathOffset - ReqView::kPrimaryPathOffset, ReqPathView::kBytes);
  EXPECT_EQ(ReqView::kAlternatePathOffset + ReqPathView::kBytes, ReqView::kPrivateDataOffset);
}

TEST(AttributeId, NamesAndRange) {
  EXPECT_EQ(ToString(AttributeId::kReq), "REQ");
  EXPECT_EQ(ToString(AttributeId::kMra), "MRA");
  EXPECT_EQ(ToString(AttributeId::kRej), "REJ");
  EXPECT_EQ(ToString(AttributeId::kRep), "REP");
  EXPECT_EQ(ToString(AttributeId::kRtu), "RTU");
  EXPECT_EQ(ToString(AttributeId::kDreq), "DREQ");
  EXPECT_EQ(ToString(AttributeId::kDrep), "DREP");
  EXPECT_EQ(ToString(AttributeId::kSidrReq), "SIDR_REQ");
  EXPECT_EQ(ToString(AttributeId::kSidrRep), "SIDR_REP");
  EXPECT_EQ(ToString(AttributeId::kLap), "LAP");
  EXPECT_EQ(ToString(AttributeId::kApr), "APR");
  EXPECT_EQ(static_cast<uint16_t>(AttributeId::kApr), 0x1a);
  EXPECT_FALSE(IsCmAttribute(0x0f));
  EXPECT_TRUE(IsCmAttribute(0x10));
  EXPECT_TRUE(IsCmAttribute(0x1a));
  EXPECT_FALSE(IsCmAttribute(0x1b));
  EXPECT_FALSE(IsCmAttribute(0x1010));
}

TEST(RejReason, NamesKnownAndUnknownValues) {
  EXPECT_EQ(ToString(RejReason::kInvalidServiceId), "invalid service ID");
  EXPECT_EQ(ToString(RejReason::kConsumerDefined), "consumer defined");
  EXPECT_EQ(ToString(static_cast<RejReason>(34)), "unknown reason");
  EXPECT_EQ(ToString(SidrStatus::kSuccess), "success");
  EXPECT_EQ(ToString(static_cast<SidrStatus>(9)), "unknown status");
}

// --- service IDs ----------------------------------------------------------

TEST(ServiceId, IsPortSpaceAndPort) {
  EXPECT_EQ(MakeServiceId(PortSpace::kTcp, 7471), 0x0000000001061d2full);
  EXPECT_EQ(MakeServiceId(PortSpace::kUdp, 0xffff), 0x000000000111ffffull);
  EXPECT_EQ(MakeServiceId(PortSpace::kIb, 1), 0x00000000013f0001ull);
  EXPECT_EQ(MakeServiceId(PortSpace::kIpoib, 0), 0x0000000000020000ull);
  EXPECT_EQ(ServiceIdPortSpace(0x0000000001061d2full), 0x0106);
  EXPECT_EQ(ServiceIdPort(0x0000000001061d2full), 7471);
  for (PortSpace ps : {PortSpace::kTcp, PortSpace::kUdp, PortSpace::kIb, PortSpace::kIpoib}) {
    for (uint16_t port : {0, 1, 4791, 65535}) {
      const uint64_t sid = MakeServiceId(ps, port);
      EXPECT_EQ(ServiceIdPortSpace(sid), static_cast<uint16_t>(ps));
      EXPECT_EQ(ServiceIdPort(sid), port);
    }
  }
}

// --- the MAD header ---------------------------------------------------------

TEST(MadHeaderView, WritesEveryFieldAtItsIbaPosition) {
  Mad mad{};
  MadHeaderView h{std::span<uint8_t>(mad)};
  h.set_base_version(1);
  h.set_mgmt_class(0x07);
  h.set_class_version(2);
  h.set_method(0x03);
  h.set_status(0x1234);
  h.set_class_specific(0x5678);
  h.set_transaction_id(0x0102030405060708ull);
  h.set_attribute_id(AttributeId::kSidrRep);
  h.set_attribute_modifier(0x9abcdef0);
  const std::array<uint8_t, 24> want = {0x01, 0x07, 0x02, 0x03, 0x12, 0x34, 0x56, 0x78,
                                        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
                                        0x00, 0x18, 0x00, 0x00, 0x9a, 0xbc, 0xde, 0xf0};
  EXPECT_TRUE(std::equal(want.begin(), want.end(), mad.begin()));
  EXPECT_EQ(Changed(mad).size(), 21u);  // nothing past the header

  const ConstMadHeaderView c{std::span<const uint8_t>(mad)};
  EXPECT_EQ(c.base_version(), 1);
  EXPECT_EQ(c.mgmt_class(), 0x07);
  EXPECT_EQ(c.class_version(), 2);
  EXPECT_EQ(c.method(), 0x03);
  EXPECT_EQ(c.status(), 0x1234);
  EXPECT_EQ(c.class_specific(), 0x5678);
  EXPECT_EQ(c.transaction_id(), 0x0102030405060708ull);
  EXPECT_EQ(c.attribute_id(), 0x18);
  EXPECT_EQ(c.attribute_modifier(), 0x9abcdef0u);
}

TEST(InitMad, ZeroesTheMadAndWritesACmSendHeader) {
  Mad mad;
  mad.fill(0xee);
  InitMad(mad, AttributeId::kRtu, 0xabcd00001234ull);
  EXPECT_EQ(Changed(mad), (Diff{{0, 1},
                                {1, 7},
                                {2, 2},
                                {3, 3},
                                {10, 0xab},
                                {11, 0xcd},
                                {14, 0x12},
                                {15, 0x34},
                                {17, 0x14}}));
  auto id = CheckMad(mad);
  ASSERT_TRUE(id.ok()) << id.status().message();
  EXPECT_EQ(id.value(), AttributeId::kRtu);
}

// --- CheckMad ---------------------------------------------------------------

Mad ValidMad(AttributeId id = AttributeId::kReq) {
  Mad mad;
  InitMad(mad, id, 1);
  return mad;
}

TEST(CheckMad, AcceptsEveryCmMessage) {
  for (uint16_t a = 0x10; a <= 0x1a; ++a) {
    const Mad mad = ValidMad(static_cast<AttributeId>(a));
    auto id = CheckMad(mad);
    ASSERT_TRUE(id.ok()) << id.status().message();
    EXPECT_EQ(static_cast<uint16_t>(id.value()), a);
  }
}

TEST(CheckMad, AcceptsALongerBuffer) {
  std::vector<uint8_t> b(300, 0);
  InitMad(b, AttributeId::kDreq, 7);
  EXPECT_TRUE(CheckMad(b).ok());
}

void ExpectRejected(std::span<const uint8_t> mad, const std::string& message) {
  auto id = CheckMad(mad);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), EINVAL);
  EXPECT_EQ(id.status().message(), message);
}

TEST(CheckMad, NamesWhatIsWrong) {
  const Mad good = ValidMad();
  ExpectRejected(std::span<const uint8_t>(good).first(255), "MAD of 255 bytes is shorter than 256");
  ExpectRejected({}, "MAD of 0 bytes is shorter than 256");

  Mad m = good;
  m[0] = 2;
  ExpectRejected(m, "MAD base version 2 is not 1");
  m = good;
  m[1] = 0x81;
  ExpectRejected(m, "management class 0x81 is not CM (0x07)");
  m = good;
  m[2] = 1;
  ExpectRejected(m, "CM class version 1 is not 2");
  m = good;
  m[3] = 0x81;  // GetResp
  ExpectRejected(m, "CM method 0x81 is not Send (0x03)");
  m = good;
  m[17] = 0x1b;
  ExpectRejected(m, "attribute ID 0x001b is not a CM message");
  m = good;
  m[16] = 0x01;  // 0x0110
  ExpectRejected(m, "attribute ID 0x0110 is not a CM message");
  m = good;
  m[17] = 0x0f;
  ExpectRejected(m, "attribute ID 0x000f is not a CM message");
}

// --- REQ --------------------------------------------------------------------

TEST(ReqView, WritesEachFieldAtItsIbaOffset) {
  struct Case {
    const char* field;
    void (*set)(ReqView&);
    Diff want;
  };
  const Case cases[] = {
      {"local comm id",
       [](ReqView& r) { r.set_local_comm_id(0x11223344); },
       {{At(0), 0x11}, {At(1), 0x22}, {At(2), 0x33}, {At(3), 0x44}}},
      {"vendor id",
       [](ReqView& r) { r.set_vendor_id(0xff123456); },
       {{At(5), 0x12}, {At(6), 0x34}, {At(7), 0x56}}},
      {"service id",
       [](ReqView& r) { r.set_service_id(0x0102030405060708ull); },
       {{At(8), 1},
        {At(9), 2},
        {At(10), 3},
        {At(11), 4},
        {At(12), 5},
        {At(13), 6},
        {At(14), 7},
        {At(15), 8}}},
      {"local ca guid",
       [](ReqView& r) { r.set_local_ca_guid(0x1112131415161718ull); },
       {{At(16), 0x11},
        {At(17), 0x12},
        {At(18), 0x13},
        {At(19), 0x14},
        {At(20), 0x15},
        {At(21), 0x16},
        {At(22), 0x17},
        {At(23), 0x18}}},
      {"local qkey",
       [](ReqView& r) { r.set_local_qkey(0xa1a2a3a4); },
       {{At(28), 0xa1}, {At(29), 0xa2}, {At(30), 0xa3}, {At(31), 0xa4}}},
      {"local qpn",
       [](ReqView& r) { r.set_local_qpn(0xff123456); },
       {{At(32), 0x12}, {At(33), 0x34}, {At(34), 0x56}}},
      {"responder resources",
       [](ReqView& r) { r.set_responder_resources(0x99); },
       {{At(35), 0x99}}},
      {"local eecn",
       [](ReqView& r) { r.set_local_eecn(0x654321); },
       {{At(36), 0x65}, {At(37), 0x43}, {At(38), 0x21}}},
      {"initiator depth", [](ReqView& r) { r.set_initiator_depth(0x88); }, {{At(39), 0x88}}},
      {"remote eecn",
       [](ReqView& r) { r.set_remote_eecn(0xabcdef); },
       {{At(40), 0xab}, {At(41), 0xcd}, {At(42), 0xef}}},
      {"remote cm response timeout",
       [](ReqView& r) { r.set_remote_cm_response_timeout(0x1f); },
       {{At(43), 0xf8}}},
      {"transport service type",
       [](ReqView& r) { r.set_transport_service_type(3); },
       {{At(43), 0x06}}},
      {"end-to-end flow control",
       [](ReqView& r) { r.set_end_to_end_flow_control(true); },
       {{At(43), 0x01}}},
      {"starting psn",
       [](ReqView& r) { r.set_starting_psn(0x01abcdef); },
       {{At(44), 0xab}, {At(45), 0xcd}, {At(46), 0xef}}},
      {"local cm response timeout",
       [](ReqView& r) { r.set_local_cm_response_timeout(20); },
       {{At(47), 20 << 3}}},
      {"retry count", [](ReqView& r) { r.set_retry_count(7); }, {{At(47), 0x07}}},
      {"partition key",
       [](ReqView& r) { r.set_partition_key(0xffff); },
       {{At(48), 0xff}, {At(49), 0xff}}},
      {"path mtu", [](ReqView& r) { r.set_path_mtu(5); }, {{At(50), 0x50}}},
      {"rdc exists", [](ReqView& r) { r.set_rdc_exists(true); }, {{At(50), 0x08}}},
      {"rnr retry count", [](ReqView& r) { r.set_rnr_retry_count(6); }, {{At(50), 0x06}}},
      {"max cm retries", [](ReqView& r) { r.set_max_cm_retries(15); }, {{At(51), 0xf0}}},
      {"srq", [](ReqView& r) { r.set_srq(true); }, {{At(51), 0x08}}},
      {"extended transport type",
       [](ReqView& r) { r.set_extended_transport_type(1); },
       {{At(51), 0x01}}},
      {"primary local lid",
       [](ReqView& r) { r.primary_path().set_local_lid(0x1234); },
       {{At(52), 0x12}, {At(53), 0x34}}},
      {"primary remote lid",
       [](ReqView& r) { r.primary_path().set_remote_lid(0x5678); },
       {{At(54), 0x56}, {At(55), 0x78}}},
      {"primary flow label",
       [](ReqView& r) { r.primary_path().set_flow_label(0xfabcde); },
       {{At(88), 0xab}, {At(89), 0xcd}, {At(90), 0xe0}}},
      {"primary packet rate",
       [](ReqView& r) { r.primary_path().set_packet_rate(0x3f); },
       {{At(91), 0x3f}}},
      {"primary traffic class",
       [](ReqView& r) { r.primary_path().set_traffic_class(0xb8); },
       {{At(92), 0xb8}}},
      {"primary hop limit", [](ReqView& r) { r.primary_path().set_hop_limit(64); }, {{At(93), 64}}},
      {"primary sl", [](ReqView& r) { r.primary_path().set_sl(0xf); }, {{At(94), 0xf0}}},
      {"primary subnet local",
       [](ReqView& r) { r.primary_path().set_subnet_local(true); },
       {{At(94), 0x08}}},
      {"primary local ack timeout",
       [](ReqView& r) { r.primary_path().set_local_ack_timeout(19); },
       {{At(95), 19 << 3}}},
      {"alternate local lid",
       [](ReqView& r) { r.alternate_path().set_local_lid(0x4321); },
       {{At(96), 0x43}, {At(97), 0x21}}},
      {"alternate flow label",
       [](ReqView& r) { r.alternate_path().set_flow_label(1); },
       {{At(134), 0x10}}},
      {"alternate local ack timeout",
       [](ReqView& r) { r.alternate_path().set_local_ack_timeout(1); },
       {{At(139), 0x08}}},
      {"sap supported", [](ReqView& r) { r.set_sap_supported(true); }, {{At(139), 0x04}}},
  };
  for (const Case& c : cases) {
    Mad mad{};
    ReqView req(Msg(mad));
    c.set(req);
    EXPECT_EQ(Changed(mad), c.want) << c.field;
  }
}

TEST(ReqView, GidsAreSixteenBytesInNetworkOrder) {
  Mad mad{};
  ReqView req(Msg(mad));
  req.primary_path().set_local_gid(CountingGid(0x10));
  req.primary_path().set_remote_gid(CountingGid(0x40));
  req.alternate_path().set_local_gid(CountingGid(0x70));
  req.alternate_path().set_remote_gid(CountingGid(0xa0));
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(mad[At(56) + i], 0x10 + i);
    EXPECT_EQ(mad[At(72) + i], 0x40 + i);
    EXPECT_EQ(mad[At(100) + i], 0x70 + i);
    EXPECT_EQ(mad[At(116) + i], 0xa0 + i);
  }
  EXPECT_EQ(Changed(mad).size(), 64u);
  EXPECT_EQ(req.primary_path().local_gid(), CountingGid(0x10));
  EXPECT_EQ(req.primary_path().remote_gid(), CountingGid(0x40));
  EXPECT_EQ(req.alternate_path().local_gid(), CountingGid(0x70));
  EXPECT_EQ(req.alternate_path().remote_gid(), CountingGid(0xa0));
}

TEST(ReqView, EveryFieldRoundTrips) {
  Mad mad{};
  ReqView req(Msg(mad));
  req.set_local_comm_id(0xdeadbeef);
  req.set_vendor_id(0x123456);
  req.set_service_id(MakeServiceId(PortSpace::kTcp, 7471));
  req.set_local_ca_guid(0x0002c90300a1b2c3ull);
  req.set_local_qkey(0x11111111);
  req.set_local_qpn(0x000123);
  req.set_responder_resources(16);
  req.set_local_eecn(0x000456);
  req.set_initiator_depth(8);
  req.set_remote_eecn(0x000789);
  req.set_remote_cm_response_timeout(20);
  req.set_transport_service_type(TransportServiceType::kUc);
  req.set_end_to_end_flow_control(true);
  req.set_starting_psn(0xabcdef);
  req.set_local_cm_response_timeout(21);
  req.set_retry_count(6);
  req.set_partition_key(0x8001);
  req.set_path_mtu(3);
  req.set_rdc_exists(true);
  req.set_rnr_retry_count(5);
  req.set_max_cm_retries(14);
  req.set_srq(true);
  req.set_extended_transport_type(2);
  ReqPathView path = req.primary_path();
  path.set_local_lid(0xffff);
  path.set_remote_lid(0xfffe);
  path.set_flow_label(0xedcba);
  path.set_packet_rate(0x2a);
  path.set_traffic_class(0x60);
  path.set_hop_limit(63);
  path.set_sl(9);
  path.set_subnet_local(true);
  path.set_local_ack_timeout(19);
  req.set_sap_supported(true);
  req.private_data()[0] = 0x42;
  req.private_data()[kReqPrivateDataBytes - 1] = 0x43;

  const ConstReqView c{std::span<const uint8_t>(mad).subspan(kMadHeaderBytes)};
  EXPECT_EQ(c.local_comm_id(), 0xdeadbeefu);
  EXPECT_EQ(c.vendor_id(), 0x123456u);
  EXPECT_EQ(c.service_id(), 0x1061d2full);
  EXPECT_EQ(c.local_ca_guid(), 0x0002c90300a1b2c3ull);
  EXPECT_EQ(c.local_qkey(), 0x11111111u);
  EXPECT_EQ(c.local_qpn(), 0x123u);
  EXPECT_EQ(c.responder_resources(), 16);
  EXPECT_EQ(c.local_eecn(), 0x456u);
  EXPECT_EQ(c.initiator_depth(), 8);
  EXPECT_EQ(c.remote_eecn(), 0x789u);
  EXPECT_EQ(c.remote_cm_response_timeout(), 20);
  EXPECT_EQ(c.transport_service_type(), 1);
  EXPECT_TRUE(c.end_to_end_flow_control());
  EXPECT_EQ(c.starting_psn(), 0xabcdefu);
  EXPECT_EQ(c.local_cm_response_timeout(), 21);
  EXPECT_EQ(c.retry_count(), 6);
  EXPECT_EQ(c.partition_key(), 0x8001);
  EXPECT_EQ(c.path_mtu(), 3);
  EXPECT_TRUE(c.rdc_exists());
  EXPECT_EQ(c.rnr_retry_count(), 5);
  EXPECT_EQ(c.max_cm_retries(), 14);
  EXPECT_TRUE(c.srq());
  EXPECT_EQ(c.extended_transport_type(), 2);
  const ConstReqPathView p = c.primary_path();
  EXPECT_EQ(p.local_lid(), 0xffff);
  EXPECT_EQ(p.remote_lid(), 0xfffe);
  EXPECT_EQ(p.flow_label(), 0xedcbau);
  EXPECT_EQ(p.packet_rate(), 0x2a);
  EXPECT_EQ(p.traffic_class(), 0x60);
  EXPECT_EQ(p.hop_limit(), 63);
  EXPECT_EQ(p.sl(), 9);
  EXPECT_TRUE(p.subnet_local());
  EXPECT_EQ(p.local_ack_timeout(), 19);
  EXPECT_TRUE(c.sap_supported());
  EXPECT_EQ(c.alternate_path().local_ack_timeout(), 0);  // SAP is its neighbour
  EXPECT_EQ(c.private_data()[0], 0x42);
  EXPECT_EQ(mad[At(140)], 0x42);
  EXPECT_EQ(mad[kMadBytes - 1], 0x43);
}

// Each bit field, cleared on a background of ones, clears only its own bits;
// set to all ones on zeros, it sets only those.
TEST(ReqView, BitFieldsLeaveTheirNeighboursAlone) {
  struct Case {
    const char* field;
    void (*clear)(ReqView&);
    void (*fill)(ReqView&);
    size_t off;
    uint8_t mask;
  };
  const Case cases[] = {
      {"remote cm response timeout", [](ReqView& r) { r.set_remote_cm_response_timeout(0); },
       [](ReqView& r) { r.set_remote_cm_response_timeout(0xff); }, 43, 0xf8},
      {"transport service type", [](ReqView& r) { r.set_transport_service_type(0); },
       [](ReqView& r) { r.set_transport_service_type(0xff); }, 43, 0x06},
      {"e2e", [](ReqView& r) { r.set_end_to_end_flow_control(false); },
       [](ReqView& r) { r.set_end_to_end_flow_control(true); }, 43, 0x01},
      {"local cm response timeout", [](ReqView& r) { r.set_local_cm_response_timeout(0); },
       [](ReqView& r) { r.set_local_cm_response_timeout(0xff); }, 47, 0xf8},
      {"retry count", [](ReqView& r) { r.set_retry_count(0); },
       [](ReqView& r) { r.set_retry_count(0xff); }, 47, 0x07},
      {"path mtu", [](ReqView& r) { r.set_path_mtu(0); }, [](ReqView& r) { r.set_path_mtu(0xff); },
       50, 0xf0},
      {"rdc exists", [](ReqView& r) { r.set_rdc_exists(false); },
       [](ReqView& r) { r.set_rdc_exists(true); }, 50, 0x08},
      {"rnr retry count", [](ReqView& r) { r.set_rnr_retry_count(0); },
       [](ReqView& r) { r.set_rnr_retry_count(0xff); }, 50, 0x07},
      {"max cm retries", [](ReqView& r) { r.set_max_cm_retries(0); },
       [](ReqView& r) { r.set_max_cm_retries(0xff); }, 51, 0xf0},
      {"srq", [](ReqView& r) { r.set_srq(false); }, [](ReqView& r) { r.set_srq(true); }, 51, 0x08},
      {"extended transport type", [](ReqView& r) { r.set_extended_transport_type(0); },
       [](ReqView& r) { r.set_extended_transport_type(0xff); }, 51, 0x07},
      {"packet rate", [](ReqView& r) { r.primary_path().set_packet_rate(0); },
       [](ReqView& r) { r.primary_path().set_packet_rate(0xff); }, 91, 0x3f},
      {"sl", [](ReqView& r) { r.primary_path().set_sl(0); },
       [](ReqView& r) { r.primary_path().set_sl(0xff); }, 94, 0xf0},
      {"subnet local", [](ReqView& r) { r.primary_path().set_subnet_local(false); },
       [](ReqView& r) { r.primary_path().set_subnet_local(true); }, 94, 0x08},
      {"local ack timeout", [](ReqView& r) { r.primary_path().set_local_ack_timeout(0); },
       [](ReqView& r) { r.primary_path().set_local_ack_timeout(0xff); }, 95, 0xf8},
      {"alternate local ack timeout",
       [](ReqView& r) { r.alternate_path().set_local_ack_timeout(0); },
       [](ReqView& r) { r.alternate_path().set_local_ack_timeout(0xff); }, 139, 0xf8},
      {"sap supported", [](ReqView& r) { r.set_sap_supported(false); },
       [](ReqView& r) { r.set_sap_supported(true); }, 139, 0x04},
  };
  for (const Case& c : cases) {
    Mad ones;
    ones.fill(0xff);
    ReqView a(Msg(ones));
    c.clear(a);
    EXPECT_EQ(Changed(ones, 0xff), (Diff{{At(c.off), static_cast<uint8_t>(~c.mask)}})) << c.field;
    Mad zeros{};
    ReqView b(Msg(zeros));
    c.fill(b);
    EXPECT_EQ(Changed(zeros), (Diff{{At(c.off), c.mask}})) << c.field;
  }
}

TEST(ReqView, FlowLabelKeepsTheReservedBitsAfterIt) {
  Mad mad;
  mad.fill(0xff);
  ReqView req(Msg(mad));
  req.primary_path().set_flow_label(0);
  EXPECT_EQ(Changed(mad, 0xff), (Diff{{At(88), 0}, {At(89), 0}, {At(90), 0x0f}}));
  EXPECT_EQ(req.primary_path().packet_rate(), 0x3f);
}

TEST(ReqView, TwentyFourBitSettersDropTheHighByte) {
  Mad mad;
  mad.fill(0xaa);
  ReqView req(Msg(mad));
  req.set_local_qpn(0x12000001);
  req.set_starting_psn(0xff000002);
  EXPECT_EQ(req.local_qpn(), 1u);
  EXPECT_EQ(req.starting_psn(), 2u);
  EXPECT_EQ(mad[At(35)], 0xaa);  // responder resources
  EXPECT_EQ(mad[At(47)], 0xaa);  // timeouts and retry count
}

// --- REP --------------------------------------------------------------------

TEST(RepView, WritesEachFieldAtItsIbaOffset) {
  struct Case {
    const char* field;
    void (*set)(RepView&);
    Diff want;
  };
  const Case cases[] = {
      {"local comm id",
       [](RepView& r) { r.set_local_comm_id(0x01020304); },
       {{At(0), 1}, {At(1), 2}, {At(2), 3}, {At(3), 4}}},
      {"remote comm id",
       [](RepView& r) { r.set_remote_comm_id(0x05060708); },
       {{At(4), 5}, {At(5), 6}, {At(6), 7}, {At(7), 8}}},
      {"local qkey",
       [](RepView& r) { r.set_local_qkey(0x090a0b0c); },
       {{At(8), 9}, {At(9), 10}, {At(10), 11}, {At(11), 12}}},
      {"local qpn",
       [](RepView& r) { r.set_local_qpn(0xff112233); },
       {{At(12), 0x11}, {At(13), 0x22}, {At(14), 0x33}}},
      {"vendor id",
       [](RepView& r) { r.set_vendor_id(0xabcdef); },
       {{At(15), 0xab}, {At(19), 0xcd}, {At(23), 0xef}}},
      {"local eecn",
       [](RepView& r) { r.set_local_eecn(0x445566); },
       {{At(16), 0x44}, {At(17), 0x55}, {At(18), 0x66}}},
      {"starting psn",
       [](RepView& r) { r.set_starting_psn(0x778899); },
       {{At(20), 0x77}, {At(21), 0x88}, {At(22), 0x99}}},
      {"responder resources",
       [](RepView& r) { r.set_responder_resources(0x10); },
       {{At(24), 0x10}}},
      {"initiator depth", [](RepView& r) { r.set_initiator_depth(0x20); }, {{At(25), 0x20}}},
      {"target ack delay", [](RepView& r) { r.set_target_ack_delay(15); }, {{At(26), 15 << 3}}},
      {"failover accepted", [](RepView& r) { r.set_failover_accepted(3); }, {{At(26), 0x06}}},
      {"e2e", [](RepView& r) { r.set_end_to_end_flow_control(true); }, {{At(26), 0x01}}},
      {"rnr retry count", [](RepView& r) { r.set_rnr_retry_count(7); }, {{At(27), 0xe0}}},
      {"srq", [](RepView& r) { r.set_srq(true); }, {{At(27), 0x10}}},
      {"local ca guid",
       [](RepView& r) { r.set_local_ca_guid(0xa0a1a2a3a4a5a6a7ull); },
       {{At(28), 0xa0},
        {At(29), 0xa1},
        {At(30), 0xa2},
        {At(31), 0xa3},
        {At(32), 0xa4},
        {At(33), 0xa5},
        {At(34), 0xa6},
        {At(35), 0xa7}}},
      {"private data", [](RepView& r) { r.private_data()[0] = 0x5a; }, {{At(36), 0x5a}}},
  };
  for (const Case& c : cases) {
    Mad mad{};
    RepView rep(Msg(mad));
    c.set(rep);
    EXPECT_EQ(Changed(mad), c.want) << c.field;
  }
}

TEST(RepView, EveryFieldRoundTripsAndBitFieldsStayApart) {
  Mad mad;
  mad.fill(0xff);
  RepView rep(Msg(mad));
  rep.set_local_comm_id(1);
  rep.set_remote_comm_id(2);
  rep.set_local_qkey(3);
  rep.set_local_qpn(4);
  rep.set_vendor_id(5);
  rep.set_local_eecn(6);
  rep.set_starting_psn(7);
  rep.set_responder_resources(8);
  rep.set_initiator_depth(9);
  rep.set_target_ack_delay(10);
  rep.set_failover_accepted(1);
  rep.set_end_to_end_flow_control(false);
  rep.set_rnr_retry_count(2);
  rep.set_srq(false);
  rep.set_local_ca_guid(11);
  const ConstRepView c{std::span<const uint8_t>(Msg(mad))};
  EXPECT_EQ(c.local_comm_id(), 1u);
  EXPECT_EQ(c.remote_comm_id(), 2u);
  EXPECT_EQ(c.local_qkey(), 3u);
  EXPECT_EQ(c.local_qpn(), 4u);
  EXPECT_EQ(c.vendor_id(), 5u);
  EXPECT_EQ(c.local_eecn(), 6u);
  EXPECT_EQ(c.starting_psn(), 7u);
  EXPECT_EQ(c.responder_resources(), 8);
  EXPECT_EQ(c.initiator_depth(), 9);
  EXPECT_EQ(c.target_ack_delay(), 10);
  EXPECT_EQ(c.failover_accepted(), 1);
  EXPECT_FALSE(c.end_to_end_flow_control());
  EXPECT_EQ(c.rnr_retry_count(), 2);
  EXPECT_FALSE(c.srq());
  EXPECT_EQ(c.local_ca_guid(), 11u);
  EXPECT_EQ(mad[At(26)], (10 << 3) | (1 << 1) | 0);
  EXPECT_EQ(mad[At(27)], (2 << 5) | 0x0f);  // reserved low nibble untouched
}

// --- RTU, DREP, DREQ ------------------------------------------------------

TEST(RtuAndDrepViews, AreTwoCommIdsAndPrivateData) {
  Mad mad{};
  RtuView rtu(Msg(mad));
  rtu.set_local_comm_id(0x01020304);
  rtu.set_remote_comm_id(0x05060708);
  rtu.private_data()[0] = 0xaa;
  rtu.private_data()[kRtuPrivateDataBytes - 1] = 0xbb;
  EXPECT_EQ(Changed(mad), (Diff{{At(0), 1},
                                {At(1), 2},
                                {At(2), 3},
                                {At(3), 4},
                                {At(4), 5},
                                {At(5), 6},
                                {At(6), 7},
                                {At(7), 8},
                                {At(8), 0xaa},
                                {kMadBytes - 1, 0xbb}}));
  const ConstDrepView drep{std::span<const uint8_t>(Msg(mad))};
  EXPECT_EQ(drep.local_comm_id(), 0x01020304u);
  EXPECT_EQ(drep.remote_comm_id(), 0x05060708u);
  EXPECT_EQ(drep.private_data().size(), kDrepPrivateDataBytes);
}

TEST(DreqView, RemoteQpnIsTwentyFourBitsAtEight) {
  Mad mad;
  mad.fill(0xff);
  DreqView dreq(Msg(mad));
  dreq.set_local_comm_id(0);
  dreq.set_remote_comm_id(0x11111111);
  dreq.set_remote_qpn_eecn(0x00000012);
  dreq.private_data()[0] = 0;
  EXPECT_EQ(Changed(mad, 0xff), (Diff{{At(0), 0},
                                      {At(1), 0},
                                      {At(2), 0},
                                      {At(3), 0},
                                      {At(4), 0x11},
                                      {At(5), 0x11},
                                      {At(6), 0x11},
                                      {At(7), 0x11},
                                      {At(8), 0},
                                      {At(9), 0},
                                      {At(10), 0x12},
                                      {At(12), 0}}));
  EXPECT_EQ(dreq.remote_qpn_eecn(), 0x12u);
  EXPECT_EQ(dreq.remote_comm_id(), 0x11111111u);
  EXPECT_EQ(dreq.local_comm_id(), 0u);
}

// --- REJ and MRA ------------------------------------------------------------

TEST(RejView, FieldsAtTheirIbaOffsets) {
  Mad mad{};
  RejView rej(Msg(mad));
  rej.set_local_comm_id(0);
  rej.set_remote_comm_id(0x0a0b0c0d);
  rej.set_message_rejected(MessageKind::kOther);
  rej.set_reject_info_length(8);
  rej.set_reason(RejReason::kConsumerDefined);
  rej.ari()[0] = 0x77;
  rej.private_data()[0] = 0x88;
  EXPECT_EQ(Changed(mad), (Diff{{At(4), 0x0a},
                                {At(5), 0x0b},
                                {At(6), 0x0c},
                                {At(7), 0x0d},
                                {At(8), 0x80},
                                {At(9), 8 << 1},
                                {At(11), 28},
                                {At(12), 0x77},
                                {At(84), 0x88}}));
  const ConstRejView c{std::span<const uint8_t>(Msg(mad))};
  EXPECT_EQ(c.remote_comm_id(), 0x0a0b0c0du);
  EXPECT_EQ(c.message_rejected(), 2);
  EXPECT_EQ(c.reject_info_length(), 8);
  EXPECT_EQ(c.reason(), 28);
}

TEST(RejView, BitFieldsLeaveReservedBitsAlone) {
  Mad mad;
  mad.fill(0xff);
  RejView rej(Msg(mad));
  rej.set_message_rejected(0);
  rej.set_reject_info_length(0);
  EXPECT_EQ(mad[At(8)], 0x3f);
  EXPECT_EQ(mad[At(9)], 0x01);
  rej.set_message_rejected(0xff);
  rej.set_reject_info_length(0xff);
  EXPECT_EQ(rej.message_rejected(), 3);
  EXPECT_EQ(rej.reject_info_length(), 0x7f);
  EXPECT_EQ(Changed(mad, 0xff), Diff{});
}

TEST(MraView, FieldsAtTheirIbaOffsets) {
  Mad mad{};
  MraView mra(Msg(mad));
  mra.set_local_comm_id(0x01000000);
  mra.set_remote_comm_id(0x00000002);
  mra.set_message_mraed(MessageKind::kRep);
  mra.set_service_timeout(24);
  mra.private_data()[0] = 0x99;
  EXPECT_EQ(Changed(mad),
            (Diff{{At(0), 1}, {At(7), 2}, {At(8), 0x40}, {At(9), 24 << 3}, {At(10), 0x99}}));
  EXPECT_EQ(mra.local_comm_id(), 0x01000000u);
  EXPECT_EQ(mra.remote_comm_id(), 2u);
  EXPECT_EQ(mra.message_mraed(), 1);
  EXPECT_EQ(mra.service_timeout(), 24);
  mad.fill(0xff);
  mra.set_message_mraed(0);
  mra.set_service_timeout(0);
  EXPECT_EQ(Changed(mad, 0xff), (Diff{{At(8), 0x3f}, {At(9), 0x07}}));
}

// --- SIDR -------------------------------------------------------------------

TEST(SidrReqView, FieldsAtTheirIbaOffsets) {
  Mad mad{};
  SidrReqView req(Msg(mad));
  req.set_request_id(0x01020304);
  req.set_partition_key(0xffff);
  req.set_service_id(MakeServiceId(PortSpace::kUdp, 0x1234));
  req.private_data()[0] = 0x11;
  EXPECT_EQ(Changed(mad), (Diff{{At(0), 1},
                                {At(1), 2},
                                {At(2), 3},
                                {At(3), 4},
                                {At(4), 0xff},
                                {At(5), 0xff},
                                {At(12), 0x01},
                                {At(13), 0x11},
                                {At(14), 0x12},
                                {At(15), 0x34},
                                {At(16), 0x11}}));
  EXPECT_EQ(req.request_id(), 0x01020304u);
  EXPECT_EQ(req.partition_key(), 0xffff);
  EXPECT_EQ(req.service_id(), 0x0000000001111234ull);
}

TEST(SidrRepView, FieldsAtTheirIbaOffsets) {
  Mad mad{};
  SidrRepView rep(Msg(mad));
  rep.set_request_id(0x0a0b0c0d);
  rep.set_status(SidrStatus::kRedirect);
  rep.set_additional_info_length(16);
  rep.set_vendor_id(0x123456);
  rep.set_qpn(0xff000011);
  rep.set_service_id(0x1111111111111111ull);
  rep.set_qkey(0x01234567);
  rep.additional_info()[0] = 0xa1;
  rep.private_data()[0] = 0xb1;
  Diff want = {{At(0), 0x0a}, {At(1), 0x0b}, {At(2), 0x0c}, {At(3), 0x0d},  {At(4), 4},
               {At(5), 16},   {At(6), 0x12}, {At(7), 0x34}, {At(10), 0x11}, {At(11), 0x56}};
  for (size_t i = 12; i < 20; ++i) want.emplace_back(At(i), 0x11);
  want.insert(want.end(), {{At(20), 0x01},
                           {At(21), 0x23},
                           {At(22), 0x45},
                           {At(23), 0x67},
                           {At(24), 0xa1},
                           {At(96), 0xb1}});
  EXPECT_EQ(Changed(mad), want);
  const ConstSidrRepView c{std::span<const uint8_t>(Msg(mad))};
  EXPECT_EQ(c.request_id(), 0x0a0b0c0du);
  EXPECT_EQ(c.status(), 4);
  EXPECT_EQ(c.additional_info_length(), 16);
  EXPECT_EQ(c.vendor_id(), 0x123456u);
  EXPECT_EQ(c.qpn(), 0x11u);
  EXPECT_EQ(c.service_id(), 0x1111111111111111ull);
  EXPECT_EQ(c.qkey(), 0x01234567u);
}

// --- the CMA header ---------------------------------------------------------

TEST(CmaHeaderView, Ipv4AddressesTakeTheLastFourBytes) {
  std::array<uint8_t, kCmaHeaderBytes> b;
  b.fill(0xee);
  CmaHeaderView h{std::span<uint8_t>(b)};
  h.set_cma_version(CmaHeaderView::kVersion);
  h.set_ip_version(4);
  h.set_port(0x1d2f);
  h.set_src_ipv4(0xc0a80001);  // 192.168.0.1
  h.set_dst_ipv4(0x0a000002);  // 10.0.0.2
  std::array<uint8_t, kCmaHeaderBytes> want{};
  want[1] = 0x4e;  // the reserved low nibble is left as it was
  want[2] = 0x1d;
  want[3] = 0x2f;
  want[16] = 192;
  want[17] = 168;
  want[18] = 0;
  want[19] = 1;
  want[32] = 10;
  want[35] = 2;
  EXPECT_EQ(b, want);
  EXPECT_EQ(h.cma_version(), 0);
  EXPECT_EQ(h.ip_version(), 4);
  EXPECT_EQ(h.port(), 0x1d2f);
  EXPECT_EQ(h.src_ipv4(), 0xc0a80001u);
  EXPECT_EQ(h.dst_ipv4(), 0x0a000002u);
}

TEST(CmaHeaderView, Ipv6AddressesTakeAllSixteen) {
  std::array<uint8_t, kCmaHeaderBytes> b{};
  CmaHeaderView h{std::span<uint8_t>(b)};
  h.set_ip_version(6);
  h.set_src_addr(CountingGid(0x20));
  h.set_dst_addr(CountingGid(0x30));
  EXPECT_EQ(b[1], 0x60);
  EXPECT_EQ(b[4], 0x20);
  EXPECT_EQ(b[19], 0x2f);
  EXPECT_EQ(b[20], 0x30);
  EXPECT_EQ(b[35], 0x3f);
  const ConstCmaHeaderView c{std::span<const uint8_t>(b)};
  EXPECT_EQ(c.src_addr(), CountingGid(0x20));
  EXPECT_EQ(c.dst_addr(), CountingGid(0x30));
}

TEST(CmaHeaderView, SitsAtTheStartOfReqPrivateData) {
  Mad mad{};
  ReqView req(Msg(mad));
  CmaHeaderView h(req.private_data());
  h.set_ip_version(4);
  h.set_port(7471);
  EXPECT_EQ(Changed(mad), (Diff{{At(141), 0x40}, {At(142), 0x1d}, {At(143), 0x2f}}));
}

// --- DescribeMad ------------------------------------------------------------

TEST(DescribeMad, OneLinePerMessage) {
  Mad mad;
  InitMad(mad, AttributeId::kReq, 1);
  ReqView req(Msg(mad));
  req.set_local_comm_id(0x1234);
  req.set_service_id(MakeServiceId(PortSpace::kTcp, 7471));
  req.set_local_qpn(0x11);
  req.set_starting_psn(0xabc);
  EXPECT_EQ(DescribeMad(mad), "REQ comm 0x1234 sid 0x1061d2f qpn 0x11 psn 0xabc");

  InitMad(mad, AttributeId::kRej, 1);
  RejView rej(Msg(mad));
  rej.set_remote_comm_id(0x1234);
  rej.set_reason(RejReason::kInvalidServiceId);
  EXPECT_EQ(DescribeMad(mad),
            "REJ comm 0x0 remote 0x1234 reason 8 (invalid service ID) rejected 0");

  InitMad(mad, AttributeId::kRep, 1);
  RepView rep(Msg(mad));
  rep.set_local_comm_id(0x5);
  rep.set_remote_comm_id(0x1234);
  rep.set_local_qpn(0x12);
  rep.set_starting_psn(0x77);
  EXPECT_EQ(DescribeMad(mad), "REP comm 0x5 remote 0x1234 qpn 0x12 psn 0x77");

  InitMad(mad, AttributeId::kMra, 1);
  MraView mra(Msg(mad));
  mra.set_service_timeout(24);
  EXPECT_EQ(DescribeMad(mad), "MRA comm 0x0 remote 0x0 mraed 0 timeout 24");

  InitMad(mad, AttributeId::kDreq, 1);
  DreqView(Msg(mad)).set_remote_qpn_eecn(0x11);
  EXPECT_EQ(DescribeMad(mad), "DREQ comm 0x0 remote 0x0 qpn 0x11");

  InitMad(mad, AttributeId::kDrep, 1);
  DrepView(Msg(mad)).set_local_comm_id(0x9);
  EXPECT_EQ(DescribeMad(mad), "DREP comm 0x9 remote 0x0");

  InitMad(mad, AttributeId::kRtu, 1);
  EXPECT_EQ(DescribeMad(mad), "RTU comm 0x0 remote 0x0");

  InitMad(mad, AttributeId::kSidrReq, 1);
  SidrReqView sreq(Msg(mad));
  sreq.set_request_id(3);
  sreq.set_partition_key(0xffff);
  sreq.set_service_id(MakeServiceId(PortSpace::kUdp, 4000));
  EXPECT_EQ(DescribeMad(mad), "SIDR_REQ id 0x3 sid 0x1110fa0 pkey 0xffff");

  InitMad(mad, AttributeId::kSidrRep, 1);
  SidrRepView srep(Msg(mad));
  srep.set_request_id(3);
  srep.set_status(SidrStatus::kUnsupported);
  EXPECT_EQ(DescribeMad(mad),
            "SIDR_REP id 0x3 status 1 (service ID not supported) qpn 0x0 qkey 0x0");

  InitMad(mad, AttributeId::kLap, 1);
  EXPECT_EQ(DescribeMad(mad), "LAP comm 0x0 remote 0x0");
}

TEST(DescribeMad, SaysWhyBytesAreNotACmMad) {
  Mad mad = ValidMad();
  mad[1] = 0x81;
  EXPECT_EQ(DescribeMad(mad), "not a CM MAD: management class 0x81 is not CM (0x07)");
  EXPECT_EQ(DescribeMad(std::span<const uint8_t>(mad).first(10)),
            "not a CM MAD: MAD of 10 bytes is shorter than 256");
}

}  // namespace
}  // namespace rdmaemu::cm
