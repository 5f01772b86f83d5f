#include "emulator/objects/qp_state.h"

#include <fmt/format.h>

namespace rdmaemu::objects {
namespace {

// One line of the IBA's Modify QP table: a legal (from, to) and, per
// transport, the attributes it requires and those it also accepts.
struct Transition {
  QpState from;
  QpState to;
  TransitionMasks rc;
  TransitionMasks uc;
  TransitionMasks ud;
};

constexpr TransitionMasks kNothing = {0, 0};

// Any state may go back to RESET, and any state but RESET to ERR, with
// IBV_QP_STATE alone.
constexpr Transition ToReset(QpState from) {
  return {from, QpState::kReset, kNothing, kNothing, kNothing};
}
constexpr Transition ToErr(QpState from) {
  return {from, QpState::kErr, kNothing, kNothing, kNothing};
}

constexpr uint32_t kRcUcInit = kQpPkeyIndex | kQpPort | kQpAccessFlags;
constexpr uint32_t kUdInit = kQpPkeyIndex | kQpPort | kQpQkey;
constexpr uint32_t kUcRtr = kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
constexpr uint32_t kRcRtr = kUcRtr | kQpMaxDestRdAtomic | kQpMinRnrTimer;
constexpr uint32_t kRcRts = kQpSqPsn | kQpMaxQpRdAtomic | kQpRetryCnt | kQpRnrRetry | kQpTimeout;
// What an RTS (or SQD -> RTS) modify may change on the fly.
constexpr uint32_t kUcRtsOptional = kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState;
constexpr uint32_t kRcRtsOptional = kUcRtsOptional | kQpMinRnrTimer;
constexpr uint32_t kUdRtsOptional = kQpCurState | kQpQkey;

// Columns: from, to, {required, optional} for RC, UC, UD.
constexpr Transition kTransitions[] = {
    ToReset(QpState::kReset),
    {QpState::kReset, QpState::kInit, {kRcUcInit, 0}, {kRcUcInit, 0}, {kUdInit, 0}},

    ToReset(QpState::kInit),
    ToErr(QpState::kInit),
    {QpState::kInit, QpState::kInit, {0, kRcUcInit}, {0, kRcUcInit}, {0, kUdInit}},
    {QpState::kInit, QpState::kRtr,
     {kRcRtr, kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
     {kUcRtr, kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
     {0, kQpPkeyIndex | kQpQkey}},

    ToReset(QpState::kRtr),
    ToErr(QpState::kRtr),
    {QpState::kRtr, QpState::kRts,
     {kRcRts, kRcRtsOptional},
     {kQpSqPsn, kUcRtsOptional},
     {kQpSqPsn, kUdRtsOptional}},

    ToReset(QpState::kRts),
    ToErr(QpState::kRts),
    {QpState::kRts, QpState::kRts, {0, kRcRtsOptional}, {0, kUcRtsOptional}, {0, kUdRtsOptional}},
    {QpState::kRts, QpState::kSqd,
     {0, kQpEnSqdAsyncNotify}, {0, kQpEnSqdAsyncNotify}, {0, kQpEnSqdAsyncNotify}},

    ToReset(QpState::kSqd),
    ToErr(QpState::kSqd),
    {QpState::kSqd, QpState::kRts, {0, kRcRtsOptional}, {0, kUcRtsOptional}, {0, kUdRtsOptional}},
    // While the send queue is drained, the path itself may be replaced.
    {QpState::kSqd, QpState::kSqd,
     {0, kQpPort | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic |
             kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpMinRnrTimer |
             kQpPathMigState},
     {0, kQpAv | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpPathMigState},
     {0, kQpPkeyIndex | kQpQkey}},

    ToReset(QpState::kSqe),
    ToErr(QpState::kSqe),
    // Only UD and UC QPs enter SQE (an RC send error moves the QP to ERR);
    // Linux's table still lists the row for every type, with nothing to set.
    {QpState::kSqe, QpState::kRts,
     kNothing, {0, kQpCurState | kQpAccessFlags}, {0, kQpCurState | kQpQkey}},

    ToReset(QpState::kErr),
    ToErr(QpState::kErr),
};

bool IsState(QpState s) { return static_cast<uint32_t>(s) < kNumQpStates; }

bool IsType(QpType t) {
  return t == QpType::kRc || t == QpType::kUc || t == QpType::kUd || t == QpType::kRawPacket ||
         t == QpType::kXrcSend || t == QpType::kXrcRecv;
}

// A raw packet QP has no remote side, no P_Key and no Q_Key: of UD's
// attributes it keeps the port alone (Linux's qp_state_table lists
// IB_QP_PORT for RAW_PACKET on RESET->INIT and as optional on INIT->INIT,
// and nothing else), plus what any RTS modify may name (IBV_QP_CUR_STATE).
constexpr uint32_t kRawAttrs = kQpPort | kQpCurState;
constexpr TransitionMasks RawMasks(TransitionMasks ud) {
  return {ud.required & kRawAttrs, ud.optional & kRawAttrs};
}

// An XRC QP is half of an RC QP (Linux's qp_state_table lists the same
// rows): the initiator has RC's send side and no receive side, the target
// the receive side and no send side. Each takes RC's masks without the
// attributes of the half it lacks.
constexpr uint32_t kReceiveSideAttrs = kQpMaxDestRdAtomic | kQpMinRnrTimer;
constexpr uint32_t kSendSideAttrs = kQpMaxQpRdAtomic | kQpRetryCnt | kQpRnrRetry;

constexpr TransitionMasks Without(TransitionMasks m, uint32_t attrs) {
  return {m.required & ~attrs, m.optional & ~attrs};
}

// "an RC QP", "a UD QP", "an XRC_SEND QP".
std::string QpNoun(QpType type) {
  const bool vowel = type == QpType::kRc || type == QpType::kXrcSend || type == QpType::kXrcRecv;
  return fmt::format("{} {} QP", vowel ? "an" : "a", ToString(type));
}

std::string Arrow(QpState from, QpState to) {
  return fmt::format("{}\u2192{}", ToString(from), ToString(to));
}

// "INIT, RESET or ERR": where a QP of `type` in `from` may go.
std::string LegalTargets(QpType type, QpState from) {
  std::string out;
  int left = 0;
  for (int s = 0; s < kNumQpStates; ++s) {
    if (FindTransition(type, from, static_cast<QpState>(s))) ++left;
  }
  for (int s = 0; s < kNumQpStates; ++s) {
    auto to = static_cast<QpState>(s);
    if (!FindTransition(type, from, to)) continue;
    --left;
    if (!out.empty()) out += left == 0 ? " or " : ", ";
    out += ToString(to);
  }
  return out;
}

// Why an attribute that no transition of `type` lists is refused everywhere.
std::string NeverAllowedReason(uint32_t extra) {
  if (extra & kQpCap) {
    return " (queue sizes are fixed by ibv_create_qp; no transition accepts IBV_QP_CAP)";
  }
  if (extra & kQpRateLimit) {
    return " (packet pacing with IBV_QP_RATE_LIMIT exists only for raw packet QPs)";
  }
  return "";
}

bool PortValid(int port, const QpLimits& limits) { return port >= 1 && port <= limits.num_ports; }

std::string PortRange(const QpLimits& limits) {
  return limits.num_ports == 1 ? "the device has port 1 only"
                               : fmt::format("the device has ports 1..{}", limits.num_ports);
}

// Checks one address vector. `what` is "ah_attr" or "alt_ah_attr", `attr` the
// mask bit that carries it, `port` the port the QP will use on that path.
Status CheckAv(const AddressVector& av, std::string_view what, std::string_view attr, int port,
               std::string_view port_field, const QpLimits& limits) {
  if (!PortValid(av.port_num, limits)) {
    return InvalidArgument(fmt::format("{}: {}.port_num {} is not a port ({})", attr, what,
                                       av.port_num, PortRange(limits)));
  }
  if (av.port_num != port) {
    return InvalidArgument(fmt::format("{}: {}.port_num {} differs from the QP's {} {}", attr,
                                       what, av.port_num, port_field, port));
  }
  const bool roce = what == "ah_attr" ? limits.roce : limits.alt_roce;
  if (roce && !av.has_grh) {
    if (what == "ah_attr") {
      return InvalidArgument(
          "on RoCE (Ethernet link layer) the address vector needs a GRH: set "
          "ah_attr.is_global = 1 and ah_attr.grh.dgid (ibv_rc_pingpong: use -g 0)");
    }
    return InvalidArgument(fmt::format(
        "{}: on RoCE (Ethernet link layer) the alternate address vector needs a GRH: set "
        "{}.is_global = 1 and {}.grh.dgid",
        attr, what, what));
  }
  if (av.has_grh && av.sgid_index >= limits.gid_table_len) {
    return InvalidArgument(fmt::format("{}: {}.grh.sgid_index {} is outside the GID table ({} {})",
                                       attr, what, av.sgid_index, limits.gid_table_len,
                                       limits.gid_table_len == 1 ? "entry" : "entries"));
  }
  return Status::Ok();
}

Status CheckPkeyIndex(uint16_t index, std::string_view field, std::string_view attr,
                      const QpLimits& limits) {
  if (index < limits.pkey_table_len) return Status::Ok();
  return InvalidArgument(fmt::format("{}: {} {} is outside the P_Key table ({} {}{})", attr, field,
                                     index, limits.pkey_table_len,
                                     limits.pkey_table_len == 1 ? "entry" : "entries",
                                     limits.pkey_table_len == 1 ? ": use 0" : ""));
}

Status CheckAckTimeout(uint8_t timeout, std::string_view field, std::string_view attr) {
  if (timeout <= 31) return Status::Ok();
  return InvalidArgument(fmt::format(
      "{}: {} {} is out of range: the local ACK timeout is 4.096 us * 2^{} with {} in 0..31",
      attr, field, timeout, field, field));
}

// The value checks, for the attributes in `mask` only; the mask itself has
// already been checked against the table.
Status CheckValues(const QpAttributes& current, const QpAttributes& req, uint32_t mask,
                   const QpLimits& limits) {
  if ((mask & kQpPort) && !PortValid(req.port_num, limits)) {
    return InvalidArgument(fmt::format("IBV_QP_PORT: port_num {} is not a port ({})",
                                       req.port_num, PortRange(limits)));
  }
  if (mask & kQpPkeyIndex) {
    if (Status s = CheckPkeyIndex(req.pkey_index, "pkey_index", "IBV_QP_PKEY_INDEX", limits);
        !s.ok()) {
      return s;
    }
  }
  if ((mask & kQpAccessFlags) && (req.qp_access_flags & ~kQpAccessFlagsMask)) {
    return InvalidArgument(fmt::format(
        "IBV_QP_ACCESS_FLAGS: qp_access_flags {:#x} has bits {:#x} that a QP does not grant; "
        "use IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ, "
        "IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_FLUSH_GLOBAL and IBV_ACCESS_FLUSH_PERSISTENT (and "
        "IBV_ACCESS_ON_DEMAND, which is accepted and means nothing for a QP)",
        req.qp_access_flags, req.qp_access_flags & ~kQpAccessFlagsMask));
  }
  if (mask & kQpAv) {
    int port = (mask & kQpPort) ? req.port_num : current.port_num;
    if (Status s = CheckAv(req.ah_attr, "ah_attr", "IBV_QP_AV", port, "port_num", limits);
        !s.ok()) {
      return s;
    }
  }
  if (mask & kQpPathMtu) {
    uint32_t bytes = MtuBytes(req.path_mtu);
    if (bytes == 0) {
      return InvalidArgument(fmt::format(
          "IBV_QP_PATH_MTU: path_mtu {} is not an MTU: use IBV_MTU_256 (1) .. IBV_MTU_4096 (5)",
          static_cast<uint32_t>(req.path_mtu)));
    }
    if (bytes > limits.port_active_mtu) {
      return InvalidArgument(fmt::format(
          "IBV_QP_PATH_MTU: path_mtu {} bytes exceeds the port's active MTU of {} bytes "
          "(ibv_query_port: active_mtu)",
          bytes, limits.port_active_mtu));
    }
  }
  if ((mask & kQpDestQpn) && req.dest_qp_num > kMax24Bit) {
    return InvalidArgument(fmt::format(
        "IBV_QP_DEST_QPN: dest_qp_num {:#x} does not fit a 24-bit QP number", req.dest_qp_num));
  }
  if ((mask & kQpMaxDestRdAtomic) && req.max_dest_rd_atomic > limits.max_dest_rd_atomic) {
    return InvalidArgument(fmt::format(
        "IBV_QP_MAX_DEST_RD_ATOMIC: max_dest_rd_atomic {} exceeds the device's {} "
        "(ibv_query_device: max_qp_rd_atom)",
        req.max_dest_rd_atomic, limits.max_dest_rd_atomic));
  }
  if ((mask & kQpMinRnrTimer) && req.min_rnr_timer > 31) {
    return InvalidArgument(fmt::format(
        "IBV_QP_MIN_RNR_TIMER: min_rnr_timer {} is out of range: it is a 5-bit code, 0..31",
        req.min_rnr_timer));
  }
  if ((mask & kQpMaxQpRdAtomic) && req.max_rd_atomic > limits.max_rd_atomic) {
    return InvalidArgument(fmt::format(
        "IBV_QP_MAX_QP_RD_ATOMIC: max_rd_atomic {} exceeds the device's {} "
        "(ibv_query_device: max_qp_init_rd_atom)",
        req.max_rd_atomic, limits.max_rd_atomic));
  }
  if ((mask & kQpRetryCnt) && req.retry_cnt > 7) {
    return InvalidArgument(fmt::format(
        "IBV_QP_RETRY_CNT: retry_cnt {} is out of range: it is a 3-bit count, 0..7",
        req.retry_cnt));
  }
  if ((mask & kQpRnrRetry) && req.rnr_retry > 7) {
    return InvalidArgument(fmt::format(
        "IBV_QP_RNR_RETRY: rnr_retry {} is out of range: it is a 3-bit count, 0..7 "
        "(7 retries forever)",
        req.rnr_retry));
  }
  if (mask & kQpTimeout) {
    if (Status s = CheckAckTimeout(req.timeout, "timeout", "IBV_QP_TIMEOUT"); !s.ok()) return s;
  }
  if (mask & kQpAltPath) {
    if (!limits.auto_path_mig) {
      return InvalidArgument(
          "IBV_QP_ALT_PATH: this device has no alternate paths (IBV_DEVICE_AUTO_PATH_MIG is not "
          "set in ibv_query_device's device_cap_flags)");
    }
    if (!PortValid(req.alt_port_num, limits)) {
      return InvalidArgument(fmt::format("IBV_QP_ALT_PATH: alt_port_num {} is not a port ({})",
                                         req.alt_port_num, PortRange(limits)));
    }
    if (Status s = CheckAv(req.alt_ah_attr, "alt_ah_attr", "IBV_QP_ALT_PATH", req.alt_port_num,
                           "alt_port_num", limits);
        !s.ok()) {
      return s;
    }
    if (Status s =
            CheckPkeyIndex(req.alt_pkey_index, "alt_pkey_index", "IBV_QP_ALT_PATH", limits);
        !s.ok()) {
      return s;
    }
    if (Status s = CheckAckTimeout(req.alt_timeout, "alt_timeout", "IBV_QP_ALT_PATH"); !s.ok()) {
      return s;
    }
  }
  if ((mask & kQpPathMigState) && static_cast<uint32_t>(req.path_mig_state) > 2) {
    return InvalidArgument(fmt::format(
        "IBV_QP_PATH_MIG_STATE: path_mig_state {} is not IBV_MIG_MIGRATED (0), IBV_MIG_REARM (1) "
        "or IBV_MIG_ARMED (2)",
        static_cast<uint32_t>(req.path_mig_state)));
  }
  return Status::Ok();
}

// IBV_QP_ALT_PATH and IBV_QP_PATH_MIG_STATE against the QP's migration
// state; `to` is the state the QP ends in.
Status CheckMigration(const QpAttributes& current, const QpAttributes& req, uint32_t mask,
                      QpState to) {
  const MigState now = current.path_mig_state;
  if ((mask & kQpAltPath) && now == MigState::kArmed) {
    return InvalidArgument(
        "IBV_QP_ALT_PATH: the alternate path is ARMED and cannot be replaced; load a new one while "
        "path_mig_state is MIGRATED or REARM (after a migration, or before arming)");
  }
  if (!(mask & kQpPathMigState) || req.path_mig_state == now) return Status::Ok();
  switch (req.path_mig_state) {
    case MigState::kRearm:
      if (now != MigState::kMigrated) {
        return InvalidArgument(fmt::format(
            "IBV_QP_PATH_MIG_STATE: IBV_MIG_REARM is loaded from MIGRATED; the path is {}",
            ToString(now)));
      }
      if (!(mask & kQpAltPath) && current.alt_port_num == 0) {
        return InvalidArgument(
            "IBV_QP_PATH_MIG_STATE: IBV_MIG_REARM needs an alternate path: set IBV_QP_ALT_PATH "
            "(alt_ah_attr, alt_port_num, alt_pkey_index, alt_timeout) in this modify or an "
            "earlier one");
      }
      return Status::Ok();
    case MigState::kArmed:
      if (now == MigState::kRearm) return Status::Ok();
      return InvalidArgument(fmt::format(
          "IBV_QP_PATH_MIG_STATE: IBV_MIG_ARMED may only follow IBV_MIG_REARM (REARM\u2192ARMED); "
          "the path is {}: load an alternate path with IBV_MIG_REARM first (the QP also arms "
          "itself once its peer is rearmed)",
          ToString(now)));
    case MigState::kMigrated:
      if (now != MigState::kArmed || to != QpState::kRts) {
        return InvalidArgument(fmt::format(
            "IBV_QP_PATH_MIG_STATE: IBV_MIG_MIGRATED forces a migration to the alternate path and "
            "needs the path ARMED and the QP in RTS; the path is {} and the QP goes to {}",
            ToString(now), ToString(to)));
      }
      return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

std::string_view ToString(QpState state) {
  switch (state) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kSqd: return "SQD";
    case QpState::kSqe: return "SQE";
    case QpState::kErr: return "ERR";
  }
  return "?";
}

std::string_view ToString(QpType type) {
  switch (type) {
    case QpType::kRc: return "RC";
    case QpType::kUc: return "UC";
    case QpType::kUd: return "UD";
    case QpType::kRawPacket: return "RAW_PACKET";
    case QpType::kXrcSend: return "XRC_SEND";
    case QpType::kXrcRecv: return "XRC_RECV";
  }
  return "?";
}

std::string_view ToString(MigState state) {
  switch (state) {
    case MigState::kMigrated: return "MIGRATED";
    case MigState::kRearm: return "REARM";
    case MigState::kArmed: return "ARMED";
  }
  return "?";
}

uint32_t MtuBytes(Mtu mtu) {
  switch (mtu) {
    case Mtu::k256: return 256;
    case Mtu::k512: return 512;
    case Mtu::k1024: return 1024;
    case Mtu::k2048: return 2048;
    case Mtu::k4096: return 4096;
  }
  return 0;
}

std::string QpAttrMaskToString(uint32_t mask) {
  std::string out;
  for (const QpAttrName& n : kQpAttrNames) {
    if (!(mask & n.bit)) continue;
    if (!out.empty()) out += ", ";
    out += n.name;
  }
  if (uint32_t unknown = mask & ~kQpKnownAttrMask) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{:#x}", unknown);
  }
  return out;
}

std::optional<TransitionMasks> FindTransition(QpType type, QpState from, QpState to) {
  for (const Transition& t : kTransitions) {
    if (t.from != from || t.to != to) continue;
    switch (type) {
      case QpType::kRc: return t.rc;
      case QpType::kUc: return t.uc;
      case QpType::kUd: return t.ud;
      case QpType::kRawPacket: return RawMasks(t.ud);
      case QpType::kXrcSend: return Without(t.rc, kReceiveSideAttrs);
      case QpType::kXrcRecv: return Without(t.rc, kSendSideAttrs);
    }
    return std::nullopt;
  }
  return std::nullopt;
}

Status CheckModify(QpType type, const QpAttributes& current, const QpAttributes& requested,
                   uint32_t mask, const QpLimits& limits) {
  if (!IsType(type)) {
    return InvalidArgument(fmt::format("QP type {} has no state machine here (RC, UC, UD, RAW_PACKET and XRC do)",
                                       static_cast<uint32_t>(type)));
  }
  if (uint32_t unknown = mask & ~kQpKnownAttrMask) {
    return InvalidArgument(
        fmt::format("attr_mask {:#x} has bits {:#x} that are no IBV_QP_* attribute", mask, unknown));
  }
  if ((mask & kQpState) && !IsState(requested.state)) {
    return InvalidArgument(fmt::format(
        "IBV_QP_STATE: qp_state {} is not a QP state (IBV_QPS_RESET (0) .. IBV_QPS_ERR (6))",
        static_cast<uint32_t>(requested.state)));
  }
  if (mask & kQpCurState) {
    if (!IsState(requested.cur_state)) {
      return InvalidArgument(fmt::format(
          "IBV_QP_CUR_STATE: cur_qp_state {} is not a QP state (IBV_QPS_RESET (0) .. "
          "IBV_QPS_ERR (6))",
          static_cast<uint32_t>(requested.cur_state)));
    }
    if (requested.cur_state != current.state) {
      return InvalidArgument(fmt::format(
          "IBV_QP_CUR_STATE: cur_qp_state says the QP is in {} but it is in {}",
          ToString(requested.cur_state), ToString(current.state)));
    }
  }

  const QpState from = current.state;
  const QpState to = (mask & kQpState) ? requested.state : from;
  std::optional<TransitionMasks> masks = FindTransition(type, from, to);
  if (!masks) {
    return InvalidArgument(fmt::format(
        "{} is not a legal transition for {}: from {} it can go to {}{}", Arrow(from, to),
        QpNoun(type), ToString(from), LegalTargets(type, from),
        (mask & kQpState) ? ""
                          : fmt::format(" (without IBV_QP_STATE in attr_mask the QP stays in {})",
                                        ToString(from))));
  }
  if (uint32_t missing = masks->required & ~mask) {
    return InvalidArgument(fmt::format("{} on {} requires {}; missing: {}", Arrow(from, to),
                                       QpNoun(type), QpAttrMaskToString(masks->required),
                                       QpAttrMaskToString(missing)));
  }
  if (uint32_t extra = mask & ~(masks->required | masks->optional | kQpState)) {
    bool several = (extra & (extra - 1)) != 0;
    return InvalidArgument(fmt::format("attribute{} {} {} not allowed on {} for {}{}",
                                       several ? "s" : "", QpAttrMaskToString(extra),
                                       several ? "are" : "is", Arrow(from, to), QpNoun(type),
                                       NeverAllowedReason(extra)));
  }
  // The path may be replaced in SQD only once nothing is in flight on it
  // (IBA 11.2.4.2: modifying a QP in SQD is valid once it is drained).
  if (from == QpState::kSqd && to == QpState::kSqd && current.sq_draining &&
      (mask & ~(kQpState | kQpCurState))) {
    return InvalidArgument(fmt::format(
        "SQD\u2192SQD: {} cannot be modified while the send queue is still draining "
        "(sq_draining = 1); wait for IBV_EVENT_SQ_DRAINED (set IBV_QP_EN_SQD_ASYNC_NOTIFY on "
        "RTS\u2192SQD) or for ibv_query_qp to show sq_draining = 0",
        QpAttrMaskToString(mask & ~(kQpState | kQpCurState))));
  }
  if (Status s = CheckValues(current, requested, mask, limits); !s.ok()) return s;
  return CheckMigration(current, requested, mask, to);
}

void ApplyModify(QpAttributes& current, const QpAttributes& requested, uint32_t mask) {
  const QpState from = current.state;
  const QpState to = (mask & kQpState) ? requested.state : from;
  if (to == QpState::kReset) {
    // Back to what ibv_create_qp left; the queues keep their sizes.
    QpCap cap = current.cap;
    current = QpAttributes{};
    current.cap = cap;
    return;
  }

  if (mask & kQpEnSqdAsyncNotify) current.en_sqd_async_notify = requested.en_sqd_async_notify;
  if (mask & kQpAccessFlags) current.qp_access_flags = requested.qp_access_flags;
  if (mask & kQpPkeyIndex) current.pkey_index = requested.pkey_index;
  if (mask & kQpPort) current.port_num = requested.port_num;
  if (mask & kQpQkey) current.qkey = requested.qkey;
  if (mask & kQpAv) current.ah_attr = requested.ah_attr;
  if (mask & kQpPathMtu) current.path_mtu = requested.path_mtu;
  if (mask & kQpTimeout) current.timeout = requested.timeout;
  if (mask & kQpRetryCnt) current.retry_cnt = requested.retry_cnt;
  if (mask & kQpRnrRetry) current.rnr_retry = requested.rnr_retry;
  // Linux cuts PSNs to the BTH's 24 bits (with a warning) rather than refuse.
  if (mask & kQpRqPsn) current.rq_psn = requested.rq_psn & kMax24Bit;
  if (mask & kQpMaxQpRdAtomic) current.max_rd_atomic = requested.max_rd_atomic;
  if (mask & kQpAltPath) {
    current.alt_ah_attr = requested.alt_ah_attr;
    current.alt_port_num = requested.alt_port_num;
    current.alt_pkey_index = requested.alt_pkey_index;
    current.alt_timeout = requested.alt_timeout;
  }
  if (mask & kQpMinRnrTimer) current.min_rnr_timer = requested.min_rnr_timer;
  if (mask & kQpSqPsn) current.sq_psn = requested.sq_psn & kMax24Bit;
  if (mask & kQpMaxDestRdAtomic) current.max_dest_rd_atomic = requested.max_dest_rd_atomic;
  if (mask & kQpPathMigState) current.path_mig_state = requested.path_mig_state;
  if (mask & kQpCap) current.cap = requested.cap;
  if (mask & kQpDestQpn) current.dest_qp_num = requested.dest_qp_num;
  if (mask & kQpRateLimit) current.rate_limit = requested.rate_limit;

  if (to == QpState::kSqd && from != QpState::kSqd) current.sq_draining = true;
  if (to != QpState::kSqd) current.sq_draining = false;
  current.state = to;
  current.cur_state = to;
}

}  // namespace rdmaemu::objects
