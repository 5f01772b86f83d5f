#include "emulator/wire/headers.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace rdmaemu::wire {
namespace {

using Bytes = std::vector<uint8_t>;

TEST(BthView, ReadsTheBthOfACapturedConnectX4Packet) {
  // BTH of the CNP captured on a ConnectX-4 Lx (scapy test/contrib/roce.uts).
  const Bytes wire = {0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00};
  const ConstBthView bth{std::span<const uint8_t>(wire)};
  EXPECT_EQ(bth.opcode(), 0x81);
  EXPECT_FALSE(bth.solicited());
  EXPECT_FALSE(bth.migreq());
  EXPECT_EQ(bth.pad_count(), 0);
  EXPECT_EQ(bth.tver(), 0);
  EXPECT_EQ(bth.pkey(), 0xffff);
  EXPECT_FALSE(bth.fecn());
  EXPECT_TRUE(bth.becn());
  EXPECT_EQ(bth.dest_qpn(), 0x118u);
  EXPECT_FALSE(bth.ack_req());
  EXPECT_EQ(bth.psn(), 0u);
}

TEST(BthView, WritesEveryFieldAtItsIbaBitPosition) {
  Bytes b(12, 0);
  BthView bth{std::span<uint8_t>(b)};
  bth.set_opcode(Opcode::RC_RDMA_WRITE_ONLY);
  bth.set_solicited(true);
  bth.set_migreq(true);
  bth.set_pad_count(3);
  bth.set_tver(0x5);
  bth.set_pkey(0x8001);
  bth.set_fecn(true);
  bth.set_becn(true);
  bth.set_dest_qpn(0x123456);
  bth.set_ack_req(true);
  bth.set_psn(0xabcdef);
  const Bytes want = {0x0a, 0x80 | 0x40 | 0x30 | 0x05, 0x80, 0x01, 0xc0, 0x12,
                      0x34, 0x56, 0x80, 0xab, 0xcd, 0xef};
  EXPECT_EQ(b, want);

  bth.set_solicited(false);
  bth.set_pad_count(1);
  bth.set_fecn(false);
  bth.set_ack_req(false);
  const Bytes want2 = {0x0a, 0x40 | 0x10 | 0x05, 0x80, 0x01, 0x40, 0x12,
                       0x34, 0x56, 0x00, 0xab, 0xcd, 0xef};
  EXPECT_EQ(b, want2);
}

TEST(BthView, SettersKeepOnlyTheFieldsBitsAndLeaveReservedBitsAlone) {
  Bytes b(12, 0);
  b[4] = 0x3f;  // resv6
  b[8] = 0x7f;  // resv7
  BthView bth{std::span<uint8_t>(b)};
  bth.set_dest_qpn(0xff123456);
  bth.set_psn(0x01000001);
  bth.set_pad_count(0xff);
  bth.set_tver(0xf3);
  bth.set_becn(true);
  bth.set_ack_req(true);
  EXPECT_EQ(bth.dest_qpn(), 0x123456u);
  EXPECT_EQ(bth.psn(), 1u);
  EXPECT_EQ(bth.pad_count(), 3);
  EXPECT_EQ(bth.tver(), 3);
  EXPECT_EQ(b[0], 0);  // opcode untouched by neighbours
  EXPECT_EQ(b[4], 0x7f);
  EXPECT_EQ(b[8], 0xff);
}

TEST(RethView, FieldsAreBigEndianInIbaOrder) {
  Bytes b(16, 0);
  RethView reth{std::span<uint8_t>(b)};
  reth.set_va(0x0102030405060708);
  reth.set_rkey(0x11223344);
  reth.set_dma_length(0x00001000);
  const Bytes want = {1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0x10, 0};
  EXPECT_EQ(b, want);
  const ConstRethView read{std::span<const uint8_t>(b)};
  EXPECT_EQ(read.va(), 0x0102030405060708u);
  EXPECT_EQ(read.rkey(), 0x11223344u);
  EXPECT_EQ(read.dma_length(), 0x1000u);
}

TEST(AethSyndrome, EncodesAckRnrNakAndNakAsTheIbaTableSays) {
  EXPECT_EQ(AckSyndrome(), 0x1f);  // ACK, credit count "invalid"
  EXPECT_EQ(AckSyndrome(5), 0x05);
  EXPECT_EQ(RnrNakSyndrome(0), 0x20);
  EXPECT_EQ(RnrNakSyndrome(12), 0x2c);
  EXPECT_EQ(RnrNakSyndrome(31), 0x3f);
  EXPECT_EQ(NakSyndrome(NakCode::kPsnSequenceError), 0x60);
  EXPECT_EQ(NakSyndrome(NakCode::kInvalidRequest), 0x61);
  EXPECT_EQ(NakSyndrome(NakCode::kRemoteAccessError), 0x62);
  EXPECT_EQ(NakSyndrome(NakCode::kRemoteOperationalError), 0x63);
  EXPECT_EQ(NakSyndrome(NakCode::kInvalidRdRequest), 0x64);
}

TEST(AethSyndrome, DecodesTypeAndValue) {
  EXPECT_EQ(SyndromeType(0x1f), AethType::kAck);
  EXPECT_EQ(SyndromeValue(0x1f), 0x1f);
  EXPECT_EQ(SyndromeType(0x2c), AethType::kRnrNak);
  EXPECT_EQ(SyndromeValue(0x2c), 12);
  EXPECT_EQ(SyndromeType(0x40), AethType::kReserved);
  EXPECT_EQ(SyndromeType(0x62), AethType::kNak);
  EXPECT_EQ(static_cast<NakCode>(SyndromeValue(0x62)), NakCode::kRemoteAccessError);
  EXPECT_EQ(ToString(NakCode::kRemoteAccessError), "remote access error");
  EXPECT_EQ(ToString(static_cast<NakCode>(9)), "reserved NAK code");
  EXPECT_EQ(ToString(AethType::kRnrNak), "RNR NAK");
}

TEST(AethView, SyndromeThenBigEndianMsn) {
  Bytes b(4, 0);
  AethView aeth{std::span<uint8_t>(b)};
  aeth.set_syndrome(RnrNakSyndrome(14));
  aeth.set_msn(0x1abcdef);  // only 24 bits fit
  EXPECT_EQ(b, (Bytes{0x2e, 0xab, 0xcd, 0xef}));
  EXPECT_EQ(aeth.type(), AethType::kRnrNak);
  EXPECT_EQ(aeth.value(), 14);
  EXPECT_EQ(aeth.msn(), 0xabcdefu);
}

TEST(AtomicEthView, VaRkeySwapAddCompareAtTheirOffsets) {
  Bytes b(28, 0);
  AtomicEthView a{std::span<uint8_t>(b)};
  a.set_va(0x1000000000000008);
  a.set_rkey(0xdeadbeef);
  a.set_swap_add(0x0000000000000001);
  a.set_compare(0xff00000000000000);
  const Bytes want = {0x10, 0, 0, 0, 0, 0, 0, 0x08, 0xde, 0xad, 0xbe, 0xef, 0, 0,
                      0,    0, 0, 0, 0, 1, 0xff, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(b, want);
  EXPECT_EQ(a.va(), 0x1000000000000008u);
  EXPECT_EQ(a.rkey(), 0xdeadbeefu);
  EXPECT_EQ(a.swap_add(), 1u);
  EXPECT_EQ(a.compare(), 0xff00000000000000u);
}

TEST(AtomicAckEthView, OriginalDataIsBigEndian) {
  Bytes b(8, 0);
  AtomicAckEthView(std::span<uint8_t>(b)).set_orig_data(0x0123456789abcdef);
  EXPECT_EQ(b, (Bytes{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}));
  EXPECT_EQ(ConstAtomicAckEthView(std::span<const uint8_t>(b)).orig_data(), 0x0123456789abcdefu);
}

TEST(DethView, QkeyThenReservedByteThenSourceQpn) {
  Bytes b(8, 0xaa);
  DethView d{std::span<uint8_t>(b)};
  d.set_qkey(0x80010000);
  d.set_src_qpn(0xff000001);
  EXPECT_EQ(b, (Bytes{0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01}));
  EXPECT_EQ(d.qkey(), 0x80010000u);
  EXPECT_EQ(d.src_qpn(), 1u);
}

TEST(ImmDtAndIethViews, AreBigEndian32BitValues) {
  Bytes imm(4, 0), ieth(4, 0);
  ImmDtView(std::span<uint8_t>(imm)).set_imm(0x01020304);
  IethView(std::span<uint8_t>(ieth)).set_rkey(0xa0b0c0d0);
  EXPECT_EQ(imm, (Bytes{1, 2, 3, 4}));
  EXPECT_EQ(ieth, (Bytes{0xa0, 0xb0, 0xc0, 0xd0}));
  EXPECT_EQ(ConstImmDtView(std::span<const uint8_t>(imm)).imm(), 0x01020304u);
  EXPECT_EQ(ConstIethView(std::span<const uint8_t>(ieth)).rkey(), 0xa0b0c0d0u);
}

TEST(HeaderViews, SizesAreTheIbaSizes) {
  EXPECT_EQ(BthView::kBytes, 12u);
  EXPECT_EQ(RethView::kBytes, 16u);
  EXPECT_EQ(AethView::kBytes, 4u);
  EXPECT_EQ(AtomicEthView::kBytes, 28u);
  EXPECT_EQ(AtomicAckEthView::kBytes, 8u);
  EXPECT_EQ(DethView::kBytes, 8u);
  EXPECT_EQ(ImmDtView::kBytes, 4u);
  EXPECT_EQ(IethView::kBytes, 4u);
  EXPECT_EQ(kIcrcBytes, 4u);
}

template <typename View>
concept CanSetPsn = requires(View v) { v.set_psn(1u); };
template <typename View>
concept CanSetRkey = requires(View v) { v.set_rkey(1u); };

TEST(HeaderViews, ConstViewsHaveNoSetters) {
  static_assert(!ConstBthView::kMutable && BthView::kMutable);
  static_assert(!CanSetPsn<ConstBthView>);
  static_assert(CanSetPsn<BthView>);
  static_assert(!CanSetRkey<ConstRethView>);
  static_assert(CanSetRkey<RethView>);
}

}  // namespace
}  // namespace rdmaemu::wire
