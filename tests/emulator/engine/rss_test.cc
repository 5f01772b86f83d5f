// The RSS hash against the verification vectors of Microsoft's RSS
// specification (the Toeplitz key and the IPv4 rows of its table), and the
// field selection the device applies.
#include "emulator/engine/rss.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace rdmaemu::engine {
namespace {

const std::vector<uint8_t> kKey = {
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
    0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
    0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
};

constexpr uint32_t Ip(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return a << 24 | b << 16 | c << 8 | d;
}

struct Row {
  uint32_t src_ip, dst_ip;
  uint16_t src_port, dst_port;
  uint32_t ip_hash, ip_port_hash;
};

TEST(RssTest, ToeplitzMatchesTheSpecificationsVectors) {
  const Row rows[] = {
      {Ip(66, 9, 149, 187), Ip(161, 142, 100, 80), 2794, 1766, 0x323e8fc2, 0x51ccc178},
      {Ip(199, 92, 111, 2), Ip(65, 69, 140, 83), 14230, 4739, 0xd718262a, 0xc626b0ea},
  };
  constexpr uint64_t kIps = kRxHashSrcIpv4 | kRxHashDstIpv4;
  for (const Row& r : rows) {
    EXPECT_EQ(RxHash(kKey, kIps, r.src_ip, r.dst_ip, r.src_port, r.dst_port), r.ip_hash);
    EXPECT_EQ(RxHash(kKey, kRxHashSupportedFields, r.src_ip, r.dst_ip, r.src_port, r.dst_port),
              r.ip_port_hash);
  }
}

TEST(RssTest, OnlySelectedFieldsCount) {
  const uint32_t a = RxHash(kKey, kRxHashSrcIpv4, Ip(10, 0, 0, 1), Ip(10, 0, 0, 2), 4791, 4791);
  EXPECT_EQ(RxHash(kKey, kRxHashSrcIpv4, Ip(10, 0, 0, 1), Ip(10, 9, 9, 9), 1, 2), a)
      << "the destination and the ports are not selected";
  EXPECT_NE(RxHash(kKey, kRxHashSrcIpv4, Ip(10, 0, 0, 3), Ip(10, 0, 0, 2), 4791, 4791), a);
  EXPECT_EQ(RxHash(kKey, 0, Ip(10, 0, 0, 1), Ip(10, 0, 0, 2), 4791, 4791), 0u)
      << "no field selected: entry 0";
}

}  // namespace
}  // namespace rdmaemu::engine
