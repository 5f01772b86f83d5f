// The IBA opcodes this device speaks, as one compile-time table.
//
// An opcode byte is a transport prefix (RC 0x00, UC 0x20, RD 0x40, UD 0x60,
// XRC 0xA0) plus an operation (IBA 9.2, table 39). Each entry says which
// extension headers follow the BTH and what kind of packet it is; the header
// length and every extension header's offset are *computed* from that, so the
// table cannot disagree with itself. Engine code asks `info.Has(kRethMask)`
// instead of listing opcodes by hand.
//
// XRC (IBA 9.2, annex A14) is RC's operations under prefix 0xA0; its requests
// carry an XRCETH (the receiving XRC SRQ's number) right after the BTH, its
// responses none. RD opcodes and CNP (0x81) are not spoken: FindOpcode()
// returns nullptr for them, and the parser rejects them. FLUSH and ATOMIC
// WRITE (the IBA's Memory Placement Extensions, 0x1C and 0x1D) are, on RC
// only, laid out as Linux's rxe sends them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rdmaemu::wire {

// Header sizes in bytes (IBA 9.2-9.5; the ICRC is the 4-byte trailer).
inline constexpr size_t kBthBytes = 12;
inline constexpr size_t kRethBytes = 16;
inline constexpr size_t kAethBytes = 4;
inline constexpr size_t kAtomicEthBytes = 28;
inline constexpr size_t kAtomicAckEthBytes = 8;
inline constexpr size_t kDethBytes = 8;
inline constexpr size_t kImmDtBytes = 4;
inline constexpr size_t kIethBytes = 4;
inline constexpr size_t kXrcethBytes = 4;
inline constexpr size_t kIcrcBytes = 4;
// FLUSH Extended Transport Header: placement type (bits 3-0) and
// selectivity level (bits 5-4) of a 32-bit word.
inline constexpr size_t kFethBytes = 4;

// The largest payload one packet may carry: the largest IBA path MTU.
inline constexpr size_t kMaxPayloadBytes = 4096;

// Extension headers, in the order they follow the BTH on the wire
// (IBA 9.2: DETH, XRCETH, FETH, RETH | AtomicETH, AETH, AtomicAckETH, ImmDt | IETH).
enum class ExtHeader : uint8_t {
  kDeth,
  kXrceth,
  kFeth,
  kReth,
  kAtomicEth,
  kAeth,
  kAtomicAckEth,
  kImmDt,
  kIeth,
};
inline constexpr size_t kExtHeaderCount = 9;

inline constexpr uint32_t MaskOf(ExtHeader h) { return 1u << static_cast<uint32_t>(h); }

// Header bits: which extension headers follow the BTH.
inline constexpr uint32_t kDethMask = MaskOf(ExtHeader::kDeth);
inline constexpr uint32_t kFethMask = MaskOf(ExtHeader::kFeth);
inline constexpr uint32_t kRethMask = MaskOf(ExtHeader::kReth);
inline constexpr uint32_t kAtomicEthMask = MaskOf(ExtHeader::kAtomicEth);
inline constexpr uint32_t kAethMask = MaskOf(ExtHeader::kAeth);
inline constexpr uint32_t kAtomicAckEthMask = MaskOf(ExtHeader::kAtomicAckEth);
inline constexpr uint32_t kImmDtMask = MaskOf(ExtHeader::kImmDt);
inline constexpr uint32_t kIethMask = MaskOf(ExtHeader::kIeth);
inline constexpr uint32_t kXrcethMask = MaskOf(ExtHeader::kXrceth);
inline constexpr uint32_t kAllHeaderMasks = (1u << kExtHeaderCount) - 1;

// Property bits: what kind of packet this is.
inline constexpr uint32_t kRequestMask = 1u << 9;   // requester -> responder
inline constexpr uint32_t kResponseMask = 1u << 10;  // responder -> requester
inline constexpr uint32_t kFirstMask = 1u << 11;    // starts a message
inline constexpr uint32_t kMiddleMask = 1u << 12;   // neither starts nor ends one
inline constexpr uint32_t kLastMask = 1u << 13;     // ends a message
inline constexpr uint32_t kPayloadMask = 1u << 14;  // may carry payload (and pad)
inline constexpr uint32_t kSendMask = 1u << 15;
inline constexpr uint32_t kWriteMask = 1u << 16;
inline constexpr uint32_t kReadMask = 1u << 17;        // read request and read responses
inline constexpr uint32_t kAtomicMask = 1u << 18;      // atomic requests and atomic ack
inline constexpr uint32_t kAckMask = 1u << 19;         // ACKNOWLEDGE, ATOMIC ACKNOWLEDGE
inline constexpr uint32_t kImmMask = 1u << 20;         // carries immediate data
inline constexpr uint32_t kInvalidateMask = 1u << 21;  // carries an rkey to invalidate
inline constexpr uint32_t kRecvWqeMask = 1u << 22;     // consumes a receive WQE at the responder
// The Memory Placement Extensions: each is one request packet, remembered
// for replay as READs are, and answered by a zero-length RDMA READ RESPONSE
// ONLY (as rxe answers them).
inline constexpr uint32_t kAtomicWriteMask = 1u << 23;  // ATOMIC WRITE: 8 bytes placed at once
inline constexpr uint32_t kFlushMask = 1u << 24;        // FLUSH: earlier writes made visible
// A single-packet message both starts and ends it: Has(kOnlyMask) needs both
// bits, Has(kFirstMask) is true for FIRST and ONLY, Has(kLastMask) for LAST and ONLY.
// The header bits stay below the property bits.
static_assert(kAllHeaderMasks < kRequestMask);
inline constexpr uint32_t kOnlyMask = kFirstMask | kLastMask;

enum class Transport : uint8_t { kRc, kUc, kUd, kXrc };
std::string_view ToString(Transport t);

// What every packet of a family has in common; shorthands for the table rows.
inline constexpr uint32_t kSendFamily = kRequestMask | kSendMask | kPayloadMask | kRecvWqeMask;
inline constexpr uint32_t kWriteFamily = kRequestMask | kWriteMask | kPayloadMask;
inline constexpr uint32_t kReadResponseFamily = kResponseMask | kReadMask | kPayloadMask;

// Every opcode spoken, once: X(NAME, byte, transport, headers | properties).
// NAME is the IBA name with the transport prefix; it becomes both the enum
// value and the string ToString() returns. Expand it inside rdmaemu::wire.
#define RDMAEMU_WIRE_OPCODES(X)                                                              \
  X(RC_SEND_FIRST, 0x00, kRc, kSendFamily | kFirstMask)                                      \
  X(RC_SEND_MIDDLE, 0x01, kRc, kSendFamily | kMiddleMask)                                    \
  X(RC_SEND_LAST, 0x02, kRc, kSendFamily | kLastMask)                                        \
  X(RC_SEND_LAST_WITH_IMMEDIATE, 0x03, kRc, kSendFamily | kLastMask | kImmDtMask | kImmMask) \
  X(RC_SEND_ONLY, 0x04, kRc, kSendFamily | kOnlyMask)                                        \
  X(RC_SEND_ONLY_WITH_IMMEDIATE, 0x05, kRc, kSendFamily | kOnlyMask | kImmDtMask | kImmMask) \
  X(RC_RDMA_WRITE_FIRST, 0x06, kRc, kWriteFamily | kFirstMask | kRethMask)                   \
  X(RC_RDMA_WRITE_MIDDLE, 0x07, kRc, kWriteFamily | kMiddleMask)                             \
  X(RC_RDMA_WRITE_LAST, 0x08, kRc, kWriteFamily | kLastMask)                                 \
  X(RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 0x09, kRc,                                            \
    kWriteFamily | kLastMask | kImmDtMask | kImmMask | kRecvWqeMask)                         \
  X(RC_RDMA_WRITE_ONLY, 0x0a, kRc, kWriteFamily | kOnlyMask | kRethMask)                     \
  X(RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0x0b, kRc,                                            \
    kWriteFamily | kOnlyMask | kRethMask | kImmDtMask | kImmMask | kRecvWqeMask)             \
  X(RC_RDMA_READ_REQUEST, 0x0c, kRc, kRequestMask | kReadMask | kOnlyMask | kRethMask)       \
  X(RC_RDMA_READ_RESPONSE_FIRST, 0x0d, kRc, kReadResponseFamily | kFirstMask | kAethMask)    \
  X(RC_RDMA_READ_RESPONSE_MIDDLE, 0x0e, kRc, kReadResponseFamily | kMiddleMask)              \
  X(RC_RDMA_READ_RESPONSE_LAST, 0x0f, kRc, kReadResponseFamily | kLastMask | kAethMask)      \
  X(RC_RDMA_READ_RESPONSE_ONLY, 0x10, kRc, kReadResponseFamily | kOnlyMask | kAethMask)      \
  X(RC_ACKNOWLEDGE, 0x11, kRc, kResponseMask | kAckMask | kOnlyMask | kAethMask)             \
  X(RC_ATOMIC_ACKNOWLEDGE, 0x12, kRc,                                                        \
    kResponseMask | kAckMask | kAtomicMask | kOnlyMask | kAethMask | kAtomicAckEthMask)      \
  X(RC_COMPARE_SWAP, 0x13, kRc, kRequestMask | kAtomicMask | kOnlyMask | kAtomicEthMask)     \
  X(RC_FETCH_ADD, 0x14, kRc, kRequestMask | kAtomicMask | kOnlyMask | kAtomicEthMask)        \
  X(RC_SEND_LAST_WITH_INVALIDATE, 0x16, kRc,                                                 \
    kSendFamily | kLastMask | kIethMask | kInvalidateMask)                                   \
  X(RC_SEND_ONLY_WITH_INVALIDATE, 0x17, kRc,                                                 \
    kSendFamily | kOnlyMask | kIethMask | kInvalidateMask)                                   \
  X(RC_FLUSH, 0x1c, kRc, kRequestMask | kOnlyMask | kFethMask | kRethMask | kFlushMask)      \
  X(RC_ATOMIC_WRITE, 0x1d, kRc,                                                              \
    kRequestMask | kOnlyMask | kRethMask | kPayloadMask | kAtomicWriteMask)                  \
  X(UC_SEND_FIRST, 0x20, kUc, kSendFamily | kFirstMask)                                      \
  X(UC_SEND_MIDDLE, 0x21, kUc, kSendFamily | kMiddleMask)                                    \
  X(UC_SEND_LAST, 0x22, kUc, kSendFamily | kLastMask)                                        \
  X(UC_SEND_LAST_WITH_IMMEDIATE, 0x23, kUc, kSendFamily | kLastMask | kImmDtMask | kImmMask) \
  X(UC_SEND_ONLY, 0x24, kUc, kSendFamily | kOnlyMask)                                        \
  X(UC_SEND_ONLY_WITH_IMMEDIATE, 0x25, kUc, kSendFamily | kOnlyMask | kImmDtMask | kImmMask) \
  X(UC_RDMA_WRITE_FIRST, 0x26, kUc, kWriteFamily | kFirstMask | kRethMask)                   \
  X(UC_RDMA_WRITE_MIDDLE, 0x27, kUc, kWriteFamily | kMiddleMask)                             \
  X(UC_RDMA_WRITE_LAST, 0x28, kUc, kWriteFamily | kLastMask)                                 \
  X(UC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 0x29, kUc,                                            \
    kWriteFamily | kLastMask | kImmDtMask | kImmMask | kRecvWqeMask)                         \
  X(UC_RDMA_WRITE_ONLY, 0x2a, kUc, kWriteFamily | kOnlyMask | kRethMask)                     \
  X(UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0x2b, kUc,                                            \
    kWriteFamily | kOnlyMask | kRethMask | kImmDtMask | kImmMask | kRecvWqeMask)             \
  X(UD_SEND_ONLY, 0x64, kUd, kSendFamily | kOnlyMask | kDethMask)                            \
  X(UD_SEND_ONLY_WITH_IMMEDIATE, 0x65, kUd,                                                  \
    kSendFamily | kOnlyMask | kDethMask | kImmDtMask | kImmMask)                             \
  RDMAEMU_WIRE_XRC_OPCODES(X)

// XRC: RC's rows at 0xA0, every request with an XRCETH.
#define RDMAEMU_WIRE_XRC_OPCODES(X)                                                          \
  X(XRC_SEND_FIRST, 0xa0, kXrc, kXrcethMask | kSendFamily | kFirstMask)                      \
  X(XRC_SEND_MIDDLE, 0xa1, kXrc, kXrcethMask | kSendFamily | kMiddleMask)                    \
  X(XRC_SEND_LAST, 0xa2, kXrc, kXrcethMask | kSendFamily | kLastMask)                        \
  X(XRC_SEND_LAST_WITH_IMMEDIATE, 0xa3, kXrc,                                                \
    kXrcethMask | kSendFamily | kLastMask | kImmDtMask | kImmMask)                           \
  X(XRC_SEND_ONLY, 0xa4, kXrc, kXrcethMask | kSendFamily | kOnlyMask)                        \
  X(XRC_SEND_ONLY_WITH_IMMEDIATE, 0xa5, kXrc,                                                \
    kXrcethMask | kSendFamily | kOnlyMask | kImmDtMask | kImmMask)                           \
  X(XRC_RDMA_WRITE_FIRST, 0xa6, kXrc, kXrcethMask | kWriteFamily | kFirstMask | kRethMask)   \
  X(XRC_RDMA_WRITE_MIDDLE, 0xa7, kXrc, kXrcethMask | kWriteFamily | kMiddleMask)             \
  X(XRC_RDMA_WRITE_LAST, 0xa8, kXrc, kXrcethMask | kWriteFamily | kLastMask)                 \
  X(XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 0xa9, kXrc,                                          \
    kXrcethMask | kWriteFamily | kLastMask | kImmDtMask | kImmMask | kRecvWqeMask)           \
  X(XRC_RDMA_WRITE_ONLY, 0xaa, kXrc, kXrcethMask | kWriteFamily | kOnlyMask | kRethMask)     \
  X(XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0xab, kXrc,                                          \
    kXrcethMask | kWriteFamily | kOnlyMask | kRethMask | kImmDtMask | kImmMask | kRecvWqeMask) \
  X(XRC_RDMA_READ_REQUEST, 0xac, kXrc,                                                       \
    kXrcethMask | kRequestMask | kReadMask | kOnlyMask | kRethMask)                          \
  X(XRC_RDMA_READ_RESPONSE_FIRST, 0xad, kXrc, kReadResponseFamily | kFirstMask | kAethMask)  \
  X(XRC_RDMA_READ_RESPONSE_MIDDLE, 0xae, kXrc, kReadResponseFamily | kMiddleMask)            \
  X(XRC_RDMA_READ_RESPONSE_LAST, 0xaf, kXrc, kReadResponseFamily | kLastMask | kAethMask)    \
  X(XRC_RDMA_READ_RESPONSE_ONLY, 0xb0, kXrc, kReadResponseFamily | kOnlyMask | kAethMask)    \
  X(XRC_ACKNOWLEDGE, 0xb1, kXrc, kResponseMask | kAckMask | kOnlyMask | kAethMask)           \
  X(XRC_ATOMIC_ACKNOWLEDGE, 0xb2, kXrc,                                                      \
    kResponseMask | kAckMask | kAtomicMask | kOnlyMask | kAethMask | kAtomicAckEthMask)      \
  X(XRC_COMPARE_SWAP, 0xb3, kXrc,                                                            \
    kXrcethMask | kRequestMask | kAtomicMask | kOnlyMask | kAtomicEthMask)                   \
  X(XRC_FETCH_ADD, 0xb4, kXrc,                                                               \
    kXrcethMask | kRequestMask | kAtomicMask | kOnlyMask | kAtomicEthMask)                   \
  X(XRC_SEND_LAST_WITH_INVALIDATE, 0xb6, kXrc,                                               \
    kXrcethMask | kSendFamily | kLastMask | kIethMask | kInvalidateMask)                     \
  X(XRC_SEND_ONLY_WITH_INVALIDATE, 0xb7, kXrc,                                               \
    kXrcethMask | kSendFamily | kOnlyMask | kIethMask | kInvalidateMask)

enum class Opcode : uint8_t {
#define RDMAEMU_OPCODE_ENUM_(name, value, transport, mask) name = value,
  RDMAEMU_WIRE_OPCODES(RDMAEMU_OPCODE_ENUM_)
#undef RDMAEMU_OPCODE_ENUM_
};

struct OpcodeInfo {
  std::string_view name;  // IBA name, e.g. "RC_SEND_FIRST"; empty if not spoken
  Opcode opcode{};
  Transport transport{};
  uint32_t mask = 0;  // header bits | property bits
  // Bytes from the start of the BTH to the payload: BTH plus extension headers.
  uint8_t length = 0;
  // Offset of each present extension header from the start of the BTH, indexed
  // by ExtHeader; 0 for an absent one (no extension header can sit at 0).
  std::array<uint8_t, kExtHeaderCount> offset{};

  constexpr bool valid() const { return !name.empty(); }
  // True if every bit of `bits` is set.
  constexpr bool Has(uint32_t bits) const { return (mask & bits) == bits; }
  constexpr size_t OffsetOf(ExtHeader h) const { return offset[static_cast<size_t>(h)]; }
};

// Bytes of extension header `h`.
consteval size_t ExtHeaderBytes(ExtHeader h) {
  switch (h) {
    case ExtHeader::kDeth: return kDethBytes;
    case ExtHeader::kFeth: return kFethBytes;
    case ExtHeader::kXrceth: return kXrcethBytes;
    case ExtHeader::kReth: return kRethBytes;
    case ExtHeader::kAtomicEth: return kAtomicEthBytes;
    case ExtHeader::kAeth: return kAethBytes;
    case ExtHeader::kAtomicAckEth: return kAtomicAckEthBytes;
    case ExtHeader::kImmDt: return kImmDtBytes;
    case ExtHeader::kIeth: return kIethBytes;
  }
  return 0;
}

// Lays the extension headers named in `mask` out after the BTH, in wire order.
// Returns the offsets; the header length is returned through `length`.
consteval std::array<uint8_t, kExtHeaderCount> LayOutHeaders(uint32_t mask, size_t* length) {
  std::array<uint8_t, kExtHeaderCount> offsets{};
  size_t at = kBthBytes;
  for (size_t i = 0; i < kExtHeaderCount; ++i) {
    const auto h = static_cast<ExtHeader>(i);
    if (mask & MaskOf(h)) {
      offsets[i] = static_cast<uint8_t>(at);
      at += ExtHeaderBytes(h);
    }
  }
  *length = at;
  return offsets;
}

consteval size_t HeaderLength(uint32_t mask) {
  size_t length = 0;
  LayOutHeaders(mask, &length);
  return length;
}

consteval OpcodeInfo MakeOpcodeInfo(std::string_view name, uint8_t value, Transport transport,
                                    uint32_t mask) {
  OpcodeInfo info;
  info.name = name;
  info.opcode = static_cast<Opcode>(value);
  info.transport = transport;
  info.mask = mask;
  size_t length = 0;
  info.offset = LayOutHeaders(mask, &length);
  info.length = static_cast<uint8_t>(length);
  return info;
}

consteval std::array<OpcodeInfo, 256> MakeOpcodeTable() {
  std::array<OpcodeInfo, 256> table{};
#define RDMAEMU_OPCODE_ROW_(name, value, transport, mask) \
  table[value] = MakeOpcodeInfo(#name, value, Transport::transport, mask);
  RDMAEMU_WIRE_OPCODES(RDMAEMU_OPCODE_ROW_)
#undef RDMAEMU_OPCODE_ROW_
  return table;
}

// Indexed by the opcode byte; entries that are not spoken have !valid().
inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = MakeOpcodeTable();

// The description of `opcode`, or nullptr for one this device does not speak.
constexpr const OpcodeInfo* FindOpcode(uint8_t opcode) {
  const OpcodeInfo& info = kOpcodeTable[opcode];
  return info.valid() ? &info : nullptr;
}

// The description of a spoken opcode.
constexpr const OpcodeInfo& InfoOf(Opcode opcode) {
  return kOpcodeTable[static_cast<uint8_t>(opcode)];
}

// The transport prefix of an opcode byte (IBA 9.2: its top 3 bits); RC, UC
// and XRC share the operation numbering below it.
inline constexpr uint8_t kTransportPrefixMask = 0xe0;
inline constexpr uint8_t kRcPrefix = 0x00;
inline constexpr uint8_t kUcPrefix = 0x20;
inline constexpr uint8_t kXrcPrefix = 0xa0;

// The same operation on another connected transport (RC_SEND_ONLY on XRC is
// XRC_SEND_ONLY); `op` is an RC, UC or XRC opcode.
constexpr Opcode WithPrefix(Opcode op, uint8_t prefix) {
  return static_cast<Opcode>((static_cast<uint8_t>(op) & ~kTransportPrefixMask) | prefix);
}
// The RC opcode of the same operation: what the completer and responder
// compare with, whichever connected transport carried it.
constexpr Opcode AsRc(Opcode op) { return WithPrefix(op, kRcPrefix); }

// "RC_SEND_FIRST", or "opcode 0x81" for an opcode this device does not speak.
std::string OpcodeName(uint8_t opcode);
inline std::string ToString(Opcode opcode) { return OpcodeName(static_cast<uint8_t>(opcode)); }

}  // namespace rdmaemu::wire
