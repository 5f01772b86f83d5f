// ParsePacket() sees whatever arrives on UDP port 4791. Feed it seeded
// random, truncated, extended and bit-flipped packets: it must never crash or
// read outside the buffer (run under --config=asan and --config=ubsan), and
// whatever it accepts must be self-consistent and safe to read in full.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "emulator/wire/opcode.h"
#include "emulator/wire/packet.h"

namespace rdmaemu::wire {
namespace {

using Bytes = std::vector<uint8_t>;

std::vector<uint8_t> SpokenOpcodes() {
  std::vector<uint8_t> ops;
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (info.valid()) ops.push_back(static_cast<uint8_t>(info.opcode));
  }
  return ops;
}

// Parses a copy that lives in a heap block of exactly its size, so that any
// read past the end is a heap overflow the sanitizer reports. Returns whether
// it was accepted; an accepted packet is checked and read end to end.
bool ParseExact(const Bytes& bytes, uint64_t* sink) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size() ? bytes.size() : 1]);
  std::copy(bytes.begin(), bytes.end(), copy.get());
  const std::span<const uint8_t> in(copy.get(), bytes.size());

  Result<PacketView> parsed = ParsePacket(in);
  if (!parsed.ok()) {
    EXPECT_FALSE(parsed.status().message().empty());
    EXPECT_NE(parsed.status().code(), 0);
    return false;
  }
  const PacketView& p = parsed.value();
  const OpcodeInfo& info = p.info();
  // Self-consistency of what was accepted.
  EXPECT_EQ(p.bytes().size(), in.size());
  EXPECT_EQ(p.bytes().size(), info.length + p.payload().size() + p.pad_count() + kIcrcBytes);
  EXPECT_EQ(p.payload().data(), in.data() + info.length);
  EXPECT_LE(p.payload().size(), kMaxPayloadBytes);
  EXPECT_EQ(p.bth().tver(), 0);
  if (!info.Has(kPayloadMask)) {
    EXPECT_TRUE(p.payload().empty());
  }
  if (p.pad_count() != 0) {
    EXPECT_TRUE(info.Has(kPayloadMask | kLastMask));
  }

  // Read every header the opcode has, and every payload byte.
  uint64_t x = p.psn() ^ p.dest_qpn() ^ p.icrc();
  if (p.Has(kRethMask)) x ^= p.reth().va() ^ p.reth().rkey() ^ p.reth().dma_length();
  if (p.Has(kAethMask)) x ^= p.aeth().syndrome() ^ p.aeth().msn();
  if (p.Has(kAtomicEthMask)) {
    x ^= p.atomic_eth().va() ^ p.atomic_eth().rkey() ^ p.atomic_eth().swap_add() ^
         p.atomic_eth().compare();
  }
  if (p.Has(kAtomicAckEthMask)) x ^= p.atomic_ack_eth().orig_data();
  if (p.Has(kDethMask)) x ^= p.deth().qkey() ^ p.deth().src_qpn();
  if (p.Has(kImmDtMask)) x ^= p.imm_dt().imm();
  if (p.Has(kIethMask)) x ^= p.ieth().rkey();
  for (uint8_t b : p.payload()) x += b;
  *sink += x;
  return true;
}

// A valid packet of a random spoken opcode with a random legal payload.
Bytes RandomValidPacket(std::mt19937_64& rng, const std::vector<uint8_t>& ops) {
  const OpcodeInfo& info = *FindOpcode(ops[rng() % ops.size()]);
  PacketFields f;
  f.opcode = info.opcode;
  f.bth.psn = rng() & 0xffffff;
  f.bth.dest_qpn = rng() & 0xffffff;
  f.reth.dma_length = static_cast<uint32_t>(rng());
  f.aeth.msn = rng() & 0xffffff;
  f.deth.src_qpn = rng() & 0xffffff;
  size_t n = 0;
  if (info.Has(kPayloadMask)) {
    n = rng() % 300;
    if (!info.Has(kLastMask)) n &= ~size_t{3};
    if (rng() % 50 == 0) n = info.Has(kLastMask) ? kMaxPayloadBytes - rng() % 4 : kMaxPayloadBytes;
  }
  Bytes payload(n);
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  Bytes buf(kMaxPacketBytes);
  Result<size_t> len = BuildPacket(f, std::span<const uint8_t>(payload), buf);
  EXPECT_TRUE(len.ok()) << len.status().message();
  buf.resize(len.ok() ? *len : 0);
  return buf;
}

TEST(ParseRobustness, RandomBytesNeverCrash) {
  std::mt19937_64 rng(0x5eed0001);
  const std::vector<uint8_t> ops = SpokenOpcodes();
  uint64_t sink = 0;
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    Bytes b(rng() % 96);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    // Half the time, look enough like RoCE to get past the first checks.
    if (!b.empty() && rng() % 2) b[0] = ops[rng() % ops.size()];
    if (b.size() > 1 && rng() % 2) b[1] &= 0xf0;
    accepted += ParseExact(b, &sink);
  }
  EXPECT_GT(accepted, 0);  // the generator reaches the accepting paths too
}

TEST(ParseRobustness, TruncatedAndExtendedValidPacketsNeverCrash) {
  std::mt19937_64 rng(0x5eed0002);
  const std::vector<uint8_t> ops = SpokenOpcodes();
  uint64_t sink = 0;
  for (int i = 0; i < 3000; ++i) {
    const Bytes valid = RandomValidPacket(rng, ops);
    ASSERT_TRUE(ParseExact(valid, &sink));
    for (int j = 0; j < 4; ++j) {
      const size_t cut_size = rng() % (valid.size() + 1);
      ParseExact(Bytes(valid.data(), valid.data() + cut_size), &sink);
      Bytes longer(valid.size() + rng() % 9, 0);
      std::copy(valid.begin(), valid.end(), longer.begin());
      ParseExact(longer, &sink);
    }
  }
}

TEST(ParseRobustness, BitFlippedValidPacketsNeverCrash) {
  std::mt19937_64 rng(0x5eed0003);
  const std::vector<uint8_t> ops = SpokenOpcodes();
  uint64_t sink = 0;
  for (int i = 0; i < 5000; ++i) {
    Bytes b = RandomValidPacket(rng, ops);
    // Flip bits, biased to the headers where the parser looks.
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t limit = rng() % 4 ? std::min<size_t>(b.size(), 48) : b.size();
      b[rng() % limit] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    ParseExact(b, &sink);
  }
}

TEST(ParseRobustness, EveryOpcodeByteAtEveryShortLengthNeverCrashes) {
  uint64_t sink = 0;
  for (int op = 0; op < 256; ++op) {
    for (size_t len = 0; len <= 64; ++len) {
      for (uint8_t byte1 : {0x00, 0x10, 0x20, 0x30, 0x01}) {
        Bytes b(len, 0);
        if (len > 0) b[0] = static_cast<uint8_t>(op);
        if (len > 1) b[1] = byte1;
        ParseExact(b, &sink);
      }
    }
  }
}

}  // namespace
}  // namespace rdmaemu::wire
