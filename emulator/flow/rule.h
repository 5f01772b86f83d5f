// Flow rules: which received Ethernet frames a raw packet QP gets.
//
// A rule is what ibv_create_flow's specs say, in the device's own terms
// (host byte order, one optional match per layer). Each field is compared
// under its mask: a frame matches when (frame & mask) == (value & mask) for
// every field of every layer the rule has; a zero mask ignores the field.
// A layer the rule has must be present in the frame: an IPv4 match needs an
// IPv4 frame, a TCP match a TCP header (as the man page's specs imply: each
// spec describes a header of the packet).
//
// Steering (Steer) picks the rules a frame goes to, as the verbs man page
// defines the rule types:
//   kNormal      the matching rules of the best (lowest) priority value;
//   kMcDefault   a multicast frame no normal rule took;
//   kAllDefault  any frame no normal rule (nor, for multicast, an MC
//                default rule) took;
//   kSniffer     every frame, whatever else took it.
// A QP gets one copy of a frame however many of its rules match.
//
// Pure functions over values: no locks, no engine state.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "emulator/wire/ethernet.h"

namespace rdmaemu::flow {

struct EthMatch {
  wire::MacAddress dst{}, dst_mask{};
  wire::MacAddress src{}, src_mask{};
  uint16_t ether_type = 0, ether_type_mask = 0;
  uint16_t vlan_tag = 0, vlan_tag_mask = 0;
};

struct Ipv4Match {
  uint32_t src = 0, src_mask = 0;
  uint32_t dst = 0, dst_mask = 0;
  uint8_t proto = 0, proto_mask = 0;
  uint8_t tos = 0, tos_mask = 0;
  uint8_t ttl = 0, ttl_mask = 0;
  uint8_t flags = 0, flags_mask = 0;
};

struct Ipv6Match {
  std::array<uint8_t, 16> src{}, src_mask{};
  std::array<uint8_t, 16> dst{}, dst_mask{};
  uint32_t flow_label = 0, flow_label_mask = 0;
  uint8_t next_hdr = 0, next_hdr_mask = 0;
  uint8_t traffic_class = 0, traffic_class_mask = 0;
  uint8_t hop_limit = 0, hop_limit_mask = 0;
};

struct L4Match {
  uint8_t proto = 0;  // wire::kIpProtoTcp or kIpProtoUdp
  uint16_t src_port = 0, src_port_mask = 0;
  uint16_t dst_port = 0, dst_port_mask = 0;
};

struct Match {
  std::optional<EthMatch> eth;
  std::optional<Ipv4Match> ipv4;
  std::optional<Ipv6Match> ipv6;
  std::optional<L4Match> l4;
};

bool Matches(const Match& match, const wire::FrameFields& frame);

// enum ibv_flow_attr_type's numbering.
enum class RuleType : uint8_t { kNormal = 0, kAllDefault = 1, kMcDefault = 2, kSniffer = 3 };

struct Rule {
  uint64_t id = 0;      // unique on the device
  uint32_t qpn = 0;     // the raw packet QP it steers to
  uint8_t port = 1;
  RuleType type = RuleType::kNormal;
  uint16_t priority = 0;  // lower is stronger (kNormal only)
  Match match;
};

// The QPs (each once, in rule order) that get `frame` arriving on `port`.
void Steer(std::span<const Rule> rules, uint8_t port, const wire::FrameFields& frame,
           std::vector<uint32_t>& qpns);

}  // namespace rdmaemu::flow
