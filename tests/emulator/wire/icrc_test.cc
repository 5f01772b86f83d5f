#include "emulator/wire/icrc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "emulator/base/endian.h"

namespace rdmaemu::wire {
namespace {

using Bytes = std::vector<uint8_t>;

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Bit-at-a-time CRC-32 (IEEE, reflected): the definition, for comparison.
uint32_t ReferenceCrc32(std::span<const uint8_t> data) {
  uint32_t reg = 0xffffffff;
  for (uint8_t byte : data) {
    reg ^= byte;
    for (int i = 0; i < 8; ++i) reg = (reg >> 1) ^ ((reg & 1) ? 0xedb88320 : 0);
  }
  return ~reg;
}

Bytes Concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// "RoCE CNP captured on ConnectX-4 Lx" from scapy's test/contrib/roce.uts,
// from the IP header on (the Ethernet header dropped).
const Bytes kCnpIp = {0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11,
                      0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01};
const Bytes kCnpUdp = {0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00};
const Bytes kCnpIb = {0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
                      0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,
                      0,    0,    0,    0};
const Bytes kCnpIcrcOnWire = {0x82, 0xfd, 0x00, 0x2a};

TEST(Crc32, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32(0, AsBytes("123456789")), 0xcbf43926u);
  EXPECT_EQ(Crc32(0, {}), 0u);
}

TEST(Crc32, TableMethodMatchesBitwiseDefinitionAtEveryLengthAndAlignment) {
  std::mt19937 rng(42);
  Bytes data(300);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const std::span<const uint8_t> all(data);
  for (size_t start = 0; start < 9; ++start) {
    for (size_t len = 0; len + start <= all.size(); len += (len < 40 ? 1 : 37)) {
      const auto piece = all.subspan(start, len);
      ASSERT_EQ(Crc32(0, piece), ReferenceCrc32(piece)) << start << "+" << len;
      ASSERT_EQ(Crc32Portable(0, piece), ReferenceCrc32(piece)) << start << "+" << len;
    }
  }
}

TEST(Crc32, FastPathMatchesTheTableMethodOnLongBuffersAtEveryAlignment) {
  std::mt19937 rng(7);
  Bytes data(4200 + 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const std::span<const uint8_t> all(data);
  for (size_t start = 0; start < 16; ++start) {
    for (size_t len : {63, 64, 65, 79, 80, 127, 128, 129, 143, 144, 200, 255, 256, 257, 383, 1000, 1500,
                       4096, 4136, 4200}) {
      const auto piece = all.subspan(start, len);
      for (uint32_t seed : {0u, 0xffffffffu, 0x12345678u}) {
        const uint32_t want = Crc32Portable(seed, piece);
        ASSERT_EQ(Crc32(seed, piece), want) << start << "+" << len;
        // Each carry-less method the CPU has, whichever Crc32 picks.
        if (auto c = Crc32Clmul(seed, piece)) {
          ASSERT_EQ(*c, want) << "PCLMULQDQ " << start << "+" << len;
        }
        if (auto c = Crc32Vclmul(seed, piece)) {
          ASSERT_EQ(*c, want) << "VPCLMULQDQ " << start << "+" << len;
        }
        if (auto c = Crc32Vclmul512(seed, piece)) {
          ASSERT_EQ(*c, want) << "VPCLMULQDQ, 512-bit " << start << "+" << len;
        }
      }
    }
  }
  EXPECT_EQ(Crc32(0, all.first(4096)), ReferenceCrc32(all.first(4096)));
}

TEST(Crc32, ChainsLikeZlib) {
  const std::string_view text = "The quick brown fox jumps over the lazy dog";
  const auto all = AsBytes(text);
  EXPECT_EQ(Crc32(0, all), 0x414fa339u);
  for (size_t cut = 0; cut <= all.size(); ++cut) {
    EXPECT_EQ(Crc32(Crc32(0, all.first(cut)), all.subspan(cut)), 0x414fa339u);
  }
}

TEST(Icrc, MatchesTheConnectX4LxCapture) {
  Result<uint32_t> icrc = ComputeIcrcWithHeaders(Concat({kCnpIp, kCnpUdp}), kCnpIb);
  ASSERT_TRUE(icrc.ok()) << icrc.status().message();
  uint8_t stored[4];
  StoreLe32(stored, icrc.value());
  EXPECT_EQ(Bytes(stored, stored + 4), kCnpIcrcOnWire);
  EXPECT_EQ(icrc.value(), 0x2a00fd82u);
}

TEST(Icrc, MatchesScapysUcSendOnlyExample) {
  // The "RoCE layer" example of the same file: UC SEND_ONLY, pad count 2;
  // scapy computes its ICRC as 78 f3 53 f3 on the wire.
  const Bytes ip = {0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11,
                    0xb4, 0xd5, 0xc0, 0xa8, 0x00, 0x07, 0xc0, 0xa8, 0x00, 0x07};
  const Bytes udp = {0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2};
  const Bytes ib = {0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17,
                    0x10, 0x46, 0x30, 0x81, 0x8b, 0xe2, 0x89, 0x35, 0xd9, 0x0e, 0x9a,
                    0x95, 0x50, 0x54, 0x01, 0xbe, 0x88, 0x5e, 0x50, 0x00, 0x00};
  Result<uint32_t> icrc = ComputeIcrcWithHeaders(Concat({ip, udp}), ib);
  ASSERT_TRUE(icrc.ok());
  uint8_t stored[4];
  StoreLe32(stored, icrc.value());
  EXPECT_EQ(Bytes(stored, stored + 4), (Bytes{0x78, 0xf3, 0x53, 0xf3}));
}

TEST(Icrc, IgnoresEveryFieldARouterMayChange) {
  const uint32_t base = ComputeIcrcWithHeaders(Concat({kCnpIp, kCnpUdp}), kCnpIb).value();
  Bytes ip = kCnpIp, udp = kCnpUdp, ib = kCnpIb;
  ip[1] = 0x00;                 // TOS (DSCP, ECN)
  ip[8] = 0x01;                 // TTL
  ip[10] = 0x12, ip[11] = 0x34;  // header checksum
  udp[6] = 0xab, udp[7] = 0xcd;  // UDP checksum
  ib[4] = 0x80;                 // FECN set, BECN clear
  EXPECT_EQ(ComputeIcrcWithHeaders(Concat({ip, udp}), ib).value(), base);
}

TEST(Icrc, CoversAddressesPortsIdentificationAndEveryIbByteButBthByte4) {
  const uint32_t base = ComputeIcrcWithHeaders(Concat({kCnpIp, kCnpUdp}), kCnpIb).value();
  for (size_t i : {4, 5, 12, 15, 16, 19}) {  // identification, src and dst address
    Bytes ip = kCnpIp;
    ip[i] ^= 1;
    EXPECT_NE(ComputeIcrcWithHeaders(Concat({ip, kCnpUdp}), kCnpIb).value(), base) << i;
  }
  for (size_t i : {0, 1, 2, 3, 4, 5}) {  // ports, length
    Bytes udp = kCnpUdp;
    udp[i] ^= 0x10;
    EXPECT_NE(ComputeIcrcWithHeaders(Concat({kCnpIp, udp}), kCnpIb).value(), base) << i;
  }
  for (size_t i = 0; i < kCnpIb.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes ib = kCnpIb;
      ib[i] ^= static_cast<uint8_t>(1 << bit);
      const uint32_t icrc = ComputeIcrcWithHeaders(Concat({kCnpIp, kCnpUdp}), ib).value();
      if (i == 4) {
        EXPECT_EQ(icrc, base) << "BTH byte 4 is variant";
      } else {
        EXPECT_NE(icrc, base) << "byte " << i << " bit " << bit;
      }
    }
  }
}

TEST(Icrc, SynthesizedIpv4HeaderEqualsTheOneLinuxSends) {
  const IcrcAddressing addr{.src_ip = 0x7f000002, .dst_ip = 0x7f000003, .src_port = 0xc123};
  const Bytes ib = {0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x07,
                    'h',  'e',  'l',  'l'};
  // What the kernel puts on the wire for a DF datagram from an unconnected
  // socket: ID 0; TOS, TTL and both checksums are whatever they are.
  const uint16_t udp_len = 8 + ib.size() + 4;
  const uint16_t ip_len = 20 + udp_len;
  const Bytes ip = {0x45, 0x00, uint8_t(ip_len >> 8), uint8_t(ip_len), 0x00, 0x00, 0x40, 0x00,
                    0x40, 0x11, 0x5a, 0xa5, 127,  0, 0, 2, 127, 0, 0, 3};
  const Bytes udp = {0xc1, 0x23, 0x12, 0xb7, uint8_t(udp_len >> 8), uint8_t(udp_len), 0x00, 0x00};
  EXPECT_EQ(ComputeIcrc(addr, ib), ComputeIcrcWithHeaders(Concat({ip, udp}), ib).value());
}

TEST(Icrc, SynthesizedIpv6HeaderEqualsARealOne) {
  IcrcAddressing6 addr;
  addr.src_ip = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  addr.dst_ip = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  addr.src_port = 0xd000;
  const Bytes ib = {0x64, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x09,
                    0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02};
  const uint16_t udp_len = 8 + ib.size() + 4;
  Bytes ip = {0x6b, 0xa1, 0x23, 0x45,  // traffic class 0xba, flow label 0x12345
              uint8_t(udp_len >> 8), uint8_t(udp_len), 0x11, 0x07};
  ip.insert(ip.end(), addr.src_ip.begin(), addr.src_ip.end());
  ip.insert(ip.end(), addr.dst_ip.begin(), addr.dst_ip.end());
  const Bytes udp = {0xd0, 0x00, 0x12, 0xb7, uint8_t(udp_len >> 8), uint8_t(udp_len), 0x55, 0x66};
  EXPECT_EQ(ComputeIcrc(addr, ib), ComputeIcrcWithHeaders(Concat({ip, udp}), ib).value());

  const IcrcAddressing v4{.src_ip = 1, .dst_ip = 2, .src_port = 0xd000};
  EXPECT_NE(ComputeIcrc(addr, ib), ComputeIcrc(v4, ib));
}

TEST(Icrc, WithHeadersRejectsHeadersItCannotInterpret) {
  const Bytes ib(12, 0);
  Bytes options = kCnpIp;
  options[0] = 0x46;  // IHL 6: options present
  EXPECT_EQ(ComputeIcrcWithHeaders(Concat({options, kCnpUdp}), ib).status().code(), EINVAL);
  EXPECT_EQ(ComputeIcrcWithHeaders(kCnpIp, ib).status().code(), EINVAL);  // no UDP header
  EXPECT_EQ(ComputeIcrcWithHeaders({}, ib).status().code(), EINVAL);
  EXPECT_EQ(ComputeIcrcWithHeaders(Concat({kCnpIp, kCnpUdp}), Bytes(11, 0)).status().code(),
            EINVAL);
}

TEST(Icrc, WriteThenCheckAcceptsAndAnyCorruptionIsRejected) {
  const IcrcAddressing addr{.src_ip = 0x0a000001, .dst_ip = 0x0a000002, .src_port = 49152};
  Bytes packet = Concat({kCnpIb, Bytes(4, 0)});
  WriteIcrc(addr, packet);
  EXPECT_TRUE(CheckIcrc(addr, packet).ok());

  Bytes flipped = packet;
  flipped[20] ^= 0x04;
  const Status bad = CheckIcrc(addr, flipped);
  EXPECT_EQ(bad.code(), EBADMSG);
  EXPECT_NE(bad.message().find("ICRC mismatch"), std::string::npos) << bad.message();

  IcrcAddressing other = addr;
  other.src_port = 49153;
  EXPECT_EQ(CheckIcrc(other, packet).code(), EBADMSG);

  EXPECT_EQ(CheckIcrc(addr, Bytes(15, 0)).code(), EINVAL);
}

// The ICRC of a packet gathered from pieces (headers, a payload split
// anywhere, pad) is that of the same bytes in one piece, through every
// method's path: pieces long enough to fold and short ones between.
TEST(Icrc, OfPiecesEqualsOfTheWholePacket) {
  const IcrcAddressing addr{.src_ip = 0x7f000001, .dst_ip = 0x7f000002, .src_port = 49152};
  Bytes packet(12 + 4096 + 3);
  for (size_t i = 0; i < packet.size(); ++i) packet[i] = static_cast<uint8_t>(i * 31 + (i >> 7));
  const std::span<const uint8_t> all(packet);
  const uint32_t whole = ComputeIcrc(addr, all);
  for (size_t first : {5u, 12u, 13u, 100u}) {
    for (size_t second : {0u, 1u, 63u, 64u, 129u, 1000u, 4000u}) {
      SCOPED_TRACE(std::to_string(first) + " + " + std::to_string(second) + " + rest");
      const std::array<std::span<const uint8_t>, 3> pieces = {
          all.first(first), all.subspan(first, second), all.subspan(first + second)};
      EXPECT_EQ(ComputeIcrc(addr, std::span<const std::span<const uint8_t>>(pieces)), whole);
    }
  }
}

TEST(Icrc, Ipv6WriteThenCheckAccepts) {
  IcrcAddressing6 addr;
  addr.src_ip[15] = 1;
  addr.dst_ip[15] = 1;
  Bytes packet = Concat({kCnpIb, Bytes(4, 0)});
  WriteIcrc(addr, packet);
  EXPECT_TRUE(CheckIcrc(addr, packet).ok());
  packet[0] ^= 1;
  EXPECT_EQ(CheckIcrc(addr, packet).code(), EBADMSG);
}

}  // namespace
}  // namespace rdmaemu::wire
