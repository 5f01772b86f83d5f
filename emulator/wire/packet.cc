#include "emulator/wire/packet.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emulator/base/endian.h"
#include "emulator/base/log.h"

namespace rdmaemu::wire {
namespace {

static_assert(kMaxPacketBytes ==
              InfoOf(Opcode::XRC_COMPARE_SWAP).length + kMaxPayloadBytes + kIcrcBytes);

std::string Describe(const OpcodeInfo& info, size_t size) {
  return std::string(info.name) + " packet of " + std::to_string(size) + " bytes";
}

Status Malformed(std::string message) { return Status::Error(EBADMSG, std::move(message)); }

// The bits of an extension header's mask, for messages.
std::string_view ExtHeaderName(ExtHeader h) {
  switch (h) {
    case ExtHeader::kDeth: return "DETH";
    case ExtHeader::kXrceth: return "XRCETH";
    case ExtHeader::kFeth: return "FETH";
    case ExtHeader::kReth: return "RETH";
    case ExtHeader::kAtomicEth: return "AtomicETH";
    case ExtHeader::kAeth: return "AETH";
    case ExtHeader::kAtomicAckEth: return "AtomicAckETH";
    case ExtHeader::kImmDt: return "ImmDt";
    case ExtHeader::kIeth: return "IETH";
  }
  return "?";
}

}  // namespace

uint32_t PacketView::icrc() const { return LoadLe32(bytes_.data() + bytes_.size() - kIcrcBytes); }

std::span<const uint8_t> PacketView::Ext(ExtHeader h) const {
  if (!info_->Has(MaskOf(h))) {
    // A bug in the caller, not something a peer can cause: the parser has
    // already matched the headers to the opcode.
    Log().critical("wire: asked a {} for its {}, which it does not have", info_->name,
                   ExtHeaderName(h));
    std::abort();
  }
  return bytes_.subspan(info_->OffsetOf(h));
}

Result<PacketView> ParsePacket(std::span<const uint8_t> udp_payload) {
  const size_t size = udp_payload.size();
  if (size < kBthBytes + kIcrcBytes) {
    return Malformed("packet of " + std::to_string(size) + " bytes is shorter than BTH + ICRC (" +
                     std::to_string(kBthBytes + kIcrcBytes) + ")");
  }
  const ConstBthView bth(udp_payload);
  const OpcodeInfo* info = FindOpcode(bth.opcode());
  if (info == nullptr) {
    return NotSupported(OpcodeName(bth.opcode()) +
                        " is not an RC, UC, UD or XRC opcode this device speaks");
  }
  if (bth.tver() != 0) {
    return Status::Error(EPROTONOSUPPORT, Describe(*info, size) + " has transport version " +
                                              std::to_string(bth.tver()) + ", not 0");
  }
  // Every header, the payload plus its pad, and the ICRC are multiples of 4.
  if (size % 4 != 0) {
    return Malformed(Describe(*info, size) + ": length is not a multiple of 4");
  }
  const size_t pad = bth.pad_count();
  if (pad != 0 && !(info->Has(kPayloadMask) && info->Has(kLastMask))) {
    return Malformed(Describe(*info, size) + " has pad count " + std::to_string(pad) +
                     (info->Has(kPayloadMask) ? ", but only the last packet of a message is padded"
                                              : ", but this opcode carries no payload"));
  }
  const size_t overhead = info->length + pad + kIcrcBytes;
  if (size < overhead) {
    return Malformed(Describe(*info, size) + " is shorter than its headers (" +
                     std::to_string(info->length) + ") + pad (" + std::to_string(pad) +
                     ") + ICRC (4)");
  }
  const size_t payload_bytes = size - overhead;
  if (payload_bytes != 0 && !info->Has(kPayloadMask)) {
    return Malformed(Describe(*info, size) + " carries " + std::to_string(payload_bytes) +
                     " bytes after its headers; this opcode carries no payload");
  }
  if (payload_bytes > kMaxPayloadBytes) {
    return Malformed(Describe(*info, size) + " carries " + std::to_string(payload_bytes) +
                     " bytes of payload, more than the largest MTU (4096)");
  }
  return PacketView(info, udp_payload, udp_payload.subspan(info->length, payload_bytes));
}

size_t PacketLength(Opcode opcode, size_t payload_bytes) {
  const size_t padded = (payload_bytes + 3) & ~size_t{3};
  return InfoOf(opcode).length + padded + kIcrcBytes;
}

namespace {

Status CheckFields(const OpcodeInfo& info, const PacketFields& f, size_t payload_bytes) {
  const std::string name(info.name);
  if (payload_bytes != 0 && !info.Has(kPayloadMask)) {
    return InvalidArgument(name + " carries no payload, but " + std::to_string(payload_bytes) +
                           " bytes were given");
  }
  if (payload_bytes > kMaxPayloadBytes) {
    return InvalidArgument(name + ": payload of " + std::to_string(payload_bytes) +
                           " bytes exceeds the largest MTU (4096)");
  }
  if (payload_bytes % 4 != 0 && !info.Has(kLastMask)) {
    return InvalidArgument(name + ": payload of " + std::to_string(payload_bytes) +
                           " bytes is not a multiple of 4; only the last packet of a message "
                           "may be padded");
  }
  if (f.bth.dest_qpn > k24BitMask) {
    return InvalidArgument(name + ": destination QPN " + std::to_string(f.bth.dest_qpn) +
                           " does not fit in 24 bits");
  }
  if (f.bth.psn > k24BitMask) {
    return InvalidArgument(name + ": PSN " + std::to_string(f.bth.psn) +
                           " does not fit in 24 bits");
  }
  if (info.Has(kAethMask) && f.aeth.msn > k24BitMask) {
    return InvalidArgument(name + ": MSN " + std::to_string(f.aeth.msn) +
                           " does not fit in 24 bits");
  }
  if (info.Has(kXrcethMask) && f.xrc_srqn > k24BitMask) {
    return InvalidArgument(name + ": XRC SRQ number " + std::to_string(f.xrc_srqn) +
                           " does not fit in 24 bits");
  }
  if (info.Has(kDethMask) && f.deth.src_qpn > k24BitMask) {
    return InvalidArgument(name + ": source QPN " + std::to_string(f.deth.src_qpn) +
                           " does not fit in 24 bits");
  }
  return Status::Ok();
}

// The opcode's row, and the payload's length, once both are checked.
Result<const OpcodeInfo*> Check(const PacketFields& f, Gather payload, size_t* payload_bytes) {
  const OpcodeInfo* info = FindOpcode(static_cast<uint8_t>(f.opcode));
  if (info == nullptr) {
    return InvalidArgument("cannot build " + OpcodeName(static_cast<uint8_t>(f.opcode)) +
                           ": not an opcode this device speaks");
  }
  *payload_bytes = 0;
  for (const auto& piece : payload) *payload_bytes += piece.size();
  if (Status s = CheckFields(*info, f, *payload_bytes); !s.ok()) return s;
  return info;
}

Status NoRoom(const OpcodeInfo& info, size_t payload_bytes, size_t need, size_t have) {
  return Status::Error(ENOBUFS, std::string(info.name) + " with " + std::to_string(payload_bytes) +
                                    " bytes of payload needs " + std::to_string(need) +
                                    " bytes; the buffer has " + std::to_string(have));
}

// Writes the BTH and the extension headers (info->length bytes) of a
// checked packet with `pad` bytes of pad.
void WriteHeaders(const OpcodeInfo* info, const PacketFields& f, size_t pad, std::span<uint8_t> out) {
  BthView bth(out);
  bth.set_opcode(f.opcode);
  bth.set_solicited(f.bth.solicited);
  bth.set_migreq(f.bth.migreq);
  bth.set_pad_count(static_cast<uint8_t>(pad));
  bth.set_tver(0);
  bth.set_pkey(f.bth.pkey);
  out[4] = 0;  // FECN, BECN, resv6
  bth.set_fecn(f.bth.fecn);
  bth.set_becn(f.bth.becn);
  bth.set_dest_qpn(f.bth.dest_qpn);
  out[8] = 0;  // AckReq, resv7
  bth.set_ack_req(f.bth.ack_req);
  bth.set_psn(f.bth.psn);

  auto at = [&](ExtHeader h) { return out.subspan(info->OffsetOf(h)); };
  if (info->Has(kDethMask)) {
    DethView deth(at(ExtHeader::kDeth));
    deth.set_qkey(f.deth.qkey);
    deth.set_src_qpn(f.deth.src_qpn);
  }
  if (info->Has(kXrcethMask)) XrcethView(at(ExtHeader::kXrceth)).set_srqn(f.xrc_srqn);
  if (info->Has(kFethMask)) FethView(at(ExtHeader::kFeth)).set(f.feth.placement_type, f.feth.selectivity_level);
  if (info->Has(kRethMask)) {
    RethView reth(at(ExtHeader::kReth));
    reth.set_va(f.reth.va);
    reth.set_rkey(f.reth.rkey);
    reth.set_dma_length(f.reth.dma_length);
  }
  if (info->Has(kAtomicEthMask)) {
    AtomicEthView atomic(at(ExtHeader::kAtomicEth));
    atomic.set_va(f.atomic_eth.va);
    atomic.set_rkey(f.atomic_eth.rkey);
    atomic.set_swap_add(f.atomic_eth.swap_add);
    atomic.set_compare(f.atomic_eth.compare);
  }
  if (info->Has(kAethMask)) {
    AethView aeth(at(ExtHeader::kAeth));
    aeth.set_syndrome(f.aeth.syndrome);
    aeth.set_msn(f.aeth.msn);
  }
  if (info->Has(kAtomicAckEthMask)) {
    AtomicAckEthView(at(ExtHeader::kAtomicAckEth)).set_orig_data(f.atomic_ack_orig_data);
  }
  if (info->Has(kImmDtMask)) ImmDtView(at(ExtHeader::kImmDt)).set_imm(f.imm);
  if (info->Has(kIethMask)) IethView(at(ExtHeader::kIeth)).set_rkey(f.invalidate_rkey);
}

// Writes everything but the ICRC; returns the packet length including it.
Result<size_t> WriteBody(const PacketFields& f, Gather payload, std::span<uint8_t> out) {
  size_t payload_bytes;
  auto info = Check(f, payload, &payload_bytes);
  if (!info.ok()) return info.status();
  const size_t length = PacketLength(f.opcode, payload_bytes);
  if (out.size() < length) return NoRoom(**info, payload_bytes, length, out.size());
  const size_t pad = length - (*info)->length - payload_bytes - kIcrcBytes;
  WriteHeaders(*info, f, pad, out);

  uint8_t* p = out.data() + (*info)->length;
  for (const auto& piece : payload) {
    if (!piece.empty()) std::memcpy(p, piece.data(), piece.size());
    p += piece.size();
  }
  std::memset(p, 0, pad + kIcrcBytes);
  return length;
}

}  // namespace

Result<size_t> BuildPacket(const PacketFields& fields, Gather payload, std::span<uint8_t> out,
                           const IcrcAddressing* addr) {
  Result<size_t> length = WriteBody(fields, payload, out);
  if (length.ok() && addr != nullptr) WriteIcrc(*addr, out.first(*length));
  return length;
}

Result<GatheredPacket> BuildGatheredPacket(const PacketFields& fields, Gather payload,
                                           std::span<uint8_t> headers,
                                           std::span<uint8_t, kMaxTrailerBytes> trailer,
                                           const IcrcAddressing& addr) {
  size_t payload_bytes;
  auto info = Check(fields, payload, &payload_bytes);
  if (!info.ok()) return info.status();
  const size_t header_bytes = (*info)->length;
  if (headers.size() < header_bytes) {
    return Status::Error(ENOBUFS, std::string((*info)->name) + " has " + std::to_string(header_bytes) +
                                      " bytes of headers; the buffer has " + std::to_string(headers.size()));
  }
  GatheredPacket g;
  g.length = PacketLength(fields.opcode, payload_bytes);
  g.header_bytes = header_bytes;
  g.trailer_bytes = g.length - header_bytes - payload_bytes;  // pad and ICRC
  const size_t pad = g.trailer_bytes - kIcrcBytes;
  WriteHeaders(*info, fields, pad, headers);
  std::memset(trailer.data(), 0, pad);

  // The ICRC covers the headers, the payload where it lies, and the pad.
  std::array<std::span<const uint8_t>, kMaxGatherPieces + 2> pieces;
  size_t n = 0;
  pieces[n++] = headers.first(header_bytes);
  for (const auto& piece : payload) {
    if (piece.empty()) continue;
    if (n == pieces.size() - 1) {
      return InvalidArgument("a packet gathered from more than " + std::to_string(kMaxGatherPieces) +
                             " pieces");
    }
    pieces[n++] = piece;
  }
  if (pad != 0) pieces[n++] = trailer.first(pad);
  StoreLe32(trailer.data() + pad, ComputeIcrc(addr, std::span(pieces.data(), n)));
  return g;
}

Result<size_t> BuildPacket(const PacketFields& fields, Gather payload, std::span<uint8_t> out,
                           const IcrcAddressing6& addr) {
  Result<size_t> length = WriteBody(fields, payload, out);
  if (length.ok()) WriteIcrc(addr, out.first(*length));
  return length;
}

}  // namespace rdmaemu::wire
