// Ethernet frames as raw packet QPs send and receive them, and the UDP
// encapsulation that carries them between emulated ports.
//
// A raw frame travels in a UDP datagram to port 4791 like a RoCE packet, but
// behind an 8-byte marker a RoCE receive path can never take for a BTH: its
// first byte is 0xFF, an opcode of the manufacturer-specific range
// (IBA 9.2) that this device never sends, followed by "ETH" and a version.
// The receive path checks the marker before it parses anything as RoCE, so
// the two never mix; a datagram with the marker and a bad frame behind it
// is dropped and counted.
//
// FrameFields is what flow steering looks at: the L2 header (with one
// 802.1Q tag), and, when present and whole, the IPv4 or IPv6 header and the
// TCP or UDP ports. A frame whose IP header is cut short is still a frame;
// it just has no L3 fields for a rule to match.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::wire {

using MacAddress = std::array<uint8_t, 6>;

inline constexpr size_t kEthHeaderBytes = 14;
inline constexpr size_t kVlanTagBytes = 4;
// The largest frame a raw QP sends or receives: a 1500-byte payload behind
// the Ethernet header and one VLAN tag (no FCS: the device adds and strips
// it, as a NIC does). The emulated netdev's MTU is 1500.
inline constexpr size_t kMaxFrameBytes = 1500 + kEthHeaderBytes + kVlanTagBytes;

inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeIpv6 = 0x86dd;
inline constexpr uint16_t kEtherTypeVlan = 0x8100;
inline constexpr uint8_t kIpProtoTcp = 6;
inline constexpr uint8_t kIpProtoUdp = 17;

// The encapsulation marker (see above).
inline constexpr size_t kRawMarkerBytes = 8;
inline constexpr std::array<uint8_t, kRawMarkerBytes> kRawMarker = {0xff, 'E', 'T', 'H', 1, 0, 0, 0};

// The IPv4 multicast group (host order, 239.254.69.84: organisation-local
// scope) that carries flooded frames: broadcast, multicast and unknown
// unicast. Every port with flow rules listens to it, as every port of a
// switch hears a flood.
inline constexpr uint32_t kRawSegmentGroup = 0xeffe4554;

// True if the datagram starts with the marker (whatever follows it).
bool IsRawFrameDatagram(std::span<const uint8_t> datagram);
// Writes the marker and the frame into `out` (resized); the datagram to send.
void EncapsulateFrame(std::span<const uint8_t> frame, std::vector<uint8_t>& out);
// The frame behind the marker: EINVAL if the datagram is no raw frame
// datagram or the frame is shorter than an Ethernet header or longer than
// kMaxFrameBytes.
Result<std::span<const uint8_t>> DecapsulateFrame(std::span<const uint8_t> datagram);

// Group bit of the first octet: broadcast and multicast addresses.
inline bool IsMulticastMac(const MacAddress& mac) { return (mac[0] & 1) != 0; }

// The MAC of a port whose IPv4 address is `ip` (host order): locally
// administered, unicast (02:00 then the address's four bytes), so it is
// stable, unique among ports and gives its port back (PortOfMac).
MacAddress MacOfPort(uint32_t ip);
// The IPv4 address (host order) whose port owns `mac`, or 0 if the MAC is
// not of the form MacOfPort makes.
uint32_t PortOfMac(const MacAddress& mac);

struct FrameFields {
  MacAddress dst{};
  MacAddress src{};
  uint16_t ether_type = 0;  // after a VLAN tag, if any
  bool has_vlan = false;
  uint16_t vlan_tag = 0;    // the TCI (priority, CFI, VLAN ID); 0 without a tag

  bool has_ipv4 = false;
  uint32_t ipv4_src = 0;    // host order
  uint32_t ipv4_dst = 0;
  uint8_t ipv4_proto = 0;
  uint8_t ipv4_tos = 0;
  uint8_t ipv4_ttl = 0;
  uint8_t ipv4_flags = 0;   // the three flag bits

  bool has_ipv6 = false;
  std::array<uint8_t, 16> ipv6_src{};
  std::array<uint8_t, 16> ipv6_dst{};
  uint32_t ipv6_flow_label = 0;
  uint8_t ipv6_next_hdr = 0;
  uint8_t ipv6_traffic_class = 0;
  uint8_t ipv6_hop_limit = 0;

  // The L4 protocol (kIpProtoTcp or kIpProtoUdp) when its ports are present.
  uint8_t l4_proto = 0;
  uint16_t l4_src_port = 0;  // host order
  uint16_t l4_dst_port = 0;
};

// Reads a frame's headers. EINVAL only if it is shorter than an Ethernet
// header (or a VLAN-tagged one); anything past L2 is read only when whole.
Result<FrameFields> ParseFrame(std::span<const uint8_t> frame);

}  // namespace rdmaemu::wire
