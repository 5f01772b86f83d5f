#include "emulator/flow/rule.h"

#include <gtest/gtest.h>

namespace rdmaemu::flow {
namespace {

constexpr wire::MacAddress kAll = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
constexpr wire::MacAddress kMacA = {0x02, 0x00, 0x7f, 0, 0, 1};
constexpr wire::MacAddress kMacB = {0x02, 0x00, 0x7f, 0, 0, 2};

wire::FrameFields UdpFrame(wire::MacAddress dst, uint16_t dst_port) {
  wire::FrameFields f;
  f.dst = dst;
  f.src = kMacA;
  f.ether_type = wire::kEtherTypeIpv4;
  f.has_ipv4 = true;
  f.ipv4_src = 0x0a000001;
  f.ipv4_dst = 0x0a000002;
  f.ipv4_proto = wire::kIpProtoUdp;
  f.l4_proto = wire::kIpProtoUdp;
  f.l4_src_port = 1000;
  f.l4_dst_port = dst_port;
  return f;
}

Match DstMac(wire::MacAddress mac) {
  EthMatch e;
  e.dst = mac;
  e.dst_mask = kAll;
  return Match{e, {}, {}, {}};
}

Rule MakeRule(uint32_t qpn, RuleType type, uint16_t priority, Match m) {
  Rule r;
  r.qpn = qpn;
  r.type = type;
  r.priority = priority;
  r.match = m;
  return r;
}

TEST(RuleTest, EmptyMatchTakesEverything) {
  EXPECT_TRUE(Matches(Match{}, UdpFrame(kMacB, 7)));
}

TEST(RuleTest, FieldsAreComparedUnderTheirMasks) {
  Match m = DstMac(kMacB);
  EXPECT_TRUE(Matches(m, UdpFrame(kMacB, 7)));
  EXPECT_FALSE(Matches(m, UdpFrame(kMacA, 7)));
  // Only the last byte masked out: A and B differ there alone.
  m.eth->dst_mask[5] = 0;
  EXPECT_TRUE(Matches(m, UdpFrame(kMacA, 7)));
}

TEST(RuleTest, IpAndPortMatches) {
  Ipv4Match ip;
  ip.dst = 0x0a000002;
  ip.dst_mask = 0xffffffff;
  L4Match udp;
  udp.proto = wire::kIpProtoUdp;
  udp.dst_port = 4000;
  udp.dst_port_mask = 0xffff;
  Match m{std::nullopt, ip, std::nullopt, udp};
  EXPECT_TRUE(Matches(m, UdpFrame(kMacB, 4000)));
  EXPECT_FALSE(Matches(m, UdpFrame(kMacB, 4001)));
  // A TCP match on a UDP frame misses even with every port masked out.
  L4Match tcp;
  tcp.proto = wire::kIpProtoTcp;
  EXPECT_FALSE(Matches(Match{std::nullopt, std::nullopt, std::nullopt, tcp}, UdpFrame(kMacB, 1)));
}

TEST(RuleTest, LayerMatchNeedsTheLayer) {
  wire::FrameFields arp;
  arp.dst = kAll;
  arp.ether_type = 0x0806;
  EXPECT_FALSE(Matches(Match{std::nullopt, Ipv4Match{}, std::nullopt, std::nullopt}, arp));
  EXPECT_FALSE(Matches(Match{std::nullopt, std::nullopt, Ipv6Match{}, std::nullopt}, arp));
}

TEST(RuleTest, VlanRuleMissesUntaggedFrame) {
  EthMatch e;
  e.vlan_tag = 0x0005;
  e.vlan_tag_mask = 0x0fff;
  EXPECT_FALSE(Matches(Match{e, {}, {}, {}}, UdpFrame(kMacB, 7)));
  wire::FrameFields tagged = UdpFrame(kMacB, 7);
  tagged.has_vlan = true;
  tagged.vlan_tag = 0x2005;
  EXPECT_TRUE(Matches(Match{e, {}, {}, {}}, tagged));
}

TEST(RuleTest, BestPriorityWinsAndEveryQpGetsOneCopy) {
  std::vector<Rule> rules = {
      MakeRule(10, RuleType::kNormal, 5, DstMac(kMacB)),
      MakeRule(11, RuleType::kNormal, 1, DstMac(kMacB)),
      MakeRule(12, RuleType::kNormal, 1, Match{}),
      MakeRule(12, RuleType::kNormal, 1, DstMac(kMacB)),
  };
  std::vector<uint32_t> qpns;
  Steer(rules, 1, UdpFrame(kMacB, 7), qpns);
  EXPECT_EQ(qpns, (std::vector<uint32_t>{11, 12}));
}

TEST(RuleTest, OtherPortsRulesAreIgnored) {
  std::vector<Rule> rules = {MakeRule(10, RuleType::kNormal, 0, Match{})};
  rules[0].port = 2;
  std::vector<uint32_t> qpns;
  Steer(rules, 1, UdpFrame(kMacB, 7), qpns);
  EXPECT_TRUE(qpns.empty());
}

TEST(RuleTest, DefaultRulesTakeWhatNoNormalRuleTook) {
  std::vector<Rule> rules = {
      MakeRule(10, RuleType::kNormal, 0, DstMac(kMacB)),
      MakeRule(20, RuleType::kAllDefault, 0, Match{}),
      MakeRule(30, RuleType::kMcDefault, 0, Match{}),
      MakeRule(40, RuleType::kSniffer, 0, Match{}),
  };
  std::vector<uint32_t> qpns;
  Steer(rules, 1, UdpFrame(kMacB, 7), qpns);
  EXPECT_EQ(qpns, (std::vector<uint32_t>{10, 40}));
  Steer(rules, 1, UdpFrame(kMacA, 7), qpns);  // unicast nobody steers
  EXPECT_EQ(qpns, (std::vector<uint32_t>{20, 40}));
  Steer(rules, 1, UdpFrame(kAll, 7), qpns);  // broadcast nobody steers
  EXPECT_EQ(qpns, (std::vector<uint32_t>{30, 40}));
  rules.erase(rules.begin() + 2);  // without an MC default rule, the all default takes it
  Steer(rules, 1, UdpFrame(kAll, 7), qpns);
  EXPECT_EQ(qpns, (std::vector<uint32_t>{20, 40}));
}

}  // namespace
}  // namespace rdmaemu::flow
