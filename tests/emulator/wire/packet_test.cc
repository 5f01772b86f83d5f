#include "emulator/wire/packet.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "emulator/wire/icrc.h"
#include "emulator/wire/opcode.h"

namespace rdmaemu::wire {
namespace {

using Bytes = std::vector<uint8_t>;

const IcrcAddressing kAddr{.src_ip = 0x7f000001, .dst_ip = 0x7f000002, .src_port = 0xc0de};

bool Contains(const Status& s, std::string_view text) {
  return s.message().find(text) != std::string::npos;
}

// Field values that differ per opcode and per field, so a field written to
// the wrong place or read from the wrong place shows up.
PacketFields DistinctFields(const OpcodeInfo& info) {
  const uint32_t op = static_cast<uint32_t>(info.opcode);
  PacketFields f;
  f.opcode = info.opcode;
  f.bth.solicited = op & 1;
  f.bth.migreq = op & 2;
  f.bth.pkey = static_cast<uint16_t>(0xff00 | op);
  f.bth.fecn = op & 4;
  f.bth.becn = op & 8;
  f.bth.dest_qpn = 0xabc000 | op;
  f.bth.ack_req = !(op & 1);
  f.bth.psn = 0xfff000 | op;
  f.reth = {.va = 0x1122334455660000u | op, .rkey = 0xa0000000 | op, .dma_length = 0x10000 | op};
  f.aeth = {.syndrome = NakSyndrome(NakCode::kRemoteAccessError), .msn = 0x654300 | op};
  f.atomic_eth = {.va = 0x7f0000001000u | op,
                  .rkey = 0xb0000000 | op,
                  .swap_add = 0x0102030405060700u | op,
                  .compare = 0x1112131415161700u | op};
  f.atomic_ack_orig_data = 0xfedcba9876543200u | op;
  f.deth = {.qkey = 0x80010000 | op, .src_qpn = 0x123400 | op};
  f.imm = 0xdead0000 | op;
  f.invalidate_rkey = 0xc0000000 | op;
  f.xrc_srqn = 0x5a5a00 | op;
  return f;
}

Bytes PayloadFor(const OpcodeInfo& info) {
  if (!info.Has(kPayloadMask)) return {};
  // FIRST and MIDDLE packets carry a whole MTU; LAST and ONLY any length.
  const size_t n = info.Has(kLastMask) ? 13 : 256;
  Bytes p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 7 + static_cast<size_t>(info.opcode));
  return p;
}

TEST(BuildThenParse, EverySpokenOpcodeRoundTripsEveryField) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (!info.valid()) continue;
    SCOPED_TRACE(std::string(info.name));
    const PacketFields f = DistinctFields(info);
    const Bytes payload = PayloadFor(info);
    // Gather the payload from three pieces, as from three SGEs.
    const std::span<const uint8_t> all(payload);
    const size_t third = payload.size() / 3;
    const std::array<std::span<const uint8_t>, 3> pieces = {
        all.first(third), all.subspan(third, third), all.subspan(2 * third)};

    Bytes buf(kMaxPacketBytes, 0xee);
    Result<size_t> len = BuildPacket(f, Gather(pieces), buf, &kAddr);
    ASSERT_TRUE(len.ok()) << len.status().message();
    ASSERT_EQ(*len, PacketLength(info.opcode, payload.size()));
    EXPECT_EQ(*len % 4, 0u);
    buf.resize(*len);

    Result<PacketView> parsed = ParsePacket(buf);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    const PacketView& p = parsed.value();
    EXPECT_EQ(&p.info(), &info);
    EXPECT_TRUE(CheckIcrc(kAddr, p.bytes()).ok());
    EXPECT_EQ(Bytes(p.payload().begin(), p.payload().end()), payload);
    EXPECT_EQ(p.pad_count(), (4 - payload.size() % 4) % 4);

    const ConstBthView bth = p.bth();
    EXPECT_EQ(bth.opcode(), static_cast<uint8_t>(info.opcode));
    EXPECT_EQ(bth.solicited(), f.bth.solicited);
    EXPECT_EQ(bth.migreq(), f.bth.migreq);
    EXPECT_EQ(bth.tver(), 0);
    EXPECT_EQ(bth.pkey(), f.bth.pkey);
    EXPECT_EQ(bth.fecn(), f.bth.fecn);
    EXPECT_EQ(bth.becn(), f.bth.becn);
    EXPECT_EQ(p.dest_qpn(), f.bth.dest_qpn);
    EXPECT_EQ(bth.ack_req(), f.bth.ack_req);
    EXPECT_EQ(p.psn(), f.bth.psn);
    if (p.Has(kRethMask)) {
      EXPECT_EQ(p.reth().va(), f.reth.va);
      EXPECT_EQ(p.reth().rkey(), f.reth.rkey);
      EXPECT_EQ(p.reth().dma_length(), f.reth.dma_length);
    }
    if (p.Has(kAethMask)) {
      EXPECT_EQ(p.aeth().syndrome(), f.aeth.syndrome);
      EXPECT_EQ(p.aeth().msn(), f.aeth.msn);
    }
    if (p.Has(kAtomicEthMask)) {
      EXPECT_EQ(p.atomic_eth().va(), f.atomic_eth.va);
      EXPECT_EQ(p.atomic_eth().rkey(), f.atomic_eth.rkey);
      EXPECT_EQ(p.atomic_eth().swap_add(), f.atomic_eth.swap_add);
      EXPECT_EQ(p.atomic_eth().compare(), f.atomic_eth.compare);
    }
    if (p.Has(kAtomicAckEthMask)) {
      EXPECT_EQ(p.atomic_ack_eth().orig_data(), f.atomic_ack_orig_data);
    }
    if (p.Has(kDethMask)) {
      EXPECT_EQ(p.deth().qkey(), f.deth.qkey);
      EXPECT_EQ(p.deth().src_qpn(), f.deth.src_qpn);
    }
    if (p.Has(kImmDtMask)) {
      EXPECT_EQ(p.imm_dt().imm(), f.imm);
    }
    if (p.Has(kIethMask)) {
      EXPECT_EQ(p.ieth().rkey(), f.invalidate_rkey);
    }
    if (p.Has(kXrcethMask)) {
      EXPECT_EQ(p.xrceth().srqn(), f.xrc_srqn);
    }
  }
}

// A packet sent gathered (headers, the payload where it lies, trailer) is
// byte for byte the one BuildPacket writes, ICRC included, for every opcode
// and every pad, whatever the pieces.
TEST(BuildGatheredPacket, IsByteForByteTheContiguousPacket) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (!info.valid()) continue;
    const PacketFields f = DistinctFields(info);
    Bytes payload = PayloadFor(info);
    // Every pad: the last packet's payload shortened by 0..3 bytes.
    for (size_t cut = 0; cut < (info.Has(kLastMask) && !payload.empty() ? 4 : 1); ++cut) {
      const std::span<const uint8_t> all = std::span<const uint8_t>(payload).first(payload.size() - cut);
      SCOPED_TRACE(std::string(info.name) + " with " + std::to_string(all.size()) + " bytes");
      const size_t third = all.size() / 3;
      // An empty piece among them, as from an SGE of length 0.
      const std::array<std::span<const uint8_t>, 4> pieces = {
          all.first(third), std::span<const uint8_t>(), all.subspan(third, third), all.subspan(2 * third)};
      Bytes whole(kMaxPacketBytes);
      Result<size_t> len = BuildPacket(f, Gather(pieces), whole, &kAddr);
      ASSERT_TRUE(len.ok()) << len.status().message();
      whole.resize(*len);

      std::array<uint8_t, 64> headers;
      headers.fill(0xee);
      std::array<uint8_t, kMaxTrailerBytes> trailer;
      trailer.fill(0xee);
      Result<GatheredPacket> g = BuildGatheredPacket(f, Gather(pieces), headers, trailer, kAddr);
      ASSERT_TRUE(g.ok()) << g.status().message();
      EXPECT_EQ(g->length, *len);
      EXPECT_EQ(g->header_bytes, info.length);
      EXPECT_EQ(g->trailer_bytes, *len - info.length - all.size());
      Bytes sent(headers.begin(), headers.begin() + g->header_bytes);
      sent.insert(sent.end(), all.begin(), all.end());
      sent.insert(sent.end(), trailer.begin(), trailer.begin() + g->trailer_bytes);
      EXPECT_EQ(sent, whole);
      EXPECT_TRUE(CheckIcrc(kAddr, sent).ok());
    }
  }
}

TEST(BuildGatheredPacket, FailsAsBuildPacketDoesAndOnTooSmallAHeaderBuffer) {
  PacketFields f;
  f.opcode = Opcode::RC_RDMA_WRITE_FIRST;
  const Bytes odd(10, 1);
  const std::span<const uint8_t> piece(odd);
  std::array<uint8_t, 64> headers;
  std::array<uint8_t, kMaxTrailerBytes> trailer;
  Result<GatheredPacket> g = BuildGatheredPacket(f, Gather(&piece, 1), headers, trailer, kAddr);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), EINVAL);
  EXPECT_TRUE(Contains(g.status(), "not a multiple of 4")) << g.status().message();

  f.opcode = Opcode::RC_RDMA_WRITE_ONLY;  // BTH + RETH: 28 bytes
  g = BuildGatheredPacket(f, Gather(&piece, 1), std::span(headers).first(20), trailer, kAddr);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ENOBUFS);
  EXPECT_TRUE(Contains(g.status(), "28 bytes of headers; the buffer has 20")) << g.status().message();
}

TEST(BuildGatheredPacket, RefusesMorePiecesThanItGathers) {
  PacketFields f;
  f.opcode = Opcode::RC_SEND_ONLY;
  const Bytes byte(1, 7);
  std::vector<std::span<const uint8_t>> pieces(kMaxGatherPieces + 1, std::span<const uint8_t>(byte));
  std::array<uint8_t, 64> headers;
  std::array<uint8_t, kMaxTrailerBytes> trailer;
  Result<GatheredPacket> g = BuildGatheredPacket(f, Gather(pieces), headers, trailer, kAddr);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), EINVAL);
  pieces.pop_back();
  g = BuildGatheredPacket(f, Gather(pieces), headers, trailer, kAddr);
  EXPECT_TRUE(g.ok()) << g.status().message();
}

// What tshark's "XRC Extended Transport Header" decodes: the reserved byte,
// then the 24-bit XRC SRQ number, right after the BTH (IBA 9.2; rxe).
TEST(BuildPacket, WritesXrcSendOnlyByteForByte) {
  PacketFields f;
  f.opcode = Opcode::XRC_SEND_ONLY;
  f.bth.dest_qpn = 0x12;
  f.bth.ack_req = true;
  f.bth.psn = 7;
  f.xrc_srqn = 0x000203;
  const Bytes payload = {1, 2, 3, 4};
  Bytes buf(64);
  Result<size_t> len = BuildPacket(f, std::span<const uint8_t>(payload), buf);
  ASSERT_TRUE(len.ok()) << len.status().message();
  buf.resize(*len);
  const Bytes want = {
      0xa4, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x07,  // BTH
      0x00, 0x00, 0x02, 0x03,                                                  // XRCETH
      1,    2,    3,    4,                                                     // payload
      0x00, 0x00, 0x00, 0x00,                                                  // ICRC (later)
  };
  EXPECT_EQ(buf, want);
}

TEST(BuildPacket, RejectsA25BitXrcSrqNumber) {
  PacketFields f;
  f.opcode = Opcode::XRC_SEND_ONLY;
  f.xrc_srqn = 0x1000000;
  Bytes buf(64);
  const Status s = BuildPacket(f, std::span<const uint8_t>(), buf).status();
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_TRUE(Contains(s, "XRC SRQ number")) << s.message();
}

TEST(BuildPacket, WritesRdmaWriteOnlyWithImmediateByteForByte) {
  PacketFields f;
  f.opcode = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
  f.bth.solicited = true;
  f.bth.dest_qpn = 0x11;
  f.bth.ack_req = true;
  f.bth.psn = 0x2a;
  f.reth = {.va = 0x00007f0012345000, .rkey = 0xabcd, .dma_length = 5};
  f.imm = 0xdeadbeef;
  const Bytes payload = {'a', 'b', 'c', 'd', 'e'};
  Bytes buf(64, 0xee);
  Result<size_t> len = BuildPacket(f, std::span<const uint8_t>(payload), buf);
  ASSERT_TRUE(len.ok()) << len.status().message();
  buf.resize(*len);
  const Bytes want = {
      0x0b, 0xb0, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x2a,  // BTH
      0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x50, 0x00,                          // RETH va
      0x00, 0x00, 0xab, 0xcd, 0x00, 0x00, 0x00, 0x05,                          // rkey, length
      0xde, 0xad, 0xbe, 0xef,                                                  // ImmDt
      'a',  'b',  'c',  'd',  'e',  0x00, 0x00, 0x00,                          // payload, pad
      0x00, 0x00, 0x00, 0x00,                                                  // ICRC (later)
  };
  EXPECT_EQ(buf, want);
}

TEST(BuildPacket, WritesUdSendOnlyByteForByte) {
  PacketFields f;
  f.opcode = Opcode::UD_SEND_ONLY;
  f.bth.dest_qpn = 5;
  f.bth.psn = 1;
  f.deth = {.qkey = 0x11111111, .src_qpn = 7};
  const Bytes payload = {1, 2, 3, 4};
  Bytes buf(64);
  Result<size_t> len = BuildPacket(f, std::span<const uint8_t>(payload), buf, &kAddr);
  ASSERT_TRUE(len.ok());
  buf.resize(*len);
  ASSERT_EQ(buf.size(), 28u);
  const Bytes head = {0x64, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x01,
                      0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x07, 1,    2,    3,    4};
  EXPECT_EQ(Bytes(buf.begin(), buf.begin() + 24), head);
  const uint32_t icrc = ComputeIcrc(kAddr, std::span<const uint8_t>(buf).first(24));
  EXPECT_EQ(buf[24], icrc & 0xff);  // little-endian trailer
  EXPECT_EQ(buf[27], icrc >> 24);
}

TEST(BuildPacket, ZeroLengthSendCarriesNoPad) {
  PacketFields f;
  f.opcode = Opcode::RC_SEND_ONLY;
  Bytes buf(64);
  Result<size_t> len = BuildPacket(f, std::span<const uint8_t>(), buf, &kAddr);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, 16u);
  Result<PacketView> p = ParsePacket(std::span<const uint8_t>(buf).first(*len));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->payload().empty());
  EXPECT_EQ(p->pad_count(), 0);
}

TEST(BuildPacket, Ipv6AddressingFillsTheIcrc) {
  IcrcAddressing6 addr;
  addr.src_ip[15] = 1;
  addr.dst_ip[15] = 2;
  PacketFields f;
  f.opcode = Opcode::RC_ACKNOWLEDGE;
  Bytes buf(20);
  Result<size_t> len = BuildPacket(f, Gather(), buf, addr);
  ASSERT_TRUE(len.ok());
  EXPECT_TRUE(CheckIcrc(addr, buf).ok());
}

TEST(BuildPacket, RejectsPayloadOnAnOpcodeThatCarriesNone) {
  PacketFields f;
  f.opcode = Opcode::RC_RDMA_READ_REQUEST;
  const Bytes payload(8);
  Bytes buf(128);
  const Status s = BuildPacket(f, std::span<const uint8_t>(payload), buf).status();
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_TRUE(Contains(s, "RC_RDMA_READ_REQUEST carries no payload")) << s.message();
}

TEST(BuildPacket, RejectsAPaddedFirstOrMiddlePacket) {
  PacketFields f;
  f.opcode = Opcode::UC_SEND_MIDDLE;
  const Bytes payload(1023);
  Bytes buf(2048);
  const Status s = BuildPacket(f, std::span<const uint8_t>(payload), buf).status();
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_TRUE(Contains(s, "only the last packet")) << s.message();
}

TEST(BuildPacket, RejectsPayloadLargerThanTheLargestMtu) {
  PacketFields f;
  f.opcode = Opcode::UD_SEND_ONLY;
  const Bytes payload(4097);
  Bytes buf(8192);
  EXPECT_EQ(BuildPacket(f, std::span<const uint8_t>(payload), buf).status().code(), EINVAL);
}

TEST(BuildPacket, RejectsA25BitPsnOrQpn) {
  PacketFields f;
  f.opcode = Opcode::RC_SEND_ONLY;
  Bytes buf(64);
  f.bth.psn = 0x1000000;
  Status s = BuildPacket(f, std::span<const uint8_t>(), buf).status();
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_TRUE(Contains(s, "PSN 16777216 does not fit in 24 bits")) << s.message();
  f.bth.psn = 0;
  f.bth.dest_qpn = 0x1000000;
  EXPECT_EQ(BuildPacket(f, std::span<const uint8_t>(), buf).status().code(), EINVAL);
}

TEST(BuildPacket, RejectsAnOpcodeItDoesNotSpeak) {
  PacketFields f;
  f.opcode = static_cast<Opcode>(0x81);
  Bytes buf(64);
  const Status s = BuildPacket(f, std::span<const uint8_t>(), buf).status();
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_TRUE(Contains(s, "opcode 0x81")) << s.message();
}

TEST(BuildPacket, ReportsHowManyBytesASmallBufferLacks) {
  PacketFields f;
  f.opcode = Opcode::RC_COMPARE_SWAP;
  Bytes buf(43);
  const Status s = BuildPacket(f, std::span<const uint8_t>(), buf).status();
  EXPECT_EQ(s.code(), ENOBUFS);
  EXPECT_TRUE(Contains(s, "needs 44 bytes; the buffer has 43")) << s.message();
}

// A packet to corrupt: RC_RDMA_WRITE_FIRST (BTH + RETH) with 16 bytes.
Bytes ValidWriteFirst() {
  PacketFields f;
  f.opcode = Opcode::RC_RDMA_WRITE_FIRST;
  const Bytes payload(16, 0x5a);
  Bytes buf(64);
  const size_t len = BuildPacket(f, std::span<const uint8_t>(payload), buf, &kAddr).value();
  buf.resize(len);
  return buf;
}

Bytes Ack() {
  PacketFields f;
  f.opcode = Opcode::RC_ACKNOWLEDGE;
  Bytes buf(20);
  EXPECT_TRUE(BuildPacket(f, Gather(), buf, &kAddr).ok());
  return buf;
}

TEST(ParsePacket, AcceptsScapysUcSendOnlyWithPadCount2) {
  const Bytes wire = {0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
                      0x46, 0x30, 0x81, 0x8b, 0xe2, 0x89, 0x35, 0xd9, 0x0e, 0x9a, 0x95, 0x50,
                      0x54, 0x01, 0xbe, 0x88, 0x5e, 0x50, 0x00, 0x00, 0x78, 0xf3, 0x53, 0xf3};
  Result<PacketView> p = ParsePacket(wire);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->opcode(), Opcode::UC_SEND_ONLY);
  EXPECT_TRUE(p->bth().migreq());
  EXPECT_EQ(p->pad_count(), 2);
  EXPECT_EQ(p->payload().size(), 18u);
  EXPECT_EQ(p->payload()[0], 0x46);
  EXPECT_EQ(p->dest_qpn(), 211u);
  EXPECT_EQ(p->psn(), 13571856u);
  EXPECT_EQ(p->icrc(), 0xf353f378u);
  EXPECT_EQ(p->without_icrc().size(), 32u);
}

TEST(ParsePacket, RejectsAPacketShorterThanBthPlusIcrc) {
  const Bytes ack = Ack();
  const Status s = ParsePacket(std::span<const uint8_t>(ack).first(15)).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "15 bytes is shorter than BTH + ICRC (16)")) << s.message();
  EXPECT_EQ(ParsePacket({}).status().code(), EBADMSG);
}

TEST(ParsePacket, RejectsCnpAsAnOpcodeItDoesNotSpeak) {
  const Bytes cnp = {0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0, 0, 0, 0, 0, 0, 0, 0,
                     0,    0,    0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0x82, 0xfd, 0x00, 0x2a};
  const Status s = ParsePacket(cnp).status();
  EXPECT_EQ(s.code(), EOPNOTSUPP);
  EXPECT_TRUE(Contains(s, "opcode 0x81 is not an RC, UC, UD or XRC opcode")) << s.message();
}

TEST(ParsePacket, RejectsATransportVersionOtherThan0) {
  Bytes ack = Ack();
  ack[1] |= 0x01;
  const Status s = ParsePacket(ack).status();
  EXPECT_EQ(s.code(), EPROTONOSUPPORT);
  EXPECT_TRUE(Contains(s, "transport version 1")) << s.message();
}

TEST(ParsePacket, RejectsALengthThatIsNotAMultipleOf4) {
  Bytes w = ValidWriteFirst();
  w.push_back(0);
  const Status s = ParsePacket(w).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "not a multiple of 4")) << s.message();
}

TEST(ParsePacket, RejectsPadOnAnOpcodeWithoutPayload) {
  Bytes ack = Ack();
  ack[1] |= 0x10;
  const Status s = ParsePacket(ack).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "RC_ACKNOWLEDGE packet of 20 bytes has pad count 1, but this opcode "
                          "carries no payload"))
      << s.message();
}

TEST(ParsePacket, RejectsPadOnAFirstPacket) {
  Bytes w = ValidWriteFirst();
  w[1] |= 0x30;
  const Status s = ParsePacket(w).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "only the last packet of a message is padded")) << s.message();
}

TEST(ParsePacket, RejectsAPacketTooShortForItsOpcodesHeaders) {
  // A WRITE_FIRST cut to BTH + half a RETH + ICRC.
  Bytes w = ValidWriteFirst();
  w.resize(24);
  const Status s = ParsePacket(w).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "RC_RDMA_WRITE_FIRST packet of 24 bytes is shorter than its headers (28)"))
      << s.message();
}

TEST(ParsePacket, RejectsPadThatDoesNotFitInThePacket) {
  // A SEND_ONLY of exactly BTH + ICRC claiming 3 bytes of pad.
  PacketFields f;
  f.opcode = Opcode::RC_SEND_ONLY;
  Bytes buf(16);
  ASSERT_TRUE(BuildPacket(f, std::span<const uint8_t>(), buf).ok());
  buf[1] |= 0x30;
  const Status s = ParsePacket(buf).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "pad (3)")) << s.message();
}

TEST(ParsePacket, RejectsBytesAfterTheHeadersOfAnOpcodeWithoutPayload) {
  Bytes ack = Ack();
  ack.insert(ack.begin() + 16, 4, 0);
  const Status s = ParsePacket(ack).status();
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_TRUE(Contains(s, "carries 4 bytes after its headers")) << s.message();
}

TEST(ParsePacket, RejectsPayloadLargerThanTheLargestMtu) {
  PacketFields f;
  f.opcode = Opcode::RC_SEND_ONLY;
  const Bytes payload(4096);
  Bytes buf(kMaxPacketBytes);
  const size_t len = BuildPacket(f, std::span<const uint8_t>(payload), buf).value();
  buf.resize(len);
  EXPECT_TRUE(ParsePacket(buf).ok());
  buf.insert(buf.begin() + 12, 4, 0);
  EXPECT_EQ(ParsePacket(buf).status().code(), EBADMSG);
}

TEST(ParsePacket, DoesNotCheckTheIcrc) {
  Bytes ack = Ack();
  ack.back() ^= 0xff;
  Result<PacketView> p = ParsePacket(ack);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(CheckIcrc(kAddr, p->bytes()).code(), EBADMSG);
}

TEST(PacketViewDeathTest, AskingForAHeaderTheOpcodeLacksAborts) {
  const Bytes ack = Ack();
  Result<PacketView> p = ParsePacket(ack);
  ASSERT_TRUE(p.ok());
  EXPECT_DEATH(p->reth(), "RC_ACKNOWLEDGE");
}

}  // namespace
}  // namespace rdmaemu::wire
