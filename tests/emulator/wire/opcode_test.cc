#include "emulator/wire/opcode.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace rdmaemu::wire {
namespace {

// IBA 9.2 table 39, typed from the spec: opcode byte -> header length
// (BTH + extension headers). Kept independent of the X-macro on purpose.
const std::map<uint8_t, size_t>& IbaHeaderLengths() {
  static const std::map<uint8_t, size_t> lengths = {
      // RC and UC SEND: BTH; +ImmDt on *_WITH_IMMEDIATE.
      {0x00, 12}, {0x01, 12}, {0x02, 12}, {0x03, 16}, {0x04, 12}, {0x05, 16},
      // RC and UC RDMA WRITE: +RETH on FIRST/ONLY, +ImmDt on *_WITH_IMMEDIATE.
      {0x06, 28}, {0x07, 12}, {0x08, 12}, {0x09, 16}, {0x0a, 28}, {0x0b, 32},
      {0x0c, 28},  // RDMA READ REQUEST: BTH + RETH
      // READ RESPONSE FIRST/LAST/ONLY carry an AETH, MIDDLE does not.
      {0x0d, 16}, {0x0e, 12}, {0x0f, 16}, {0x10, 16},
      {0x11, 16},  // ACKNOWLEDGE: BTH + AETH
      {0x12, 24},  // ATOMIC ACKNOWLEDGE: BTH + AETH + AtomicAckETH
      {0x13, 40}, {0x14, 40},  // COMPARE_SWAP, FETCH_ADD: BTH + AtomicETH
      {0x16, 16}, {0x17, 16},  // SEND_*_WITH_INVALIDATE: BTH + IETH
      // Memory Placement Extensions (as rxe lays them out): FLUSH is
      // BTH + FETH + RETH, ATOMIC WRITE is BTH + RETH with 8 bytes of payload.
      {0x1c, 32}, {0x1d, 28},
      {0x20, 12}, {0x21, 12}, {0x22, 12}, {0x23, 16}, {0x24, 12}, {0x25, 16},
      {0x26, 28}, {0x27, 12}, {0x28, 12}, {0x29, 16}, {0x2a, 28}, {0x2b, 32},
      {0x64, 20}, {0x65, 24},  // UD SEND_ONLY(+IMM): BTH + DETH (+ImmDt)
      // XRC: RC's operations; every request has an XRCETH (4) after the BTH.
      {0xa0, 16}, {0xa1, 16}, {0xa2, 16}, {0xa3, 20}, {0xa4, 16}, {0xa5, 20},
      {0xa6, 32}, {0xa7, 16}, {0xa8, 16}, {0xa9, 20}, {0xaa, 32}, {0xab, 36},
      {0xac, 32},
      {0xad, 16}, {0xae, 12}, {0xaf, 16}, {0xb0, 16},  // READ RESPONSEs: no XRCETH
      {0xb1, 16}, {0xb2, 24},                          // ACKNOWLEDGE, ATOMIC ACKNOWLEDGE
      {0xb3, 44}, {0xb4, 44},
      {0xb6, 20}, {0xb7, 20},
  };
  return lengths;
}

TEST(OpcodeTable, SpeaksExactlyTheRcUcUdAndXrcOpcodesOfTheIba) {
  const auto& expected = IbaHeaderLengths();
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo* info = FindOpcode(static_cast<uint8_t>(op));
    EXPECT_EQ(info != nullptr, expected.count(static_cast<uint8_t>(op)) == 1)
        << "opcode 0x" << std::hex << op;
  }
  EXPECT_EQ(expected.size(), 62u);  // RC 25, UC 12, UD 2, XRC 23
}

TEST(OpcodeTable, HeaderLengthsMatchTheIba) {
  for (const auto& [op, length] : IbaHeaderLengths()) {
    const OpcodeInfo* info = FindOpcode(op);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->length, length) << info->name;
  }
}

TEST(OpcodeTable, EntryRecordsItsOwnOpcodeByte) {
  for (int op = 0; op < 256; ++op) {
    if (const OpcodeInfo* info = FindOpcode(static_cast<uint8_t>(op))) {
      EXPECT_EQ(static_cast<int>(info->opcode), op) << info->name;
    }
  }
}

TEST(OpcodeTable, NameAndTransportAgreeWithTheOpcodePrefix) {
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo* info = FindOpcode(static_cast<uint8_t>(op));
    if (info == nullptr) continue;
    const int prefix = op & 0xe0;
    const Transport want = prefix == 0x00   ? Transport::kRc
                           : prefix == 0x20 ? Transport::kUc
                           : prefix == 0xa0 ? Transport::kXrc
                                            : Transport::kUd;
    EXPECT_TRUE(prefix == 0x00 || prefix == 0x20 || prefix == 0x60 || prefix == 0xa0) << info->name;
    EXPECT_EQ(info->transport, want) << info->name;
    const std::string tag = std::string(ToString(want)) + "_";
    EXPECT_EQ(info->name.substr(0, tag.size()), tag) << info->name;
  }
}

TEST(OpcodeTable, NamesAreUnique) {
  std::set<std::string_view> names;
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (info.valid()) {
      EXPECT_TRUE(names.insert(info.name).second) << info.name;
    }
  }
}

TEST(OpcodeTable, ExtensionHeadersFollowTheBthBackToBackInWireOrder) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (!info.valid()) continue;
    size_t at = 12;
    const size_t sizes[kExtHeaderCount] = {8, 4, 4, 16, 28, 4, 8, 4, 4};  // in ExtHeader order
    for (size_t i = 0; i < kExtHeaderCount; ++i) {
      const auto h = static_cast<ExtHeader>(i);
      if (info.Has(MaskOf(h))) {
        EXPECT_EQ(info.OffsetOf(h), at) << info.name << " header " << i;
        at += sizes[i];
      } else {
        EXPECT_EQ(info.OffsetOf(h), 0u) << info.name << " header " << i;
      }
    }
    EXPECT_EQ(info.length, at) << info.name;
  }
}

TEST(OpcodeTable, UcSendAndWriteMirrorRc) {
  for (uint8_t op = 0x00; op <= 0x0b; ++op) {
    const OpcodeInfo* rc = FindOpcode(op);
    const OpcodeInfo* uc = FindOpcode(static_cast<uint8_t>(0x20 | op));
    ASSERT_NE(rc, nullptr);
    ASSERT_NE(uc, nullptr);
    EXPECT_EQ(rc->mask, uc->mask) << rc->name;
    EXPECT_EQ(rc->length, uc->length) << rc->name;
    EXPECT_EQ(rc->name.substr(3), uc->name.substr(3));
  }
}

TEST(OpcodeTable, PropertyBitsAreConsistent) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (!info.valid()) continue;
    SCOPED_TRACE(std::string(info.name));
    // Exactly one direction.
    EXPECT_NE(info.Has(kRequestMask), info.Has(kResponseMask));
    // A position in the message: MIDDLE alone, or FIRST and/or LAST.
    if (info.Has(kMiddleMask)) {
      EXPECT_FALSE(info.mask & (kFirstMask | kLastMask));
    } else {
      EXPECT_TRUE(info.mask & (kFirstMask | kLastMask));
    }
    EXPECT_EQ(info.Has(kOnlyMask), info.name.find("MIDDLE") == std::string_view::npos &&
                                       info.name.find("FIRST") == std::string_view::npos &&
                                       info.name.find("LAST") == std::string_view::npos);
    // Header bits and the property bits that restate them agree.
    EXPECT_EQ(info.Has(kImmMask), info.Has(kImmDtMask));
    EXPECT_EQ(info.Has(kInvalidateMask), info.Has(kIethMask));
    EXPECT_EQ(info.Has(kImmMask), info.name.find("WITH_IMMEDIATE") != std::string_view::npos);
    EXPECT_EQ(info.Has(kDethMask), info.transport == Transport::kUd);
    // Exactly one operation family.
    const int families = info.Has(kSendMask) + info.Has(kWriteMask) + info.Has(kReadMask) +
                         (info.Has(kAtomicMask) || info.Has(kAckMask)) +
                         info.Has(kAtomicWriteMask) + info.Has(kFlushMask);
    EXPECT_EQ(families, 1);
    // Payload: sends, writes, read responses and the 8 bytes of an atomic
    // write; never requests for data.
    EXPECT_EQ(info.Has(kPayloadMask), info.Has(kSendMask) || info.Has(kWriteMask) ||
                                          (info.Has(kReadMask) && info.Has(kResponseMask)) ||
                                          info.Has(kAtomicWriteMask));
    EXPECT_EQ(info.Has(kFethMask), info.Has(kFlushMask));
    // A receive WQE is consumed by every send and by writes with immediate.
    EXPECT_EQ(info.Has(kRecvWqeMask),
              info.Has(kSendMask) || (info.Has(kWriteMask) && info.Has(kImmMask)));
  }
}

TEST(OpcodeTable, RethOnlyWhereTheIbaPutsIt) {
  for (const OpcodeInfo& info : kOpcodeTable) {
    if (!info.valid()) continue;
    const bool write_start = info.Has(kWriteMask) && info.Has(kFirstMask);
    const bool read_request = info.Has(kReadMask) && info.Has(kRequestMask);
    const bool placement = info.Has(kAtomicWriteMask) || info.Has(kFlushMask);
    EXPECT_EQ(info.Has(kRethMask), write_start || read_request || placement) << info.name;
  }
}

TEST(OpcodeTable, InfoOfAgreesWithFindOpcode) {
  EXPECT_EQ(&InfoOf(Opcode::RC_ACKNOWLEDGE), FindOpcode(0x11));
  EXPECT_EQ(InfoOf(Opcode::UD_SEND_ONLY).name, "UD_SEND_ONLY");
  EXPECT_TRUE(InfoOf(Opcode::RC_ATOMIC_ACKNOWLEDGE).Has(kAethMask | kAtomicAckEthMask));
}

TEST(OpcodeName, NamesSpokenOpcodesAndShowsOthersInHex) {
  EXPECT_EQ(OpcodeName(0x0c), "RC_RDMA_READ_REQUEST");
  EXPECT_EQ(ToString(Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE), "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE");
  EXPECT_EQ(OpcodeName(0x81), "opcode 0x81");  // CNP
  EXPECT_EQ(OpcodeName(0x15), "opcode 0x15");  // reserved in RC
  EXPECT_EQ(OpcodeName(0x1d), "RC_ATOMIC_WRITE");
  EXPECT_EQ(OpcodeName(0x3d), "opcode 0x3d");  // no ATOMIC WRITE on UC
  EXPECT_EQ(OpcodeName(0x44), "opcode 0x44");  // RD SEND_ONLY
}

// IBA 9.2 / rxe_opcode.c: XRC requests carry the 4-byte XRCETH right after
// the BTH; XRC responses carry none.
TEST(OpcodeTable, XrcRequestsCarryXrcethAfterTheBth) {
  for (int op = 0xa0; op < 0xc0; ++op) {
    const OpcodeInfo* info = FindOpcode(static_cast<uint8_t>(op));
    if (info == nullptr) continue;
    EXPECT_EQ(info->Has(kXrcethMask), info->Has(kRequestMask)) << info->name;
    if (info->Has(kXrcethMask)) {
      EXPECT_EQ(info->OffsetOf(ExtHeader::kXrceth), kBthBytes) << info->name;
      EXPECT_EQ(info->length, InfoOf(AsRc(info->opcode)).length + kXrcethBytes) << info->name;
    }
  }
  EXPECT_EQ(InfoOf(Opcode::XRC_SEND_ONLY).length, 16);
  EXPECT_EQ(InfoOf(Opcode::XRC_RDMA_WRITE_FIRST).OffsetOf(ExtHeader::kReth), 16u);
  EXPECT_EQ(InfoOf(Opcode::XRC_ACKNOWLEDGE).length, 16);
  EXPECT_EQ(WithPrefix(Opcode::RC_SEND_ONLY, kXrcPrefix), Opcode::XRC_SEND_ONLY);
  EXPECT_EQ(AsRc(Opcode::XRC_ATOMIC_ACKNOWLEDGE), Opcode::RC_ATOMIC_ACKNOWLEDGE);
}

}  // namespace
}  // namespace rdmaemu::wire
