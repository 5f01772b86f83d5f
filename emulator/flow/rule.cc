#include "emulator/flow/rule.h"

#include <algorithm>
#include <limits>

namespace rdmaemu::flow {
namespace {

template <typename T>
bool Equal(T frame, T value, T mask) {
  return (frame & mask) == (value & mask);
}

template <size_t N>
bool EqualBytes(const std::array<uint8_t, N>& frame, const std::array<uint8_t, N>& value,
                const std::array<uint8_t, N>& mask) {
  for (size_t i = 0; i < N; ++i) {
    if ((frame[i] & mask[i]) != (value[i] & mask[i])) return false;
  }
  return true;
}

bool MatchesEth(const EthMatch& m, const wire::FrameFields& f) {
  // A rule on the VLAN tag asks for a tagged frame; an untagged frame's tag
  // reads as 0, so only a rule that asks for a nonzero tag misses it.
  return EqualBytes(f.dst, m.dst, m.dst_mask) && EqualBytes(f.src, m.src, m.src_mask) &&
         Equal(f.ether_type, m.ether_type, m.ether_type_mask) &&
         Equal(f.vlan_tag, m.vlan_tag, m.vlan_tag_mask);
}

bool MatchesIpv4(const Ipv4Match& m, const wire::FrameFields& f) {
  return f.has_ipv4 && Equal(f.ipv4_src, m.src, m.src_mask) && Equal(f.ipv4_dst, m.dst, m.dst_mask) &&
         Equal(f.ipv4_proto, m.proto, m.proto_mask) && Equal(f.ipv4_tos, m.tos, m.tos_mask) &&
         Equal(f.ipv4_ttl, m.ttl, m.ttl_mask) && Equal(f.ipv4_flags, m.flags, m.flags_mask);
}

bool MatchesIpv6(const Ipv6Match& m, const wire::FrameFields& f) {
  return f.has_ipv6 && EqualBytes(f.ipv6_src, m.src, m.src_mask) &&
         EqualBytes(f.ipv6_dst, m.dst, m.dst_mask) &&
         Equal(f.ipv6_flow_label, m.flow_label, m.flow_label_mask) &&
         Equal(f.ipv6_next_hdr, m.next_hdr, m.next_hdr_mask) &&
         Equal(f.ipv6_traffic_class, m.traffic_class, m.traffic_class_mask) &&
         Equal(f.ipv6_hop_limit, m.hop_limit, m.hop_limit_mask);
}

bool MatchesL4(const L4Match& m, const wire::FrameFields& f) {
  return f.l4_proto == m.proto && Equal(f.l4_src_port, m.src_port, m.src_port_mask) &&
         Equal(f.l4_dst_port, m.dst_port, m.dst_port_mask);
}

void AddOnce(std::vector<uint32_t>& qpns, uint32_t qpn) {
  if (std::find(qpns.begin(), qpns.end(), qpn) == qpns.end()) qpns.push_back(qpn);
}

}  // namespace

bool Matches(const Match& m, const wire::FrameFields& f) {
  if (m.eth && !MatchesEth(*m.eth, f)) return false;
  if (m.ipv4 && !MatchesIpv4(*m.ipv4, f)) return false;
  if (m.ipv6 && !MatchesIpv6(*m.ipv6, f)) return false;
  if (m.l4 && !MatchesL4(*m.l4, f)) return false;
  return true;
}

void Steer(std::span<const Rule> rules, uint8_t port, const wire::FrameFields& frame,
           std::vector<uint32_t>& qpns) {
  qpns.clear();
  // The strongest priority among the normal rules that match.
  uint32_t best = std::numeric_limits<uint32_t>::max();
  for (const Rule& r : rules) {
    if (r.port == port && r.type == RuleType::kNormal && r.priority < best &&
        Matches(r.match, frame)) {
      best = r.priority;
    }
  }
  bool taken = false;
  for (const Rule& r : rules) {
    if (r.port == port && r.type == RuleType::kNormal && r.priority == best &&
        Matches(r.match, frame)) {
      AddOnce(qpns, r.qpn);
      taken = true;
    }
  }
  if (!taken && wire::IsMulticastMac(frame.dst)) {
    for (const Rule& r : rules) {
      if (r.port == port && r.type == RuleType::kMcDefault) {
        AddOnce(qpns, r.qpn);
        taken = true;
      }
    }
  }
  if (!taken) {
    for (const Rule& r : rules) {
      if (r.port == port && r.type == RuleType::kAllDefault) AddOnce(qpns, r.qpn);
    }
  }
  for (const Rule& r : rules) {
    if (r.port == port && r.type == RuleType::kSniffer) AddOnce(qpns, r.qpn);
  }
}

}  // namespace rdmaemu::flow
