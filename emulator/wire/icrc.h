// The RoCEv2 Invariant CRC (IBA annex A17.3.3; Linux rxe_icrc.c).
//
// The ICRC is the 4-byte trailer of every RoCEv2 packet. It is CRC-32 (IEEE
// 802.3, reflected, polynomial 0xEDB88320: exactly zlib's crc32, not CRC32C)
// over the packet from the IP header on, with every field a router may change
// replaced by ones:
//   8 bytes 0xFF            stand-in for the InfiniBand LRH RoCE lacks
//   IP header               IPv4: TOS, TTL, header checksum all ones
//                           IPv6: traffic class, flow label, hop limit all ones
//   UDP header              checksum 0xFFFF
//   BTH                     byte 4 (FECN, BECN, resv6) 0xFF
//   rest of the IB packet   extension headers, payload, pad (not the ICRC)
// and stored little-endian in the trailer.
//
// We send through ordinary UDP sockets, so there is no IP header in our
// hands: ComputeIcrc() builds the one the kernel will put on the wire from
// IcrcAddressing. Every field it cannot know (identification aside, always
// 0 with DF set, as Linux sends small UDP datagrams) is one the ICRC masks.
// ComputeIcrcWithHeaders() takes real IP+UDP headers, e.g. from a capture.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "emulator/base/status.h"

namespace rdmaemu::wire {

// zlib-compatible CRC-32: Crc32(0, data) is zlib's crc32(0, data), and
// Crc32(Crc32(0, a), b) == Crc32(0, a + b). On x86-64, runs of 256 bytes or
// more fold with 512-bit carry-less multiplication where the CPU has
// VPCLMULQDQ and AVX-512 (about 52 GB/s on the development machine, an AMD
// EPYC), runs of 128 or more with 256-bit VPCLMULQDQ (about 27 GB/s), runs
// of 64 or more with 128-bit PCLMULQDQ (about 14 GB/s); otherwise
// slicing-by-8 tables (about 2 GB/s).
uint32_t Crc32(uint32_t crc, std::span<const uint8_t> data);
// Each method alone, the same function; for tests and comparison. The
// carry-less ones give nullopt where the CPU lacks the instruction, and
// hand runs too short for them to the tables.
uint32_t Crc32Portable(uint32_t crc, std::span<const uint8_t> data);
std::optional<uint32_t> Crc32Clmul(uint32_t crc, std::span<const uint8_t> data);
std::optional<uint32_t> Crc32Vclmul(uint32_t crc, std::span<const uint8_t> data);
std::optional<uint32_t> Crc32Vclmul512(uint32_t crc, std::span<const uint8_t> data);

inline constexpr size_t kIpv4HeaderBytes = 20;
inline constexpr size_t kIpv6HeaderBytes = 40;
inline constexpr size_t kUdpHeaderBytes = 8;
inline constexpr uint16_t kRoceUdpPort = 4791;

// The addresses of an IPv4 UDP datagram, in host byte order.
struct IcrcAddressing {
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint16_t src_port = 0;
  uint16_t dst_port = kRoceUdpPort;
};

// The addresses of an IPv6 UDP datagram; addresses in network byte order,
// ports in host byte order.
struct IcrcAddressing6 {
  std::array<uint8_t, 16> src_ip{};
  std::array<uint8_t, 16> dst_ip{};
  uint16_t src_port = 0;
  uint16_t dst_port = kRoceUdpPort;
};

// The ICRC of `ib` (BTH through pad, without the ICRC trailer) as it travels
// in the UDP datagram `addr` describes. The value to store little-endian.
uint32_t ComputeIcrc(const IcrcAddressing& addr, std::span<const uint8_t> ib);
uint32_t ComputeIcrc(const IcrcAddressing6& addr, std::span<const uint8_t> ib);
// The same over the IB packet gathered from pieces, in order, as a packet
// sent with an iovec per piece; the first piece holds at least the BTH.
uint32_t ComputeIcrc(const IcrcAddressing& addr, std::span<const std::span<const uint8_t>> ib);

// The same over real headers: `ip_udp` is an IPv4 header without options
// (20 bytes) or an IPv6 header without extension headers (40), followed by
// the 8-byte UDP header. Fails (EINVAL) on any other shape, or if `ib` is
// shorter than a BTH.
Result<uint32_t> ComputeIcrcWithHeaders(std::span<const uint8_t> ip_udp,
                                        std::span<const uint8_t> ib);

// `packet` is a whole IB packet whose last 4 bytes are the ICRC trailer:
// WriteIcrc fills the trailer, CheckIcrc compares it (EBADMSG on mismatch,
// EINVAL if the packet is shorter than BTH + ICRC).
void WriteIcrc(const IcrcAddressing& addr, std::span<uint8_t> packet);
void WriteIcrc(const IcrcAddressing6& addr, std::span<uint8_t> packet);
Status CheckIcrc(const IcrcAddressing& addr, std::span<const uint8_t> packet);
Status CheckIcrc(const IcrcAddressing6& addr, std::span<const uint8_t> packet);

}  // namespace rdmaemu::wire
