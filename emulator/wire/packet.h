// Whole RoCEv2 packets: checked parsing and building.
//
// A packet here is a UDP payload: BTH, the extension headers its opcode
// requires (in IBA order), payload, 0-3 pad bytes, and the 4-byte ICRC.
//
// ParsePacket() checks everything that makes the bytes safe to interpret
// (lengths, opcode, version, pad); it does not check the ICRC, which needs
// the addressing only the receiver knows (CheckIcrc in icrc.h), nor anything
// that needs QP state (PSN, keys, QPN, P_Key, MTU): that is the transport's.
//
// BuildPacket() writes a packet into a caller's buffer from field values and
// a gather list of payload pieces, the way a requester gathers a WQE's SGEs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "emulator/base/status.h"
#include "emulator/wire/headers.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/opcode.h"

namespace rdmaemu::wire {

// The largest packet: the longest header (XRC atomic requests, 44 bytes), a
// full 4096-byte payload, and the ICRC (a 4096-byte payload needs no pad).
inline constexpr size_t kMaxPacketBytes = 44 + kMaxPayloadBytes + kIcrcBytes;
// The destination QPN of every multicast packet (IBA 10.5.2.1): the
// receivers are the QPs attached to the group its destination names.
inline constexpr uint32_t kMulticastQpn = 0xFFFFFF;

// A parsed packet. Views point into the caller's buffer, which must outlive it.
class PacketView {
 public:
  const OpcodeInfo& info() const { return *info_; }
  Opcode opcode() const { return info_->opcode; }
  bool Has(uint32_t bits) const { return info_->Has(bits); }

  // The whole packet, ICRC included.
  std::span<const uint8_t> bytes() const { return bytes_; }
  // Bytes the ICRC covers: all but the trailer.
  std::span<const uint8_t> without_icrc() const { return bytes_.first(bytes_.size() - kIcrcBytes); }
  std::span<const uint8_t> payload() const { return payload_; }
  uint8_t pad_count() const { return bth().pad_count(); }
  // The ICRC trailer as stored (little-endian on the wire).
  uint32_t icrc() const;

  ConstBthView bth() const { return ConstBthView(bytes_); }
  uint32_t psn() const { return bth().psn(); }
  uint32_t dest_qpn() const { return bth().dest_qpn(); }

  // Each extension header; calling one the opcode lacks is a programming
  // error and aborts (ask Has(kRethMask) etc. first).
  ConstRethView reth() const { return ConstRethView(Ext(ExtHeader::kReth)); }
  ConstFethView feth() const { return ConstFethView(Ext(ExtHeader::kFeth)); }
  ConstAethView aeth() const { return ConstAethView(Ext(ExtHeader::kAeth)); }
  ConstAtomicEthView atomic_eth() const { return ConstAtomicEthView(Ext(ExtHeader::kAtomicEth)); }
  ConstAtomicAckEthView atomic_ack_eth() const {
    return ConstAtomicAckEthView(Ext(ExtHeader::kAtomicAckEth));
  }
  ConstDethView deth() const { return ConstDethView(Ext(ExtHeader::kDeth)); }
  ConstImmDtView imm_dt() const { return ConstImmDtView(Ext(ExtHeader::kImmDt)); }
  ConstIethView ieth() const { return ConstIethView(Ext(ExtHeader::kIeth)); }
  ConstXrcethView xrceth() const { return ConstXrcethView(Ext(ExtHeader::kXrceth)); }

 private:
  friend Result<PacketView> ParsePacket(std::span<const uint8_t> udp_payload);
  PacketView(const OpcodeInfo* info, std::span<const uint8_t> bytes,
             std::span<const uint8_t> payload)
      : info_(info), bytes_(bytes), payload_(payload) {}

  std::span<const uint8_t> Ext(ExtHeader h) const;

  const OpcodeInfo* info_;
  std::span<const uint8_t> bytes_;
  std::span<const uint8_t> payload_;
};

// Checks and describes one received UDP payload. Errors (never a crash, for
// any input) name what was wrong:
//   EBADMSG           too short, length not a multiple of 4, length does not
//                     fit the opcode's headers, pad where none may be, payload
//                     larger than 4096 bytes
//   EOPNOTSUPP        an opcode this device does not speak (RD, CNP, ...)
//   EPROTONOSUPPORT   a transport header version other than 0
Result<PacketView> ParsePacket(std::span<const uint8_t> udp_payload);

// Field values for BuildPacket(). Only the headers the opcode requires are
// written; the rest is ignored. 24-bit fields must fit in 24 bits.
struct PacketFields {
  Opcode opcode = Opcode::RC_SEND_ONLY;

  struct Bth {
    bool solicited = false;
    bool migreq = false;
    uint16_t pkey = kDefaultPkey;
    bool fecn = false;
    bool becn = false;
    uint32_t dest_qpn = 0;
    bool ack_req = false;
    uint32_t psn = 0;
  } bth;

  struct Feth {
    uint8_t placement_type = 0;     // IBV_FLUSH_GLOBAL (1) | IBV_FLUSH_PERSISTENT (2)
    uint8_t selectivity_level = 0;  // IBV_FLUSH_RANGE (0) or IBV_FLUSH_MR (1)
  } feth;
  struct Reth {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t dma_length = 0;
  } reth;

  struct Aeth {
    uint8_t syndrome = AckSyndrome();
    uint32_t msn = 0;
  } aeth;

  struct AtomicEth {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint64_t swap_add = 0;
    uint64_t compare = 0;
  } atomic_eth;

  uint64_t atomic_ack_orig_data = 0;

  struct Deth {
    uint32_t qkey = 0;
    uint32_t src_qpn = 0;
  } deth;

  uint32_t imm = 0;              // ImmDt, host order
  uint32_t invalidate_rkey = 0;  // IETH
  uint32_t xrc_srqn = 0;         // XRCETH
};

// Payload gathered from several pieces, written back to back.
using Gather = std::span<const std::span<const uint8_t>>;

// Bytes BuildPacket() needs for `opcode` with `payload_bytes` of payload.
size_t PacketLength(Opcode opcode, size_t payload_bytes);

// Writes the packet into `out` and returns its length. With `addr` the ICRC
// is computed; without, the trailer is zeroed for the caller to fill with
// WriteIcrc() once it knows the addressing.
//   EINVAL    opcode not spoken; payload on an opcode that carries none;
//             payload over 4096 bytes; a FIRST or MIDDLE packet whose payload
//             is not a multiple of 4 (those carry a whole path MTU, no pad);
//             a 24-bit field out of range
//   ENOBUFS   `out` is smaller than PacketLength()
Result<size_t> BuildPacket(const PacketFields& fields, Gather payload, std::span<uint8_t> out,
                           const IcrcAddressing* addr = nullptr);
Result<size_t> BuildPacket(const PacketFields& fields, Gather payload, std::span<uint8_t> out,
                           const IcrcAddressing6& addr);

// A packet sent gathered from where its parts lie, so that its payload is
// not copied to be sent: `headers`, the payload's pieces as they are, then
// `trailer` (the pad and the ICRC).
struct GatheredPacket {
  size_t header_bytes = 0;   // written to the front of `headers`
  size_t trailer_bytes = 0;  // written to the front of `trailer`
  size_t length = 0;         // the whole packet, as PacketLength()
};
inline constexpr size_t kMaxTrailerBytes = 3 + kIcrcBytes;
// At most this many non-empty payload pieces (a WQE's SGEs split at MR
// boundaries stay far below it).
inline constexpr size_t kMaxGatherPieces = 64;

// Writes the headers and the trailer with the ICRC computed over the
// pieces. Fails as BuildPacket does, and with EINVAL beyond
// kMaxGatherPieces pieces.
Result<GatheredPacket> BuildGatheredPacket(const PacketFields& fields, Gather payload,
                                           std::span<uint8_t> headers,
                                           std::span<uint8_t, kMaxTrailerBytes> trailer,
                                           const IcrcAddressing& addr);

// Single-piece convenience.
inline Result<size_t> BuildPacket(const PacketFields& fields, std::span<const uint8_t> payload,
                                  std::span<uint8_t> out, const IcrcAddressing* addr = nullptr) {
  return BuildPacket(fields, Gather(&payload, 1), out, addr);
}

}  // namespace rdmaemu::wire
