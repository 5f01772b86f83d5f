#include "emulator/cm/mad.h"

#include <fmt/format.h>

#include <algorithm>

namespace rdmaemu::cm {

std::string_view ToString(RejReason r) {
  switch (r) {
    case RejReason::kNoQp: return "no QP";
    case RejReason::kNoEec: return "no EEC";
    case RejReason::kNoResources: return "no resources";
    case RejReason::kTimeout: return "timeout";
    case RejReason::kUnsupported: return "unsupported request";
    case RejReason::kInvalidCommId: return "invalid comm ID";
    case RejReason::kInvalidCommInstance: return "invalid comm instance";
    case RejReason::kInvalidServiceId: return "invalid service ID";
    case RejReason::kInvalidTransportType: return "invalid transport type";
    case RejReason::kStaleConn: return "stale connection";
    case RejReason::kRdcNotExist: return "RDC does not exist";
    case RejReason::kInvalidGid: return "invalid GID";
    case RejReason::kInvalidLid: return "invalid LID";
    case RejReason::kInvalidSl: return "invalid SL";
    case RejReason::kInvalidTrafficClass: return "invalid traffic class";
    case RejReason::kInvalidHopLimit: return "invalid hop limit";
    case RejReason::kInvalidPacketRate: return "invalid packet rate";
    case RejReason::kInvalidAltGid: return "invalid alternate GID";
    case RejReason::kInvalidAltLid: return "invalid alternate LID";
    case RejReason::kInvalidAltSl: return "invalid alternate SL";
    case RejReason::kInvalidAltTrafficClass: return "invalid alternate traffic class";
    case RejReason::kInvalidAltHopLimit: return "invalid alternate hop limit";
    case RejReason::kInvalidAltPacketRate: return "invalid alternate packet rate";
    case RejReason::kPortCmRedirect: return "port CM redirect";
    case RejReason::kPortRedirect: return "port redirect";
    case RejReason::kInvalidMtu: return "invalid MTU";
    case RejReason::kInsufficientRespResources: return "insufficient responder resources";
    case RejReason::kConsumerDefined: return "consumer defined";
    case RejReason::kInvalidRnrRetry: return "invalid RNR retry count";
    case RejReason::kDuplicateLocalCommId: return "duplicate local comm ID";
    case RejReason::kInvalidClassVersion: return "invalid class version";
    case RejReason::kInvalidFlowLabel: return "invalid flow label";
    case RejReason::kInvalidAltFlowLabel: return "invalid alternate flow label";
    case RejReason::kVendorOptionNotSupported: return "vendor option not supported";
  }
  return "unknown reason";
}

std::string_view ToString(SidrStatus s) {
  switch (s) {
    case SidrStatus::kSuccess: return "success";
    case SidrStatus::kUnsupported: return "service ID not supported";
    case SidrStatus::kReject: return "rejected";
    case SidrStatus::kNoQp: return "no QP";
    case SidrStatus::kRedirect: return "redirect";
    case SidrStatus::kUnsupportedVersion: return "unsupported version";
  }
  return "unknown status";
}

void InitMad(std::span<uint8_t> mad, AttributeId id, uint64_t tid) {
  assert(mad.size() >= kMadBytes);
  std::fill_n(mad.begin(), kMadBytes, uint8_t{0});
  MadHeaderView h(mad);
  h.set_base_version(kBaseVersion);
  h.set_mgmt_class(kMgmtClassCm);
  h.set_class_version(kCmClassVersion);
  h.set_method(kMethodSend);
  h.set_transaction_id(tid);
  h.set_attribute_id(id);
}

Result<AttributeId> CheckMad(std::span<const uint8_t> mad) {
  if (mad.size() < kMadBytes) {
    return InvalidArgument(
        fmt::format("MAD of {} bytes is shorter than {}", mad.size(), kMadBytes));
  }
  const ConstMadHeaderView h(mad);
  if (h.base_version() != kBaseVersion) {
    return InvalidArgument(
        fmt::format("MAD base version {} is not {}", h.base_version(), kBaseVersion));
  }
  if (h.mgmt_class() != kMgmtClassCm) {
    return InvalidArgument(
        fmt::format("management class {:#04x} is not CM ({:#04x})", h.mgmt_class(), kMgmtClassCm));
  }
  if (h.class_version() != kCmClassVersion) {
    return InvalidArgument(
        fmt::format("CM class version {} is not {}", h.class_version(), kCmClassVersion));
  }
  if (h.method() != kMethodSend) {
    return InvalidArgument(
        fmt::format("CM method {:#04x} is not Send ({:#04x})", h.method(), kMethodSend));
  }
  if (!IsCmAttribute(h.attribute_id())) {
    return InvalidArgument(
        fmt::format("attribute ID {:#06x} is not a CM message", h.attribute_id()));
  }
  return static_cast<AttributeId>(h.attribute_id());
}

std::string DescribeMad(std::span<const uint8_t> mad) {
  const Result<AttributeId> checked = CheckMad(mad);
  if (!checked.ok()) return fmt::format("not a CM MAD: {}", checked.status().message());
  const AttributeId id = checked.value();
  const std::span<const uint8_t> m = MessageBytes(mad);
  const std::string_view name = ToString(id);
  switch (id) {
    case AttributeId::kReq: {
      const ConstReqView req(m);
      return fmt::format("{} comm {:#x} sid {:#x} qpn {:#x} psn {:#x}", name, req.local_comm_id(),
                         req.service_id(), req.local_qpn(), req.starting_psn());
    }
    case AttributeId::kMra: {
      const ConstMraView mra(m);
      return fmt::format("{} comm {:#x} remote {:#x} mraed {} timeout {}", name,
                         mra.local_comm_id(), mra.remote_comm_id(), mra.message_mraed(),
                         mra.service_timeout());
    }
    case AttributeId::kRej: {
      const ConstRejView rej(m);
      return fmt::format("{} comm {:#x} remote {:#x} reason {} ({}) rejected {}", name,
                         rej.local_comm_id(), rej.remote_comm_id(), rej.reason(),
                         ToString(static_cast<RejReason>(rej.reason())), rej.message_rejected());
    }
    case AttributeId::kRep: {
      const ConstRepView rep(m);
      return fmt::format("{} comm {:#x} remote {:#x} qpn {:#x} psn {:#x}", name,
                         rep.local_comm_id(), rep.remote_comm_id(), rep.local_qpn(),
                         rep.starting_psn());
    }
    case AttributeId::kDreq: {
      const ConstDreqView dreq(m);
      return fmt::format("{} comm {:#x} remote {:#x} qpn {:#x}", name, dreq.local_comm_id(),
                         dreq.remote_comm_id(), dreq.remote_qpn_eecn());
    }
    case AttributeId::kSidrReq: {
      const ConstSidrReqView req(m);
      return fmt::format("{} id {:#x} sid {:#x} pkey {:#06x}", name, req.request_id(),
                         req.service_id(), req.partition_key());
    }
    case AttributeId::kSidrRep: {
      const ConstSidrRepView rep(m);
      return fmt::format("{} id {:#x} status {} ({}) qpn {:#x} qkey {:#x}", name, rep.request_id(),
                         rep.status(), ToString(static_cast<SidrStatus>(rep.status())), rep.qpn(),
                         rep.qkey());
    }
    case AttributeId::kRtu:
    case AttributeId::kDrep:
    case AttributeId::kLap:
    case AttributeId::kApr: {
      // LAP and APR begin with the same two comm IDs (IBA tables 115, 116).
      const ConstRtuView ids(m);
      return fmt::format("{} comm {:#x} remote {:#x}", name, ids.local_comm_id(),
                         ids.remote_comm_id());
    }
  }
  return std::string(name);
}

}  // namespace rdmaemu::cm
