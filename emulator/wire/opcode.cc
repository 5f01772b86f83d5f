#include "emulator/wire/opcode.h"

#include <cstdio>

namespace rdmaemu::wire {

// Lengths from IBA 9.2 table 39 (and rxe_opcode.c), checked against the
// computed layout so that a wrong header bit in the table does not compile.
static_assert(InfoOf(Opcode::RC_SEND_FIRST).length == 12);
static_assert(InfoOf(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE).length == 16);
static_assert(InfoOf(Opcode::RC_RDMA_WRITE_FIRST).length == 28);
static_assert(InfoOf(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE).length == 32);
static_assert(InfoOf(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE).OffsetOf(ExtHeader::kImmDt) == 28);
static_assert(InfoOf(Opcode::RC_RDMA_READ_REQUEST).length == 28);
static_assert(InfoOf(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE).length == 12);
static_assert(InfoOf(Opcode::RC_RDMA_READ_RESPONSE_ONLY).length == 16);
static_assert(InfoOf(Opcode::RC_ACKNOWLEDGE).length == 16);
static_assert(InfoOf(Opcode::RC_ATOMIC_ACKNOWLEDGE).length == 24);
static_assert(InfoOf(Opcode::RC_ATOMIC_ACKNOWLEDGE).OffsetOf(ExtHeader::kAtomicAckEth) == 16);
static_assert(InfoOf(Opcode::RC_COMPARE_SWAP).length == 40);
static_assert(InfoOf(Opcode::RC_SEND_ONLY_WITH_INVALIDATE).length == 16);
static_assert(InfoOf(Opcode::UD_SEND_ONLY).length == 20);
static_assert(InfoOf(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE).length == 24);
static_assert(InfoOf(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE).OffsetOf(ExtHeader::kImmDt) == 20);
static_assert(InfoOf(Opcode::RC_FLUSH).length == 32);
static_assert(InfoOf(Opcode::RC_FLUSH).OffsetOf(ExtHeader::kFeth) == 12);
static_assert(InfoOf(Opcode::RC_FLUSH).OffsetOf(ExtHeader::kReth) == 16);
static_assert(InfoOf(Opcode::RC_ATOMIC_WRITE).length == 28);
static_assert(FindOpcode(0x15) == nullptr && FindOpcode(0x81) == nullptr);
// XRC: the XRCETH sits right after the BTH, before any other header.
static_assert(InfoOf(Opcode::XRC_SEND_ONLY).length == 16);
static_assert(InfoOf(Opcode::XRC_SEND_ONLY).OffsetOf(ExtHeader::kXrceth) == 12);
static_assert(InfoOf(Opcode::XRC_RDMA_WRITE_FIRST).OffsetOf(ExtHeader::kReth) == 16);
static_assert(InfoOf(Opcode::XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE).length == 36);
static_assert(InfoOf(Opcode::XRC_COMPARE_SWAP).length == 44);
static_assert(InfoOf(Opcode::XRC_ACKNOWLEDGE).length == 16);
static_assert(FindOpcode(0xb5) == nullptr);
// Every XRC row is the RC row of the same operation, plus an XRCETH on
// requests; the Memory Placement Extensions are RC's only (as in rxe).
consteval bool XrcMirrorsRc() {
  for (int op = 0; op < 0x20; ++op) {
    const OpcodeInfo& rc = kOpcodeTable[op];
    const OpcodeInfo& xrc = kOpcodeTable[kXrcPrefix | op];
    if (rc.valid() && (rc.Has(kFlushMask) || rc.Has(kAtomicWriteMask))) {
      if (xrc.valid()) return false;
      continue;
    }
    if (rc.valid() != xrc.valid()) return false;
    if (!rc.valid()) continue;
    const uint32_t extra = rc.Has(kRequestMask) ? kXrcethMask : 0;
    if (xrc.mask != (rc.mask | extra) || xrc.transport != Transport::kXrc) return false;
  }
  return true;
}
static_assert(XrcMirrorsRc());
static_assert(AsRc(Opcode::XRC_FETCH_ADD) == Opcode::RC_FETCH_ADD);

std::string_view ToString(Transport t) {
  switch (t) {
    case Transport::kRc: return "RC";
    case Transport::kUc: return "UC";
    case Transport::kUd: return "UD";
    case Transport::kXrc: return "XRC";
  }
  return "?";
}

std::string OpcodeName(uint8_t opcode) {
  if (const OpcodeInfo* info = FindOpcode(opcode)) return std::string(info->name);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "opcode 0x%02x", opcode);
  return buf;
}

}  // namespace rdmaemu::wire
