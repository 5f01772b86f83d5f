// The IB CM's messages on the wire: MADs on QP1 (IBA 12.6, 13.4).
//
// Every CM message is one 256-byte MAD: the 24-byte common MAD header
// (IBA 13.4.3) and 232 bytes of message (IBA tables 106-120). They travel in
// UD SEND_ONLY packets to QP1 with the GSI Q_Key, over RoCE v2 as over
// InfiniBand. The layouts and bit positions are those of the kernel's
// include/rdma/ibta_vol1_c12.h and Wireshark's CM dissector, which this
// module is tested against (tests/emulator/cm:mad_tshark_test).
//
// As in emulator/wire/headers.h, a view holds a span and every getter and
// setter goes through LoadBe*/StoreBe*, never a packed struct, so the byte
// order and the bit positions are visible at every call site. Each view comes
// in two flavours, `ReqView` over `std::span<uint8_t>` (get and set) and
// `ConstReqView` over `std::span<const uint8_t>` (get only). A message view
// starts at the message, kMadHeaderBytes into the MAD (MessageBytes()), and
// must be given at least kMessageBytes; that is the caller's invariant
// (CheckMad() first), asserted.
//
// Offsets in the comments are bytes from the start of the message, as in the
// IBA's tables; `43.5` is bit 5 of byte 43 counted from the byte's most
// significant bit, the IBA's Byte[Bit] notation. Setters of narrow fields
// keep only the field's bits of their argument and leave the neighbours'.
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "emulator/base/endian.h"
#include "emulator/base/status.h"

namespace rdmaemu::cm {

// --- MADs on QP1 ---------------------------------------------------------

inline constexpr size_t kMadBytes = 256;
inline constexpr size_t kMadHeaderBytes = 24;
// What follows the header: every CM message fills it, private data last.
inline constexpr size_t kMessageBytes = kMadBytes - kMadHeaderBytes;

inline constexpr uint8_t kBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;
// IBA 1.2's CM; the kernel's IB_CM_CLASS_VERSION.
inline constexpr uint8_t kCmClassVersion = 2;
// Every CM message is a Send: the protocol answers with its own messages,
// never with a GetResp.
inline constexpr uint8_t kMethodSend = 0x03;

// The General Services Interface: QP1, which accepts only this Q_Key
// (IBA 10.2.5; rxe checks it on receive).
inline constexpr uint32_t kGsiQkey = 0x80010000;
inline constexpr uint32_t kGsiQpn = 1;

// The CM's attribute IDs (IBA table 104).
enum class AttributeId : uint16_t {
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  // Alternate path messages: known, but the CM rejects them on RoCE, which
  // has no path migration through the CM (the kernel's cm_lap_handler).
  kLap = 0x0019,
  kApr = 0x001a,
};

// True for the eleven CM attribute IDs above.
constexpr bool IsCmAttribute(uint16_t id) {
  return id >= static_cast<uint16_t>(AttributeId::kReq) &&
         id <= static_cast<uint16_t>(AttributeId::kApr);
}

// The IBA's message names ("REQ", "SIDR_REP", ...), as in trace lines.
constexpr std::string_view ToString(AttributeId id) {
  switch (id) {
    case AttributeId::kReq: return "REQ";
    case AttributeId::kMra: return "MRA";
    case AttributeId::kRej: return "REJ";
    case AttributeId::kRep: return "REP";
    case AttributeId::kRtu: return "RTU";
    case AttributeId::kDreq: return "DREQ";
    case AttributeId::kDrep: return "DREP";
    case AttributeId::kSidrReq: return "SIDR_REQ";
    case AttributeId::kSidrRep: return "SIDR_REP";
    case AttributeId::kLap: return "LAP";
    case AttributeId::kApr: return "APR";
  }
  return "?";
}

// Private data each message carries, after its fixed fields.
inline constexpr size_t kReqPrivateDataBytes = 92;
inline constexpr size_t kMraPrivateDataBytes = 222;
inline constexpr size_t kRejPrivateDataBytes = 148;
inline constexpr size_t kRepPrivateDataBytes = 196;
inline constexpr size_t kRtuPrivateDataBytes = 224;
inline constexpr size_t kDreqPrivateDataBytes = 220;
inline constexpr size_t kDrepPrivateDataBytes = 224;
inline constexpr size_t kSidrReqPrivateDataBytes = 216;
inline constexpr size_t kSidrRepPrivateDataBytes = 136;
// REJ's Additional Rejection Information and SIDR_REP's Additional
// Information.
inline constexpr size_t kAriBytes = 72;

// The RDMA CM's header at the start of REQ and SIDR_REQ private data
// (CmaHeaderView), and what it leaves to the user: librdmacm's
// RDMA_MAX_PRIVATE_DATA less the header, 56 and 180 bytes.
inline constexpr size_t kCmaHeaderBytes = 36;
inline constexpr size_t kReqUserPrivateDataBytes = kReqPrivateDataBytes - kCmaHeaderBytes;
inline constexpr size_t kSidrReqUserPrivateDataBytes = kSidrReqPrivateDataBytes - kCmaHeaderBytes;

// The message inside a MAD.
template <typename Byte>
std::span<Byte> MessageBytes(std::span<Byte> mad) {
  assert(mad.size() >= kMadBytes);
  return mad.subspan(kMadHeaderBytes, kMessageBytes);
}

// --- Service IDs and port spaces ------------------------------------------

// The RDMA CM's port spaces (the kernel's enum rdma_ucm_port_space): the
// middle 16 bits of the service ID of an IP-addressed connection.
enum class PortSpace : uint16_t {
  kIpoib = 0x0002,
  kTcp = 0x0106,
  kUdp = 0x0111,
  kIb = 0x013f,
};

// The service ID the RDMA CM gives a port: 0x0000_0000_PPPP_pppp with the
// port space PPPP and the port pppp (rdma_get_service_id). TCP port 7471 is
// 0x1061d2f. The IBA reserves prefix 0x0000000001 for IP-addressed
// services (annex A11), which is what this gives for TCP and UDP.
constexpr uint64_t MakeServiceId(PortSpace ps, uint16_t port) {
  return (uint64_t{static_cast<uint16_t>(ps)} << 16) | port;
}
// The port space and port back from a service ID, as the passive side
// finds its listener. Any upper bits are ignored here; a listener matches
// the whole ID.
constexpr uint16_t ServiceIdPortSpace(uint64_t sid) { return static_cast<uint16_t>(sid >> 16); }
constexpr uint16_t ServiceIdPort(uint64_t sid) { return static_cast<uint16_t>(sid); }

// --- Field values ---------------------------------------------------------

// Why a REJ rejects (IBA table 109; the kernel's enum ib_cm_rej_reason).
enum class RejReason : uint16_t {
  kNoQp = 1,
  kNoEec = 2,
  kNoResources = 3,
  kTimeout = 4,
  kUnsupported = 5,
  kInvalidCommId = 6,
  kInvalidCommInstance = 7,
  kInvalidServiceId = 8,
  kInvalidTransportType = 9,
  kStaleConn = 10,
  kRdcNotExist = 11,
  kInvalidGid = 12,
  kInvalidLid = 13,
  kInvalidSl = 14,
  kInvalidTrafficClass = 15,
  kInvalidHopLimit = 16,
  kInvalidPacketRate = 17,
  kInvalidAltGid = 18,
  kInvalidAltLid = 19,
  kInvalidAltSl = 20,
  kInvalidAltTrafficClass = 21,
  kInvalidAltHopLimit = 22,
  kInvalidAltPacketRate = 23,
  kPortCmRedirect = 24,
  kPortRedirect = 25,
  kInvalidMtu = 26,
  kInsufficientRespResources = 27,
  kConsumerDefined = 28,
  kInvalidRnrRetry = 29,
  kDuplicateLocalCommId = 30,
  kInvalidClassVersion = 31,
  kInvalidFlowLabel = 32,
  kInvalidAltFlowLabel = 33,
  // 34 is unassigned.
  kVendorOptionNotSupported = 35,
};

// Lower-case names, as the kernel's ibcm_reject_msg gives them; "unknown
// reason" for any other value.
std::string_view ToString(RejReason r);

// SIDR_REP's Status (IBA table 121).
enum class SidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  // no listener on the service ID
  kReject = 2,
  kNoQp = 3,
  kRedirect = 4,
  kUnsupportedVersion = 5,
};

std::string_view ToString(SidrStatus s);

// Which message a REJ rejects or an MRA acknowledges.
enum class MessageKind : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

// REQ's Transport Service Type; XRC is 3 with Extended Transport Type 1.
enum class TransportServiceType : uint8_t { kRc = 0, kUc = 1, kRd = 2, kXrc = 3 };

// A port GID as it travels: 16 bytes in network order.
using Gid = std::array<uint8_t, 16>;

// --- Views ----------------------------------------------------------------

// Base of every view: the bytes, whether setters exist, and the accessors
// for fields narrower than a byte, in the IBA's Byte[Bit] terms.
template <typename Byte, size_t kSize>
class FieldView {
 public:
  static constexpr size_t kBytes = kSize;
  static constexpr bool kMutable = !std::is_const_v<Byte>;

  explicit FieldView(std::span<Byte> bytes) : p_(bytes.data()) { assert(bytes.size() >= kSize); }
  std::span<Byte, kSize> bytes() const { return std::span<Byte, kSize>(p_, kSize); }

 protected:
  // `width` bits of byte `byte` from bit `bit`, counted from the MSB.
  static constexpr uint8_t BitMask(int bit, int width) {
    return static_cast<uint8_t>(((1u << width) - 1) << (8 - bit - width));
  }
  uint8_t Bits(size_t byte, int bit, int width) const {
    return static_cast<uint8_t>((p_[byte] & BitMask(bit, width)) >> (8 - bit - width));
  }
  void SetBits(size_t byte, int bit, int width, uint8_t v) requires(kMutable) {
    const uint8_t mask = BitMask(bit, width);
    p_[byte] = static_cast<uint8_t>((p_[byte] & ~mask) | ((v << (8 - bit - width)) & mask));
  }
  Gid LoadGid(size_t off) const {
    Gid g;
    for (size_t i = 0; i < g.size(); ++i) g[i] = p_[off + i];
    return g;
  }
  void StoreGid(size_t off, const Gid& g) requires(kMutable) {
    for (size_t i = 0; i < g.size(); ++i) p_[off + i] = g[i];
  }
  template <size_t kLen>
  std::span<Byte, kLen> Bytes(size_t off) const {
    return std::span<Byte, kLen>(p_ + off, kLen);
  }

  Byte* p_;
};

// A 24-bit field (QPN, EECN, PSN) keeps only these bits.
inline constexpr uint32_t k24BitMask = 0x00ffffff;
// The 20-bit IPv6-style flow label.
inline constexpr uint32_t kFlowLabelMask = 0x000fffff;

// The common MAD header, 24 bytes (IBA 13.4.3):
//   0: BaseVersion | 1: MgmtClass | 2: ClassVersion | 3: R(7) Method(6:0)
//   4-5: Status | 6-7: ClassSpecific | 8-15: TransactionID
//   16-17: AttributeID | 18-19: reserved | 20-23: AttributeModifier
// The CM's transaction ID is the sender's; the answers to a message (REP,
// RTU, REJ, MRA, DREP, SIDR_REP) echo the TID of the message they answer.
template <typename Byte>
class MadHeaderViewT : public FieldView<Byte, kMadHeaderBytes> {
  using Base = FieldView<Byte, kMadHeaderBytes>;
  using Base::p_;

 public:
  using Base::Base;

  uint8_t base_version() const { return p_[0]; }
  uint8_t mgmt_class() const { return p_[1]; }
  uint8_t class_version() const { return p_[2]; }
  // The whole byte: the response bit (7) and the method; CM never sets R.
  uint8_t method() const { return p_[3]; }
  uint16_t status() const { return LoadBe16(p_ + 4); }
  uint16_t class_specific() const { return LoadBe16(p_ + 6); }
  uint64_t transaction_id() const { return LoadBe64(p_ + 8); }
  uint16_t attribute_id() const { return LoadBe16(p_ + 16); }
  // The kernel carries ECE options here; 0 otherwise.
  uint32_t attribute_modifier() const { return LoadBe32(p_ + 20); }

  void set_base_version(uint8_t v) requires(Base::kMutable) { p_[0] = v; }
  void set_mgmt_class(uint8_t v) requires(Base::kMutable) { p_[1] = v; }
  void set_class_version(uint8_t v) requires(Base::kMutable) { p_[2] = v; }
  void set_method(uint8_t v) requires(Base::kMutable) { p_[3] = v; }
  void set_status(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 4, v); }
  void set_class_specific(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 6, v); }
  void set_transaction_id(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 8, v); }
  // Also zeroes the reserved 16 bits after it.
  void set_attribute_id(uint16_t v) requires(Base::kMutable) {
    StoreBe16(p_ + 16, v);
    StoreBe16(p_ + 18, 0);
  }
  void set_attribute_id(AttributeId v) requires(Base::kMutable) {
    set_attribute_id(static_cast<uint16_t>(v));
  }
  void set_attribute_modifier(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 20, v); }
};

using MadHeaderView = MadHeaderViewT<uint8_t>;
using ConstMadHeaderView = MadHeaderViewT<const uint8_t>;

// Zeroes the first kMadBytes of `mad` and writes a CM Send header for `id`
// with transaction ID `tid`: the start of every message the CM sends.
void InitMad(std::span<uint8_t> mad, AttributeId id, uint64_t tid);

// The path REQ describes twice, primary and alternate, 44 bytes each (IBA
// table 106, bytes 52-95 and 96-139):
//   0-1: Local Port LID | 2-3: Remote Port LID
//   4-19: Local Port GID | 20-35: Remote Port GID
//   36-38.3: Flow Label (20) | 38.4-39.1: reserved | 39.2: Packet Rate (6)
//   40: Traffic Class | 41: Hop Limit | 42.0: SL (4) | 42.4: Subnet Local
//   42.5: reserved | 43.0: Local ACK Timeout (5) | 43.5: reserved
// (the alternate's 43.5 is REQ's SAP Supported, ReqView::sap_supported).
// On RoCE v2 the GIDs are IPv4-mapped addresses and the LIDs 0 or 0xffff.
template <typename Byte>
class ReqPathViewT : public FieldView<Byte, 44> {
  using Base = FieldView<Byte, 44>;
  using Base::Bits;
  using Base::p_;
  using Base::SetBits;

 public:
  using Base::Base;

  uint16_t local_lid() const { return LoadBe16(p_); }
  uint16_t remote_lid() const { return LoadBe16(p_ + 2); }
  Gid local_gid() const { return Base::LoadGid(4); }
  Gid remote_gid() const { return Base::LoadGid(20); }
  uint32_t flow_label() const { return LoadBe32(p_ + 36) >> 12; }
  // IBA rate enum; 0 is "the port's current rate".
  uint8_t packet_rate() const { return Bits(39, 2, 6); }
  uint8_t traffic_class() const { return p_[40]; }
  uint8_t hop_limit() const { return p_[41]; }
  uint8_t sl() const { return Bits(42, 0, 4); }
  bool subnet_local() const { return Bits(42, 4, 1); }
  // 4.096 us * 2^timeout: how long the QP waits for an ACK.
  uint8_t local_ack_timeout() const { return Bits(43, 0, 5); }

  void set_local_lid(uint16_t v) requires(Base::kMutable) { StoreBe16(p_, v); }
  void set_remote_lid(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 2, v); }
  void set_local_gid(const Gid& v) requires(Base::kMutable) { Base::StoreGid(4, v); }
  void set_remote_gid(const Gid& v) requires(Base::kMutable) { Base::StoreGid(20, v); }
  // Keeps the low 20 bits of `v` and the reserved bits after the field.
  void set_flow_label(uint32_t v) requires(Base::kMutable) {
    StoreBe32(p_ + 36, (LoadBe32(p_ + 36) & 0xfff) | ((v & kFlowLabelMask) << 12));
  }
  void set_packet_rate(uint8_t v) requires(Base::kMutable) { SetBits(39, 2, 6, v); }
  void set_traffic_class(uint8_t v) requires(Base::kMutable) { p_[40] = v; }
  void set_hop_limit(uint8_t v) requires(Base::kMutable) { p_[41] = v; }
  void set_sl(uint8_t v) requires(Base::kMutable) { SetBits(42, 0, 4, v); }
  void set_subnet_local(bool v) requires(Base::kMutable) { SetBits(42, 4, 1, v); }
  void set_local_ack_timeout(uint8_t v) requires(Base::kMutable) { SetBits(43, 0, 5, v); }
};

using ReqPathView = ReqPathViewT<uint8_t>;
using ConstReqPathView = ReqPathViewT<const uint8_t>;

// REQ, Request for Communication (IBA table 106):
//   0-3: Local Comm ID | 4: reserved | 5-7: VendorID (ECE)
//   8-15: ServiceID | 16-23: Local CA GUID | 24-27: reserved
//   28-31: Local Q_Key | 32-34: Local QPN | 35: Responder Resources
//   36-38: Local EECN | 39: Initiator Depth | 40-42: Remote EECN
//   43.0: Remote CM Response Timeout (5) | 43.5: Transport Service Type (2)
//   43.7: End-to-End Flow Control | 44-46: Starting PSN
//   47.0: Local CM Response Timeout (5) | 47.5: Retry Count (3)
//   48-49: Partition Key | 50.0: Path Packet Payload MTU (4)
//   50.4: RDC Exists | 50.5: RNR Retry Count (3) | 51.0: Max CM Retries (4)
//   51.4: SRQ | 51.5: Extended Transport Type (3)
//   52-95: primary path | 96-139: alternate path (139.5: SAP Supported)
//   140-231: PrivateData (92)
// CM response timeouts are 4.096 us * 2^t; the RDMA CM sends 20 (~4 s).
template <typename Byte>
class ReqViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::Bits;
  using Base::p_;
  using Base::SetBits;

 public:
  static constexpr size_t kPrimaryPathOffset = 52;
  // RoCE has no alternate path through the CM: the RDMA CM leaves it zero.
  static constexpr size_t kAlternatePathOffset = 96;
  static constexpr size_t kPrivateDataOffset = 140;

  using Base::Base;

  uint32_t local_comm_id() const { return LoadBe32(p_); }
  uint32_t vendor_id() const { return LoadBe24(p_ + 5); }
  uint64_t service_id() const { return LoadBe64(p_ + 8); }
  uint64_t local_ca_guid() const { return LoadBe64(p_ + 16); }
  uint32_t local_qkey() const { return LoadBe32(p_ + 28); }
  uint32_t local_qpn() const { return LoadBe24(p_ + 32); }
  // RDMA reads and atomics the sender accepts at once as a responder.
  uint8_t responder_resources() const { return p_[35]; }
  uint32_t local_eecn() const { return LoadBe24(p_ + 36); }
  // RDMA reads and atomics the sender issues at once as an initiator.
  uint8_t initiator_depth() const { return p_[39]; }
  uint32_t remote_eecn() const { return LoadBe24(p_ + 40); }
  uint8_t remote_cm_response_timeout() const { return Bits(43, 0, 5); }
  uint8_t transport_service_type() const { return Bits(43, 5, 2); }
  bool end_to_end_flow_control() const { return Bits(43, 7, 1); }
  uint32_t starting_psn() const { return LoadBe24(p_ + 44); }
  uint8_t local_cm_response_timeout() const { return Bits(47, 0, 5); }
  uint8_t retry_count() const { return Bits(47, 5, 3); }
  uint16_t partition_key() const { return LoadBe16(p_ + 48); }
  // IBA MTU enum: 1 = 256 ... 5 = 4096.
  uint8_t path_mtu() const { return Bits(50, 0, 4); }
  bool rdc_exists() const { return Bits(50, 4, 1); }
  uint8_t rnr_retry_count() const { return Bits(50, 5, 3); }
  uint8_t max_cm_retries() const { return Bits(51, 0, 4); }
  bool srq() const { return Bits(51, 4, 1); }
  uint8_t extended_transport_type() const { return Bits(51, 5, 3); }
  ReqPathViewT<Byte> primary_path() const {
    return ReqPathViewT<Byte>(std::span<Byte>(p_ + kPrimaryPathOffset, ReqPathViewT<Byte>::kBytes));
  }
  ReqPathViewT<Byte> alternate_path() const {
    return ReqPathViewT<Byte>(
        std::span<Byte>(p_ + kAlternatePathOffset, ReqPathViewT<Byte>::kBytes));
  }
  bool sap_supported() const { return Bits(139, 5, 1); }
  std::span<Byte, kReqPrivateDataBytes> private_data() const {
    return Base::template Bytes<kReqPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_local_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  // Keeps the low 24 bits of `v`; the reserved byte before it is written 0.
  void set_vendor_id(uint32_t v) requires(Base::kMutable) {
    p_[4] = 0;
    StoreBe24(p_ + 5, v & k24BitMask);
  }
  void set_service_id(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 8, v); }
  void set_local_ca_guid(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 16, v); }
  void set_local_qkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 28, v); }
  void set_local_qpn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 32, v & k24BitMask); }
  void set_responder_resources(uint8_t v) requires(Base::kMutable) { p_[35] = v; }
  void set_local_eecn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 36, v & k24BitMask); }
  void set_initiator_depth(uint8_t v) requires(Base::kMutable) { p_[39] = v; }
  void set_remote_eecn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 40, v & k24BitMask); }
  void set_remote_cm_response_timeout(uint8_t v) requires(Base::kMutable) { SetBits(43, 0, 5, v); }
  void set_transport_service_type(uint8_t v) requires(Base::kMutable) { SetBits(43, 5, 2, v); }
  void set_transport_service_type(TransportServiceType v) requires(Base::kMutable) {
    SetBits(43, 5, 2, static_cast<uint8_t>(v));
  }
  void set_end_to_end_flow_control(bool v) requires(Base::kMutable) { SetBits(43, 7, 1, v); }
  void set_starting_psn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 44, v & k24BitMask); }
  void set_local_cm_response_timeout(uint8_t v) requires(Base::kMutable) { SetBits(47, 0, 5, v); }
  void set_retry_count(uint8_t v) requires(Base::kMutable) { SetBits(47, 5, 3, v); }
  void set_partition_key(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 48, v); }
  void set_path_mtu(uint8_t v) requires(Base::kMutable) { SetBits(50, 0, 4, v); }
  void set_rdc_exists(bool v) requires(Base::kMutable) { SetBits(50, 4, 1, v); }
  void set_rnr_retry_count(uint8_t v) requires(Base::kMutable) { SetBits(50, 5, 3, v); }
  void set_max_cm_retries(uint8_t v) requires(Base::kMutable) { SetBits(51, 0, 4, v); }
  void set_srq(bool v) requires(Base::kMutable) { SetBits(51, 4, 1, v); }
  void set_extended_transport_type(uint8_t v) requires(Base::kMutable) { SetBits(51, 5, 3, v); }
  void set_sap_supported(bool v) requires(Base::kMutable) { SetBits(139, 5, 1, v); }
};

// REP, Reply to Request for Communication (IBA table 110):
//   0-3: Local Comm ID | 4-7: Remote Comm ID | 8-11: Local Q_Key
//   12-14: Local QPN | 15: VendorID[23:16] | 16-18: Local EECN
//   19: VendorID[15:8] | 20-22: Starting PSN | 23: VendorID[7:0]
//   24: Responder Resources | 25: Initiator Depth
//   26.0: Target ACK Delay (5) | 26.5: Failover Accepted (2)
//   26.7: End-to-End Flow Control | 27.0: RNR Retry Count (3) | 27.3: SRQ
//   27.4: reserved | 28-35: Local CA GUID | 36-231: PrivateData (196)
// The ECE vendor ID is spread over the three bytes after the 24-bit fields.
template <typename Byte>
class RepViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::Bits;
  using Base::p_;
  using Base::SetBits;

 public:
  static constexpr size_t kPrivateDataOffset = 36;

  using Base::Base;

  uint32_t local_comm_id() const { return LoadBe32(p_); }
  uint32_t remote_comm_id() const { return LoadBe32(p_ + 4); }
  uint32_t local_qkey() const { return LoadBe32(p_ + 8); }
  uint32_t local_qpn() const { return LoadBe24(p_ + 12); }
  uint32_t vendor_id() const { return (uint32_t{p_[15]} << 16) | (uint32_t{p_[19]} << 8) | p_[23]; }
  // An XRC target carries its QPN here.
  uint32_t local_eecn() const { return LoadBe24(p_ + 16); }
  uint32_t starting_psn() const { return LoadBe24(p_ + 20); }
  uint8_t responder_resources() const { return p_[24]; }
  uint8_t initiator_depth() const { return p_[25]; }
  // The device's local_ca_ack_delay, from which the active side derives
  // its QP's local ACK timeout.
  uint8_t target_ack_delay() const { return Bits(26, 0, 5); }
  uint8_t failover_accepted() const { return Bits(26, 5, 2); }
  bool end_to_end_flow_control() const { return Bits(26, 7, 1); }
  uint8_t rnr_retry_count() const { return Bits(27, 0, 3); }
  bool srq() const { return Bits(27, 3, 1); }
  uint64_t local_ca_guid() const { return LoadBe64(p_ + 28); }
  std::span<Byte, kRepPrivateDataBytes> private_data() const {
    return Base::template Bytes<kRepPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_local_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_remote_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 4, v); }
  void set_local_qkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 8, v); }
  void set_local_qpn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 12, v & k24BitMask); }
  // Keeps the low 24 bits of `v`.
  void set_vendor_id(uint32_t v) requires(Base::kMutable) {
    p_[15] = static_cast<uint8_t>(v >> 16);
    p_[19] = static_cast<uint8_t>(v >> 8);
    p_[23] = static_cast<uint8_t>(v);
  }
  void set_local_eecn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 16, v & k24BitMask); }
  void set_starting_psn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 20, v & k24BitMask); }
  void set_responder_resources(uint8_t v) requires(Base::kMutable) { p_[24] = v; }
  void set_initiator_depth(uint8_t v) requires(Base::kMutable) { p_[25] = v; }
  void set_target_ack_delay(uint8_t v) requires(Base::kMutable) { SetBits(26, 0, 5, v); }
  void set_failover_accepted(uint8_t v) requires(Base::kMutable) { SetBits(26, 5, 2, v); }
  void set_end_to_end_flow_control(bool v) requires(Base::kMutable) { SetBits(26, 7, 1, v); }
  void set_rnr_retry_count(uint8_t v) requires(Base::kMutable) { SetBits(27, 0, 3, v); }
  void set_srq(bool v) requires(Base::kMutable) { SetBits(27, 3, 1, v); }
  void set_local_ca_guid(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 28, v); }
};

// The messages that are two comm IDs and private data: RTU, Ready To Use
// (IBA table 111), and DREP, Reply to Request for Disconnection (table 113):
//   0-3: Local Comm ID | 4-7: Remote Comm ID | 8-231: PrivateData (224)
template <typename Byte>
class CommIdsViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::p_;

 public:
  static constexpr size_t kPrivateDataOffset = 8;
  static constexpr size_t kPrivateDataBytes = 224;

  using Base::Base;

  uint32_t local_comm_id() const { return LoadBe32(p_); }
  uint32_t remote_comm_id() const { return LoadBe32(p_ + 4); }
  std::span<Byte, kPrivateDataBytes> private_data() const {
    return Base::template Bytes<kPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_local_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_remote_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 4, v); }
};
static_assert(kRtuPrivateDataBytes == CommIdsViewT<uint8_t>::kPrivateDataBytes);
static_assert(kDrepPrivateDataBytes == CommIdsViewT<uint8_t>::kPrivateDataBytes);

// REJ, Reject (IBA table 108):
//   0-3: Local Comm ID (0 when rejecting a REQ it never gave an ID)
//   4-7: Remote Comm ID | 8.0: Message REJected (2) | 8.2: reserved
//   9.0: Reject Info Length (7) | 9.7: reserved | 10-11: Reason
//   12-83: Additional Rejection Information (72) | 84-231: PrivateData (148)
template <typename Byte>
class RejViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::Bits;
  using Base::p_;
  using Base::SetBits;

 public:
  static constexpr size_t kAriOffset = 12;
  static constexpr size_t kPrivateDataOffset = 84;

  using Base::Base;

  uint32_t local_comm_id() const { return LoadBe32(p_); }
  uint32_t remote_comm_id() const { return LoadBe32(p_ + 4); }
  // A MessageKind value.
  uint8_t message_rejected() const { return Bits(8, 0, 2); }
  // Bytes of ari() that mean something (e.g. 8, a GUID, for TIMEOUT).
  uint8_t reject_info_length() const { return Bits(9, 0, 7); }
  // A RejReason value; unknown values are kept as they came.
  uint16_t reason() const { return LoadBe16(p_ + 10); }
  std::span<Byte, kAriBytes> ari() const { return Base::template Bytes<kAriBytes>(kAriOffset); }
  std::span<Byte, kRejPrivateDataBytes> private_data() const {
    return Base::template Bytes<kRejPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_local_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_remote_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 4, v); }
  void set_message_rejected(uint8_t v) requires(Base::kMutable) { SetBits(8, 0, 2, v); }
  void set_message_rejected(MessageKind v) requires(Base::kMutable) {
    SetBits(8, 0, 2, static_cast<uint8_t>(v));
  }
  void set_reject_info_length(uint8_t v) requires(Base::kMutable) { SetBits(9, 0, 7, v); }
  void set_reason(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 10, v); }
  void set_reason(RejReason v) requires(Base::kMutable) {
    StoreBe16(p_ + 10, static_cast<uint16_t>(v));
  }
};

// MRA, Message Receipt Acknowledgement (IBA table 107):
//   0-3: Local Comm ID | 4-7: Remote Comm ID | 8.0: Message MRAed (2)
//   8.2: reserved | 9.0: Service Timeout (5) | 9.5: reserved
//   10-231: PrivateData (222)
// The sender asks for 4.096 us * 2^timeout more before the peer retries.
template <typename Byte>
class MraViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::Bits;
  using Base::p_;
  using Base::SetBits;

 public:
  static constexpr size_t kPrivateDataOffset = 10;

  using Base::Base;

  uint32_t local_comm_id() const { return LoadBe32(p_); }
  uint32_t remote_comm_id() const { return LoadBe32(p_ + 4); }
  // A MessageKind value.
  uint8_t message_mraed() const { return Bits(8, 0, 2); }
  uint8_t service_timeout() const { return Bits(9, 0, 5); }
  std::span<Byte, kMraPrivateDataBytes> private_data() const {
    return Base::template Bytes<kMraPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_local_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_remote_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 4, v); }
  void set_message_mraed(uint8_t v) requires(Base::kMutable) { SetBits(8, 0, 2, v); }
  void set_message_mraed(MessageKind v) requires(Base::kMutable) {
    SetBits(8, 0, 2, static_cast<uint8_t>(v));
  }
  void set_service_timeout(uint8_t v) requires(Base::kMutable) { SetBits(9, 0, 5, v); }
};

// DREQ, Request for Disconnection (IBA table 112):
//   0-3: Local Comm ID | 4-7: Remote Comm ID | 8-10: Remote QPN/EECN
//   11: reserved | 12-231: PrivateData (220)
// The receiver drops a DREQ whose QPN is not its connection's local QPN.
template <typename Byte>
class DreqViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::p_;

 public:
  static constexpr size_t kPrivateDataOffset = 12;

  using Base::Base;

  uint32_t local_comm_id() const { return LoadBe32(p_); }
  uint32_t remote_comm_id() const { return LoadBe32(p_ + 4); }
  uint32_t remote_qpn_eecn() const { return LoadBe24(p_ + 8); }
  std::span<Byte, kDreqPrivateDataBytes> private_data() const {
    return Base::template Bytes<kDreqPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_local_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_remote_comm_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 4, v); }
  void set_remote_qpn_eecn(uint32_t v) requires(Base::kMutable) {
    StoreBe24(p_ + 8, v & k24BitMask);
  }
};

// SIDR_REQ, Service ID Resolution Request (IBA table 119):
//   0-3: RequestID | 4-5: Partition Key | 6-7: reserved | 8-15: ServiceID
//   16-231: PrivateData (216)
template <typename Byte>
class SidrReqViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::p_;

 public:
  static constexpr size_t kPrivateDataOffset = 16;

  using Base::Base;

  uint32_t request_id() const { return LoadBe32(p_); }
  uint16_t partition_key() const { return LoadBe16(p_ + 4); }
  uint64_t service_id() const { return LoadBe64(p_ + 8); }
  std::span<Byte, kSidrReqPrivateDataBytes> private_data() const {
    return Base::template Bytes<kSidrReqPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_request_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_partition_key(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 4, v); }
  void set_service_id(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 8, v); }
};

// SIDR_REP, Service ID Resolution Response (IBA table 120):
//   0-3: RequestID | 4: Status | 5: Additional Information Length
//   6-7: VendorID[23:8] | 8-10: QPN | 11: VendorID[7:0] | 12-19: ServiceID
//   20-23: Q_Key | 24-95: Additional Information (72)
//   96-231: PrivateData (136)
template <typename Byte>
class SidrRepViewT : public FieldView<Byte, kMessageBytes> {
  using Base = FieldView<Byte, kMessageBytes>;
  using Base::p_;

 public:
  static constexpr size_t kAdditionalInfoOffset = 24;
  static constexpr size_t kPrivateDataOffset = 96;

  using Base::Base;

  uint32_t request_id() const { return LoadBe32(p_); }
  // A SidrStatus value.
  uint8_t status() const { return p_[4]; }
  uint8_t additional_info_length() const { return p_[5]; }
  uint32_t vendor_id() const { return (uint32_t{LoadBe16(p_ + 6)} << 8) | p_[11]; }
  uint32_t qpn() const { return LoadBe24(p_ + 8); }
  uint64_t service_id() const { return LoadBe64(p_ + 12); }
  uint32_t qkey() const { return LoadBe32(p_ + 20); }
  std::span<Byte, kAriBytes> additional_info() const {
    return Base::template Bytes<kAriBytes>(kAdditionalInfoOffset);
  }
  std::span<Byte, kSidrRepPrivateDataBytes> private_data() const {
    return Base::template Bytes<kSidrRepPrivateDataBytes>(kPrivateDataOffset);
  }

  void set_request_id(uint32_t v) requires(Base::kMutable) { StoreBe32(p_, v); }
  void set_status(uint8_t v) requires(Base::kMutable) { p_[4] = v; }
  void set_status(SidrStatus v) requires(Base::kMutable) { p_[4] = static_cast<uint8_t>(v); }
  void set_additional_info_length(uint8_t v) requires(Base::kMutable) { p_[5] = v; }
  // Keeps the low 24 bits of `v`.
  void set_vendor_id(uint32_t v) requires(Base::kMutable) {
    StoreBe16(p_ + 6, static_cast<uint16_t>(v >> 8));
    p_[11] = static_cast<uint8_t>(v);
  }
  void set_qpn(uint32_t v) requires(Base::kMutable) { StoreBe24(p_ + 8, v & k24BitMask); }
  void set_service_id(uint64_t v) requires(Base::kMutable) { StoreBe64(p_ + 12, v); }
  void set_qkey(uint32_t v) requires(Base::kMutable) { StoreBe32(p_ + 20, v); }
};

using ReqView = ReqViewT<uint8_t>;
using ConstReqView = ReqViewT<const uint8_t>;
using RepView = RepViewT<uint8_t>;
using ConstRepView = RepViewT<const uint8_t>;
using RtuView = CommIdsViewT<uint8_t>;
using ConstRtuView = CommIdsViewT<const uint8_t>;
using DrepView = CommIdsViewT<uint8_t>;
using ConstDrepView = CommIdsViewT<const uint8_t>;
using RejView = RejViewT<uint8_t>;
using ConstRejView = RejViewT<const uint8_t>;
using MraView = MraViewT<uint8_t>;
using ConstMraView = MraViewT<const uint8_t>;
using DreqView = DreqViewT<uint8_t>;
using ConstDreqView = DreqViewT<const uint8_t>;
using SidrReqView = SidrReqViewT<uint8_t>;
using ConstSidrReqView = SidrReqViewT<const uint8_t>;
using SidrRepView = SidrRepViewT<uint8_t>;
using ConstSidrRepView = SidrRepViewT<const uint8_t>;

// --- The RDMA CM's private data header ------------------------------------

// What the RDMA CM puts first in REQ and SIDR_REQ private data so the
// passive side learns the IP addresses behind the GIDs (the kernel's struct
// cma_hdr; IBA annex A11's IP CM Request, whose MajV.MinV is 0.0):
//   0: CMA version (0) | 1: IP version (7:4, 4 or 6) | 2-3: source port
//   4-19: source IP | 20-35: destination IP
// An IPv4 address takes the last 4 of the 16 bytes, the first 12 zero. The
// source is the active side; its port and the service ID's port give the
// passive side both ends.
template <typename Byte>
class CmaHeaderViewT : public FieldView<Byte, kCmaHeaderBytes> {
  using Base = FieldView<Byte, kCmaHeaderBytes>;
  using Base::Bits;
  using Base::p_;
  using Base::SetBits;

 public:
  // The only version there is; the kernel rejects any other with EINVAL.
  static constexpr uint8_t kVersion = 0;

  using Base::Base;

  uint8_t cma_version() const { return p_[0]; }
  uint8_t ip_version() const { return Bits(1, 0, 4); }
  uint16_t port() const { return LoadBe16(p_ + 2); }
  Gid src_addr() const { return Base::LoadGid(4); }
  Gid dst_addr() const { return Base::LoadGid(20); }
  // The IPv4 addresses, host order (meaningful when ip_version() is 4).
  uint32_t src_ipv4() const { return LoadBe32(p_ + 16); }
  uint32_t dst_ipv4() const { return LoadBe32(p_ + 32); }

  void set_cma_version(uint8_t v) requires(Base::kMutable) { p_[0] = v; }
  // Keeps the low 4 bits of `v`, in the high nibble; the low nibble is
  // reserved and left alone.
  void set_ip_version(uint8_t v) requires(Base::kMutable) { SetBits(1, 0, 4, v); }
  void set_port(uint16_t v) requires(Base::kMutable) { StoreBe16(p_ + 2, v); }
  void set_src_addr(const Gid& v) requires(Base::kMutable) { Base::StoreGid(4, v); }
  void set_dst_addr(const Gid& v) requires(Base::kMutable) { Base::StoreGid(20, v); }
  // Writes the whole 16 bytes: 12 zero bytes, then the address.
  void set_src_ipv4(uint32_t v) requires(Base::kMutable) { StoreIpv4(4, v); }
  void set_dst_ipv4(uint32_t v) requires(Base::kMutable) { StoreIpv4(20, v); }

 private:
  void StoreIpv4(size_t off, uint32_t v) requires(Base::kMutable) {
    for (size_t i = 0; i < 12; ++i) p_[off + i] = 0;
    StoreBe32(p_ + off + 12, v);
  }
};

using CmaHeaderView = CmaHeaderViewT<uint8_t>;
using ConstCmaHeaderView = CmaHeaderViewT<const uint8_t>;

// --- Checks and trace -----------------------------------------------------

// The attribute of a MAD the CM should read, or EINVAL naming what is wrong:
// shorter than kMadBytes, a base version, management class, class version
// or method not the CM's, or an attribute ID that is no CM message. LAP and
// APR pass; the caller rejects them on RoCE. Never crashes, for any input.
Result<AttributeId> CheckMad(std::span<const uint8_t> mad);

// One line for trace logs: the message's name and what identifies it, e.g.
// "REQ comm 0x1234 sid 0x1061d2f qpn 0x11 psn 0xabc", or why the bytes are
// not a CM MAD.
std::string DescribeMad(std::span<const uint8_t> mad);

}  // namespace rdmaemu::cm
