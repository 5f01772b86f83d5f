#include "emulator/wire/ethernet.h"

#include <gtest/gtest.h>

#include <vector>

namespace rdmaemu::wire {
namespace {

// An Ethernet + IPv4 + UDP frame from 10.0.0.1:1000 to 10.0.0.2:2000.
std::vector<uint8_t> Ipv4UdpFrame() {
  std::vector<uint8_t> f = {
      0x02, 0x00, 0x7f, 0x00, 0x00, 0x02,  // dst
      0x02, 0x00, 0x7f, 0x00, 0x00, 0x01,  // src
      0x08, 0x00,                          // IPv4
      0x45, 0x10, 0x00, 0x20, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,  // ver..checksum
      10, 0, 0, 1, 10, 0, 0, 2,                                                 // addresses
      0x03, 0xe8, 0x07, 0xd0, 0x00, 0x0c, 0x00, 0x00,                          // UDP
      'h', 'i', '!', '!'};
  return f;
}

TEST(EthernetTest, ParsesL2L3AndL4Fields) {
  auto f = ParseFrame(Ipv4UdpFrame());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->dst, (MacAddress{0x02, 0x00, 0x7f, 0, 0, 2}));
  EXPECT_EQ(f->ether_type, kEtherTypeIpv4);
  EXPECT_FALSE(f->has_vlan);
  ASSERT_TRUE(f->has_ipv4);
  EXPECT_EQ(f->ipv4_src, 0x0a000001u);
  EXPECT_EQ(f->ipv4_dst, 0x0a000002u);
  EXPECT_EQ(f->ipv4_proto, kIpProtoUdp);
  EXPECT_EQ(f->ipv4_tos, 0x10);
  EXPECT_EQ(f->ipv4_flags, 2);  // don't fragment
  EXPECT_EQ(f->l4_proto, kIpProtoUdp);
  EXPECT_EQ(f->l4_src_port, 1000);
  EXPECT_EQ(f->l4_dst_port, 2000);
}

TEST(EthernetTest, VlanTagIsReadAndSkipped) {
  auto frame = Ipv4UdpFrame();
  const uint8_t tag[] = {0x81, 0x00, 0x20, 0x05};
  frame.insert(frame.begin() + 12, tag, tag + 4);
  auto f = ParseFrame(frame);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->has_vlan);
  EXPECT_EQ(f->vlan_tag, 0x2005);
  EXPECT_EQ(f->ether_type, kEtherTypeIpv4);
  EXPECT_TRUE(f->has_ipv4);
  EXPECT_EQ(f->l4_dst_port, 2000);
}

TEST(EthernetTest, TruncatedIpHeaderLeavesOnlyL2) {
  auto frame = Ipv4UdpFrame();
  frame.resize(kEthHeaderBytes + 10);
  auto f = ParseFrame(frame);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->has_ipv4);
  EXPECT_EQ(f->l4_proto, 0);
}

TEST(EthernetTest, ShorterThanHeaderIsRefused) {
  std::vector<uint8_t> frame(kEthHeaderBytes - 1, 0);
  EXPECT_EQ(ParseFrame(frame).status().code(), EINVAL);
}

TEST(EthernetTest, Ipv6TcpPorts) {
  std::vector<uint8_t> f(kEthHeaderBytes + 40 + 20, 0);
  f[12] = 0x86;
  f[13] = 0xdd;
  f[14] = 0x60;
  f[14 + 6] = kIpProtoTcp;
  f[14 + 7] = 64;
  f[14 + 8] = 0xfe;             // source fe80::...
  f[14 + 24 + 15] = 0x01;       // destination ::1
  f[54] = 0x00;
  f[55] = 22;                   // source port 22
  f[56] = 0x1f;
  f[57] = 0x90;                 // destination port 8080
  auto p = ParseFrame(f);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->has_ipv6);
  EXPECT_EQ(p->ipv6_src[0], 0xfe);
  EXPECT_EQ(p->ipv6_dst[15], 1);
  EXPECT_EQ(p->l4_proto, kIpProtoTcp);
  EXPECT_EQ(p->l4_src_port, 22);
  EXPECT_EQ(p->l4_dst_port, 8080);
}

TEST(EthernetTest, EncapsulationRoundTripsAndIsNoBth) {
  auto frame = Ipv4UdpFrame();
  std::vector<uint8_t> d;
  EncapsulateFrame(frame, d);
  EXPECT_TRUE(IsRawFrameDatagram(d));
  // 0xFF is a manufacturer-specific BTH opcode: no RoCE packet starts so.
  EXPECT_EQ(d[0], 0xff);
  auto back = DecapsulateFrame(d);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::equal(back->begin(), back->end(), frame.begin(), frame.end()));
}

TEST(EthernetTest, MalformedEncapsulationsAreRefused) {
  std::vector<uint8_t> d;
  EncapsulateFrame(std::vector<uint8_t>(5, 0), d);  // shorter than a header
  EXPECT_EQ(DecapsulateFrame(d).status().code(), EINVAL);
  EncapsulateFrame(std::vector<uint8_t>(kMaxFrameBytes + 1, 0), d);
  EXPECT_EQ(DecapsulateFrame(d).status().code(), EINVAL);
  std::vector<uint8_t> roce(40, 0);  // a BTH starting with opcode 0 (RC SEND FIRST)
  EXPECT_FALSE(IsRawFrameDatagram(roce));
  EXPECT_FALSE(IsRawFrameDatagram(std::vector<uint8_t>{0xff, 'E'}));
}

TEST(EthernetTest, PortMacIsLocalUnicastAndGivesItsPortBack) {
  const MacAddress mac = MacOfPort(0x7f000005);
  EXPECT_EQ(mac, (MacAddress{0x02, 0x00, 0x7f, 0x00, 0x00, 0x05}));
  EXPECT_FALSE(IsMulticastMac(mac));
  EXPECT_EQ(PortOfMac(mac), 0x7f000005u);
  EXPECT_EQ(PortOfMac(MacAddress{0x00, 0x11, 0x22, 0x33, 0x44, 0x55}), 0u);
  EXPECT_TRUE(IsMulticastMac(MacAddress{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
}

}  // namespace
}  // namespace rdmaemu::wire
