#include "emulator/wire/ethernet.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "emulator/base/endian.h"

namespace rdmaemu::wire {
namespace {

constexpr size_t kIpv4MinHeaderBytes = 20;
constexpr size_t kIpv6HeaderBytes = 40;
constexpr size_t kL4PortBytes = 4;  // source and destination port lead TCP and UDP alike

// The L4 ports, if `l4` holds them and the protocol is TCP or UDP.
void ReadPorts(uint8_t proto, std::span<const uint8_t> l4, FrameFields& f) {
  if ((proto != kIpProtoTcp && proto != kIpProtoUdp) || l4.size() < kL4PortBytes) return;
  f.l4_proto = proto;
  f.l4_src_port = LoadBe16(l4.data());
  f.l4_dst_port = LoadBe16(l4.data() + 2);
}

void ReadIpv4(std::span<const uint8_t> p, FrameFields& f) {
  if (p.size() < kIpv4MinHeaderBytes || (p[0] >> 4) != 4) return;
  const size_t ihl = size_t{p[0] & 0x0fu} * 4;
  if (ihl < kIpv4MinHeaderBytes || ihl > p.size()) return;
  f.has_ipv4 = true;
  f.ipv4_tos = p[1];
  f.ipv4_flags = static_cast<uint8_t>(p[6] >> 5);
  f.ipv4_ttl = p[8];
  f.ipv4_proto = p[9];
  f.ipv4_src = LoadBe32(p.data() + 12);
  f.ipv4_dst = LoadBe32(p.data() + 16);
  // Only the first fragment carries the L4 header.
  const uint16_t fragment_offset = LoadBe16(p.data() + 6) & 0x1fff;
  if (fragment_offset == 0) ReadPorts(f.ipv4_proto, p.subspan(ihl), f);
}

void ReadIpv6(std::span<const uint8_t> p, FrameFields& f) {
  if (p.size() < kIpv6HeaderBytes || (p[0] >> 4) != 6) return;
  f.has_ipv6 = true;
  const uint32_t first = LoadBe32(p.data());
  f.ipv6_traffic_class = static_cast<uint8_t>(first >> 20);
  f.ipv6_flow_label = first & 0xfffff;
  f.ipv6_next_hdr = p[6];
  f.ipv6_hop_limit = p[7];
  std::memcpy(f.ipv6_src.data(), p.data() + 8, 16);
  std::memcpy(f.ipv6_dst.data(), p.data() + 24, 16);
  // Extension headers are not walked: a rule on L4 ports matches only a
  // TCP or UDP header right behind the fixed header.
  ReadPorts(f.ipv6_next_hdr, p.subspan(kIpv6HeaderBytes), f);
}

}  // namespace

bool IsRawFrameDatagram(std::span<const uint8_t> datagram) {
  return datagram.size() >= kRawMarkerBytes &&
         std::equal(kRawMarker.begin(), kRawMarker.end(), datagram.begin());
}

void EncapsulateFrame(std::span<const uint8_t> frame, std::vector<uint8_t>& out) {
  out.resize(kRawMarkerBytes + frame.size());
  std::copy(kRawMarker.begin(), kRawMarker.end(), out.begin());
  std::copy(frame.begin(), frame.end(), out.begin() + kRawMarkerBytes);
}

Result<std::span<const uint8_t>> DecapsulateFrame(std::span<const uint8_t> datagram) {
  if (!IsRawFrameDatagram(datagram)) return InvalidArgument("no raw frame marker");
  std::span<const uint8_t> frame = datagram.subspan(kRawMarkerBytes);
  if (frame.size() < kEthHeaderBytes) {
    return InvalidArgument(fmt::format("a raw frame of {} bytes is shorter than an Ethernet header",
                                       frame.size()));
  }
  if (frame.size() > kMaxFrameBytes) {
    return InvalidArgument(fmt::format("a raw frame of {} bytes is longer than the {} bytes of the "
                                       "largest frame",
                                       frame.size(), kMaxFrameBytes));
  }
  return frame;
}

MacAddress MacOfPort(uint32_t ip) {
  return {0x02, 0x00, static_cast<uint8_t>(ip >> 24), static_cast<uint8_t>(ip >> 16),
          static_cast<uint8_t>(ip >> 8), static_cast<uint8_t>(ip)};
}

uint32_t PortOfMac(const MacAddress& mac) {
  if (mac[0] != 0x02 || mac[1] != 0x00) return 0;
  return LoadBe32(mac.data() + 2);
}

Result<FrameFields> ParseFrame(std::span<const uint8_t> frame) {
  if (frame.size() < kEthHeaderBytes) {
    return InvalidArgument(fmt::format("{} bytes are shorter than an Ethernet header", frame.size()));
  }
  FrameFields f;
  std::memcpy(f.dst.data(), frame.data(), 6);
  std::memcpy(f.src.data(), frame.data() + 6, 6);
  f.ether_type = LoadBe16(frame.data() + 12);
  size_t l3 = kEthHeaderBytes;
  if (f.ether_type == kEtherTypeVlan) {
    if (frame.size() < kEthHeaderBytes + kVlanTagBytes) {
      return InvalidArgument("a VLAN-tagged frame cut short inside its tag");
    }
    f.has_vlan = true;
    f.vlan_tag = LoadBe16(frame.data() + 14);
    f.ether_type = LoadBe16(frame.data() + 16);
    l3 += kVlanTagBytes;
  }
  if (f.ether_type == kEtherTypeIpv4) ReadIpv4(frame.subspan(l3), f);
  if (f.ether_type == kEtherTypeIpv6) ReadIpv6(frame.subspan(l3), f);
  return f;
}

}  // namespace rdmaemu::wire
