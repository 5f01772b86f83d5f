// Views over the RoCEv2 transport headers, with the byte order explicit.
//
// One small class per header (IBA 9.2-9.5). A view holds a span that starts
// at its header; every getter and setter goes through LoadBe*/StoreBe*, never
// through a cast to a packed struct, so there is no alignment or aliasing
// trap and the byte order is visible at every call site. Field names follow
// the IBA (psn, msn, syndrome, rkey, va).
//
// Each view comes in two flavours: `BthView` over `std::span<uint8_t>` (get
// and set) and `ConstBthView` over `std::span<const uint8_t>` (get only).
// A view must be given at least its header's size; that is the caller's
// invariant (the parser checks lengths before it makes any view), asserted.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "emulator/base/endian.h"
#include "emulator/wire/opcode.h"

namespace rdmaemu::wire {

// A 24-bit field (QPN, PSN, MSN) keeps only these bits.
inline constexpr uint32_t k24BitMask = 0x00ffffff;
// P_Key of the default partition, the only one RoCE uses.
inline constexpr uint16_t kDefaultPkey = 0xffff;

// Base of every view: the bytes, and whether setters exist.
template <typename Byte, size_t kSize>
class HeaderView {
 public:
  static constexpr size_t kBytes = kSize;
  static constexpr bool kMutable = !std::is_const_v<Byte>;

  explicit HeaderView(std::span<Byte> bytes) : p_(bytes.data()) { assert(bytes.size() >= kSize); }
  std::span<Byte, kSize> bytes() const { return std::span<Byte, kSize>(p_, kSize); }

 protected:
  Byte* p_;
};

// Base Transport Header, 12 bytes:
//   0: OpCode | 1: SE(7) M(6) PadCnt(5:4) TVer(3:0) | 2-3: P_Key
//   4: FECN(7) BECN(6) resv6 | 5-7: DestQP | 8: AckReq(7) resv7 | 9-11: PSN
template <typename Byte>
class BthViewT : public HeaderView<Byte, kBthBytes> {
  using Base = HeaderView<Byte, kBthBytes>;
  using Base::p_;

 public:
  static constexpr uint8_t kSolicitedBit = 0x80;
  static constexpr uint8_t kMigReqBit = 0x40;
  static constexpr uint8_t kPadCountMask = 0x30;
  static constexpr int kPadCountShift = 4;
  static constexpr uint8_t kTVerMask = 0x0f;
  static constexpr uint8_t kFecnBit = 0x80;
  static constexpr uint8_t kBecnBit = 0x40;
  static constexpr uint8_t kAckReqBit = 0x80;

  using Base::Base;

  uint8_t opcode() const { return p_[0]; }
  bool solicited() const { return p_[1] & kSolicitedBit; }
  bool migreq() const { return p_[1] & kMigReqBit; }
  uint8_t pad_count() const { return (p_[1] & kPadCountMask) >> kPadCountShift; }
  uint8_t tver() const { return p_[1] & kTVerMask; }
  uint16_t pkey() const { return LoadBe16(p_ + 2); }
  bool fecn() const { return p_[4] & kFecnBit; }
  bool becn() const { return p_[4] & kBecnBit; }
  uint32_t dest_qpn() const { return LoadBe24(p_ + 5); }
  bool ack_req() const { return p_[8] & kAckReqBit; }
  uint32_t psn() const { return LoadBe24(p_ + 9); }

  void set_opcode(uint8_t v) requires(Base::kMutable) { p_[0] = v; }
  void set_opcode(Opcode v) requires(Base::kMutable) { p_[0] = static_cast<uint8_t>(v); }
  void set_solicited(bool v) requires(Base::kMutable) { SetBit(1, kSolicitedBit, v); }
  void set_migreq(bool v) requires(Base::kMutable) { SetBit(1, kMigReqBit, v); }
  // Keeps the low 2 bits of `v`.
  void set_pad_count(uint8_t v) requires(Base::kMutable) {
    p_[1] =
        static_cast<uint8_t>((p_[1] & ~kPadCountMask) | ((v << kPadCountShift) & kPadCountMask));
  }
  // Keeps the low 4 bits of `v`.
  void set_tver(uint8_t v) requires(Base::kMutable) {
    p_[1] = static_cast<uint8_t>((p_[1] & ~kTVerMask) | (v & kTVerMask));
  }
  void set_pkey(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 2, v); }
  void set_fecn(bool v) requires(Base::kMutable) { SetBit(4, kFecnBit, v); }
  void set_becn(bool v) requires(Base::kMutable) { SetBit(4, kBecnBit, v); }
  // Keeps the low 24 bits of `v`.
  void set_dest_qpn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 5, v & k24BitMask); }
  void set_ack_req(bool v) requires(Base::kMutable) { SetBit(8, kAckReqBit, v); }
  // Keeps the low 24 bits of `v`.
  void set_psn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 9, v & k24BitMask); }

 private:
  void SetBit(size_t byte, uint8_t bit, bool on) requires(Base::kMutable) {
    p_[byte] = static_cast<uint8_t>(on ? (p_[byte] | bit) : (p_[byte] & ~bit));
  }
};

// RDMA Extended Transport Header, 16 bytes: VA(8) R_Key(4) DMA Length(4).
template <typename Byte>
class RethViewT : public HeaderView<Byte, kRethBytes> {
  using Base = HeaderView<Byte, kRethBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint64_t va() const { return LoadBe64(p_); }
  uint32_t rkey() const { return LoadBe32(p_ + 8); }
  uint32_t dma_length() const { return LoadBe32(p_ + 12); }
  void set_va(uint64_t v) requires(Base::kMutable) { StoreBe64(p_, v); }
  void set_rkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 8, v); }
  void set_dma_length(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 12, v); }
};

// The AETH syndrome byte (IBA 9.7.5.1, table 42):
//   bit 7 reserved (0) | bits 6:5 type | bits 4:0 value
// type 00 ACK (value: credit count, 0x1f = invalid), 01 RNR NAK (value: RNR
// timer code), 10 reserved, 11 NAK (value: NAK code).
enum class AethType : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };

enum class NakCode : uint8_t {
  kPsnSequenceError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};

inline constexpr uint8_t kAethTypeShift = 5;
inline constexpr uint8_t kAethTypeMask = 0x60;
inline constexpr uint8_t kAethValueMask = 0x1f;
// The credit count an ACK carries when end-to-end credits are not in use.
inline constexpr uint8_t kAethInvalidCredit = 0x1f;

constexpr uint8_t MakeSyndrome(AethType type, uint8_t value) {
  return static_cast<uint8_t>((static_cast<uint8_t>(type) << kAethTypeShift) |
                              (value & kAethValueMask));
}
// ACK carrying a credit count (IBA 9.7.7.2; 0x1f means "invalid / not used").
constexpr uint8_t AckSyndrome(uint8_t credit = kAethInvalidCredit) {
  return MakeSyndrome(AethType::kAck, credit);
}
// RNR NAK carrying the 5-bit minimum RNR timer code (IBA table 45).
constexpr uint8_t RnrNakSyndrome(uint8_t timer_code) {
  return MakeSyndrome(AethType::kRnrNak, timer_code);
}
constexpr uint8_t NakSyndrome(NakCode code) {
  return MakeSyndrome(AethType::kNak, static_cast<uint8_t>(code));
}
constexpr AethType SyndromeType(uint8_t syndrome) {
  return static_cast<AethType>((syndrome & kAethTypeMask) >> kAethTypeShift);
}
// Credit count, RNR timer code or NAK code, depending on the type.
constexpr uint8_t SyndromeValue(uint8_t syndrome) { return syndrome & kAethValueMask; }

constexpr std::string_view ToString(AethType t) {
  switch (t) {
    case AethType::kAck: return "ACK";
    case AethType::kRnrNak: return "RNR NAK";
    case AethType::kReserved: return "reserved";
    case AethType::kNak: return "NAK";
  }
  return "?";
}

// Names of NAK codes 0-4; other values are reserved.
constexpr std::string_view ToString(NakCode c) {
  switch (c) {
    case NakCode::kPsnSequenceError: return "PSN sequence error";
    case NakCode::kInvalidRequest: return "invalid request";
    case NakCode::kRemoteAccessError: return "remote access error";
    case NakCode::kRemoteOperationalError: return "remote operational error";
    case NakCode::kInvalidRdRequest: return "invalid RD request";
  }
  return "reserved NAK code";
}

// ACK Extended Transport Header, 4 bytes: Syndrome(1) MSN(3).
template <typename Byte>
class AethViewT : public HeaderView<Byte, kAethBytes> {
  using Base = HeaderView<Byte, kAethBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint8_t syndrome() const { return p_[0]; }
  uint32_t msn() const { return LoadBe24(p_ + 1); }
  AethType type() const { return SyndromeType(syndrome()); }
  // Credit count, RNR timer code or NAK code, depending on type().
  uint8_t value() const { return SyndromeValue(syndrome()); }
  void set_syndrome(uint8_t v) requires(Base::kMutable) { p_[0] = v; }
  // Keeps the low 24 bits of `v`.
  void set_msn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 1, v & k24BitMask); }
};

// Atomic Extended Transport Header, 28 bytes:
//   VA(8) R_Key(4) Swap or Add Data(8) Compare Data(8).
template <typename Byte>
class AtomicEthViewT : public HeaderView<Byte, kAtomicEthBytes> {
  using Base = HeaderView<Byte, kAtomicEthBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint64_t va() const { return LoadBe64(p_); }
  uint32_t rkey() const { return LoadBe32(p_ + 8); }
  uint64_t swap_add() const { return LoadBe64(p_ + 12); }
  uint64_t compare() const { return LoadBe64(p_ + 20); }
  void set_va(uint64_t v) requires(Base::kMutable) { StoreBe64(p_, v); }
  void set_rkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 8, v); }
  void set_swap_add(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 12, v); }
  void set_compare(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 20, v); }
};

// Atomic Acknowledge Extended Transport Header, 8 bytes: Original Remote Data.
template <typename Byte>
class AtomicAckEthViewT : public HeaderView<Byte, kAtomicAckEthBytes> {
  using Base = HeaderView<Byte, kAtomicAckEthBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint64_t orig_data() const { return LoadBe64(p_); }
  void set_orig_data(uint64_t v) requires(Base::kMutable) { StoreBe64(p_, v); }
};

// Datagram Extended Transport Header, 8 bytes: Q_Key(4) reserved(1) SrcQP(3).
template <typename Byte>
class DethViewT : public HeaderView<Byte, kDethBytes> {
  using Base = HeaderView<Byte, kDethBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint32_t qkey() const { return LoadBe32(p_); }
  uint32_t src_qpn() const { return LoadBe24(p_ + 5); }
  void set_qkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  // Keeps the low 24 bits of `v`; the reserved byte is written as 0.
  void set_src_qpn(uint32_t v) requires(Base::kMutable) {
    p_[4] = 0;
    StoreBe24(p_ + 5, v & k24BitMask);
  }
};

// Immediate Data Extended Transport Header, 4 bytes. imm() is the 32-bit
// value in host order; verbs' `imm_data` is the same value in network order
// (htonl(imm())).
template <typename Byte>
class ImmDtViewT : public HeaderView<Byte, kImmDtBytes> {
  using Base = HeaderView<Byte, kImmDtBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint32_t imm() const { return LoadBe32(p_); }
  void set_imm(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
};

// Invalidate Extended Transport Header, 4 bytes: the R_Key to invalidate.
template <typename Byte>
class IethViewT : public HeaderView<Byte, kIethBytes> {
  using Base = HeaderView<Byte, kIethBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint32_t rkey() const { return LoadBe32(p_); }
  void set_rkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
};

// FLUSH Extended Transport Header, 4 bytes (IBA Memory Placement
// Extensions): bits 3-0 the placement type, bits 5-4 the selectivity level,
// the rest reserved (sent as zero, ignored on receipt).
template <typename Byte>
class FethViewT : public HeaderView<Byte, kFethBytes> {
  using Base = HeaderView<Byte, kFethBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint8_t placement_type() const { return static_cast<uint8_t>(LoadBe32(p_) & 0xf); }
  uint8_t selectivity_level() const { return static_cast<uint8_t>((LoadBe32(p_) >> 4) & 0x3); }
  // Writes the whole word, the reserved bits zero.
  void set(uint8_t placement_type, uint8_t selectivity_level) requires(Base::kMutable) {
    StoreBe32(p_, (placement_type & 0xfu) | ((selectivity_level & 0x3u) << 4));
  }
};

// XRC Extended Transport Header, 4 bytes: reserved(1) XRCSRQ(3), the number
// of the XRC SRQ at the responder that receives the message.
template <typename Byte>
class XrcethViewT : public HeaderView<Byte, kXrcethBytes> {
  using Base = HeaderView<Byte, kXrcethBytes>;
  using Base::p_;

 public:
  using Base::Base;
  uint32_t srqn() const { return LoadBe24(p_ + 1); }
  // Keeps the low 24 bits of `v`; the reserved byte is written as 0.
  void set_srqn(uint32_t v) requires(Base::kMutable) {
    p_[0] = 0;
    StoreBe24(p_ + 1, v & k24BitMask);
  }
};

using BthView = BthViewT<uint8_t>;
using ConstBthView = BthViewT<const uint8_t>;
using RethView = RethViewT<uint8_t>;
using ConstRethView = RethViewT<const uint8_t>;
using FethView = FethViewT<uint8_t>;
using ConstFethView = FethViewT<const uint8_t>;
using AethView = AethViewT<uint8_t>;
using ConstAethView = AethViewT<const uint8_t>;
using AtomicEthView = AtomicEthViewT<uint8_t>;
using ConstAtomicEthView = AtomicEthViewT<const uint8_t>;
using AtomicAckEthView = AtomicAckEthViewT<uint8_t>;
using ConstAtomicAckEthView = AtomicAckEthViewT<const uint8_t>;
using DethView = DethViewT<uint8_t>;
using ConstDethView = DethViewT<const uint8_t>;
using ImmDtView = ImmDtViewT<uint8_t>;
using ConstImmDtView = ImmDtViewT<const uint8_t>;
using IethView = IethViewT<uint8_t>;
using ConstIethView = IethViewT<const uint8_t>;
using XrcethView = XrcethViewT<uint8_t>;
using ConstXrcethView = XrcethViewT<const uint8_t>;

}  // namespace rdmaemu::wire
