// The queue pair state machine: the IBA transition table and the checks a
// device makes on ibv_modify_qp, as pure functions with no I/O.
//
// A modify is checked, then applied (rxe's *_chk_attr / *_from_attr):
// CheckModify() looks at everything and changes nothing; ApplyModify() cannot
// fail. The QP object calls both under its lock, so a rejected modify never
// leaves a half-changed QP, as ibv_modify_qp(3) promises.
//
// The table of legal transitions and of the attributes each one requires or
// accepts is the one of the IBA specification (section 11.2.4.2 and its
// state diagram), in the form Linux checks it in ib_modify_qp_is_ok(); the
// value checks are those a device or the kernel makes before it touches the
// QP context.
//
// Every enum value and mask bit equals its libibverbs counterpart (IBV_QPS_*,
// IBV_QPT_*, IBV_QP_*, IBV_MTU_*, IBV_MIG_*, IBV_ACCESS_*), so the provider
// converts with a cast after a static_assert; the device never includes
// <infiniband/verbs.h>.
//
// Thread safety: everything here is a pure function of its arguments.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "emulator/base/status.h"

namespace rdmaemu::objects {

// The underlying types are 32 bits wide so that whatever int the application
// stored in an ibv_qp_attr survives the cast and is refused as out of range.
enum class QpState : uint32_t { kReset = 0, kInit, kRtr, kRts, kSqd, kSqe, kErr };
inline constexpr int kNumQpStates = 7;

// XRC_SEND is the initiator (INI: a send queue only), XRC_RECV the target
// (TGT: no queues; each message names the XRC SRQ it lands in).
enum class QpType : uint32_t { kRc = 2, kUc = 3, kUd = 4, kRawPacket = 8, kXrcSend = 9, kXrcRecv = 10 };

enum class Mtu : uint32_t { k256 = 1, k512, k1024, k2048, k4096 };

enum class MigState : uint32_t { kMigrated = 0, kRearm, kArmed };

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"; "?" for a value that is
// not a state.
std::string_view ToString(QpState state);
// "RC", "UC", "UD", "XRC_SEND", "XRC_RECV"; "?" otherwise.
std::string_view ToString(QpType type);
// "MIGRATED", "REARM", "ARMED"; "?" otherwise.
std::string_view ToString(MigState state);
// 256..4096, or 0 for a value that is not an MTU.
uint32_t MtuBytes(Mtu mtu);

// ibv_modify_qp's attr_mask bits, numbered as libibverbs numbers them.
enum QpAttrMask : uint32_t {
  kQpState = 1u << 0,
  kQpCurState = 1u << 1,
  kQpEnSqdAsyncNotify = 1u << 2,
  kQpAccessFlags = 1u << 3,
  kQpPkeyIndex = 1u << 4,
  kQpPort = 1u << 5,
  kQpQkey = 1u << 6,
  kQpAv = 1u << 7,
  kQpPathMtu = 1u << 8,
  kQpTimeout = 1u << 9,
  kQpRetryCnt = 1u << 10,
  kQpRnrRetry = 1u << 11,
  kQpRqPsn = 1u << 12,
  kQpMaxQpRdAtomic = 1u << 13,
  kQpAltPath = 1u << 14,
  kQpMinRnrTimer = 1u << 15,
  kQpSqPsn = 1u << 16,
  kQpMaxDestRdAtomic = 1u << 17,
  kQpPathMigState = 1u << 18,
  kQpCap = 1u << 19,
  kQpDestQpn = 1u << 20,
  // Bits 21..24 were the kernel's SMAC/VID bits; libibverbs never exposed them.
  kQpRateLimit = 1u << 25,
};

struct QpAttrName {
  uint32_t bit;
  std::string_view name;
};

// Every mask bit with its libibverbs name, in the order ibv_modify_qp(3)
// lists attributes for Reset -> Init -> RTR -> RTS, so that messages read
// like the man page.
inline constexpr std::array<QpAttrName, 22> kQpAttrNames = {{
    {kQpState, "IBV_QP_STATE"},
    {kQpCurState, "IBV_QP_CUR_STATE"},
    {kQpPkeyIndex, "IBV_QP_PKEY_INDEX"},
    {kQpPort, "IBV_QP_PORT"},
    {kQpQkey, "IBV_QP_QKEY"},
    {kQpAccessFlags, "IBV_QP_ACCESS_FLAGS"},
    {kQpAv, "IBV_QP_AV"},
    {kQpPathMtu, "IBV_QP_PATH_MTU"},
    {kQpDestQpn, "IBV_QP_DEST_QPN"},
    {kQpRqPsn, "IBV_QP_RQ_PSN"},
    {kQpMaxDestRdAtomic, "IBV_QP_MAX_DEST_RD_ATOMIC"},
    {kQpMinRnrTimer, "IBV_QP_MIN_RNR_TIMER"},
    {kQpSqPsn, "IBV_QP_SQ_PSN"},
    {kQpMaxQpRdAtomic, "IBV_QP_MAX_QP_RD_ATOMIC"},
    {kQpRetryCnt, "IBV_QP_RETRY_CNT"},
    {kQpRnrRetry, "IBV_QP_RNR_RETRY"},
    {kQpTimeout, "IBV_QP_TIMEOUT"},
    {kQpAltPath, "IBV_QP_ALT_PATH"},
    {kQpPathMigState, "IBV_QP_PATH_MIG_STATE"},
    {kQpEnSqdAsyncNotify, "IBV_QP_EN_SQD_ASYNC_NOTIFY"},
    {kQpCap, "IBV_QP_CAP"},
    {kQpRateLimit, "IBV_QP_RATE_LIMIT"},
}};

// The OR of every bit above.
inline constexpr uint32_t kQpKnownAttrMask = [] {
  uint32_t all = 0;
  for (const QpAttrName& n : kQpAttrNames) all |= n.bit;
  return all;
}();

// "IBV_QP_AV, IBV_QP_PATH_MTU" in kQpAttrNames order; bits without a name
// are appended in hex. Empty for 0.
std::string QpAttrMaskToString(uint32_t mask);

// The access rights a QP can grant to remote peers (IBV_ACCESS_LOCAL_WRITE,
// _REMOTE_WRITE, _REMOTE_READ, _REMOTE_ATOMIC: bits 0..3; FLUSH_GLOBAL and
// FLUSH_PERSISTENT, bits 8 and 9, as rxe grants them). IBV_ACCESS_ON_DEMAND
// (bit 6) means nothing for a QP, and mlx5 and rxe accept it there;
// rdma-core's own ODP tests pass it.
inline constexpr uint32_t kQpAccessFlagsMask = 0x34f;

// Largest PSN and QP number: both are 24-bit fields of the BTH.
inline constexpr uint32_t kMax24Bit = 0xffffff;

// ibv_ah_attr, flattened (the GRH fields are meaningful when has_grh).
struct AddressVector {
  bool has_grh = false;  // ibv_ah_attr.is_global
  uint8_t dgid[16] = {};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
  uint16_t dlid = 0;
  uint8_t sl = 0;
  uint8_t src_path_bits = 0;
  uint8_t static_rate = 0;
  uint8_t port_num = 0;

  bool operator==(const AddressVector&) const = default;
};

// ibv_qp_cap.
struct QpCap {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;

  bool operator==(const QpCap&) const = default;
};

// Everything ibv_modify_qp can set and ibv_query_qp reports (ibv_qp_attr).
// A default-constructed value is a QP in RESET as ibv_create_qp leaves it,
// apart from cap, which the creator fills in.
struct QpAttributes {
  QpState state = QpState::kReset;
  QpState cur_state = QpState::kReset;
  Mtu path_mtu = Mtu::k256;
  MigState path_mig_state = MigState::kMigrated;
  uint32_t qkey = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint32_t dest_qp_num = 0;
  uint32_t qp_access_flags = 0;
  QpCap cap;
  AddressVector ah_attr;
  AddressVector alt_ah_attr;
  uint16_t pkey_index = 0;
  uint16_t alt_pkey_index = 0;
  bool en_sqd_async_notify = false;
  bool sq_draining = false;  // set on entering SQD; the transport clears it when drained
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t port_num = 0;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  uint8_t alt_port_num = 0;
  uint8_t alt_timeout = 0;
  uint32_t rate_limit = 0;

  bool operator==(const QpAttributes&) const = default;
};

// What the device and its port allow; CheckModify's only view of the device.
struct QpLimits {
  int num_ports = 1;                  // ports are numbered 1..num_ports
  int pkey_table_len = 1;             // one default P_Key: pkey_index 0 only
  int gid_table_len = 1;              // sgid_index < gid_table_len
  uint32_t max_rd_atomic = 16;        // ibv_device_attr.max_qp_init_rd_atom
  uint32_t max_dest_rd_atomic = 16;   // ibv_device_attr.max_qp_rd_atom
  bool roce = true;                   // Ethernet link layer: every AV needs a GRH
  bool alt_roce = true;               // the same for the alternate path's port
  uint32_t port_active_mtu = 4096;    // bytes; path_mtu may not exceed it
  bool auto_path_mig = true;          // IBV_DEVICE_AUTO_PATH_MIG: IBV_QP_ALT_PATH works
};

// The attributes a transition requires and those it accepts besides them
// (IBV_QP_STATE itself is in neither).
struct TransitionMasks {
  uint32_t required = 0;
  uint32_t optional = 0;
};

// The table's entry for (type, from, to), or nullopt when the IBA does not
// allow that transition for that QP type.
std::optional<TransitionMasks> FindTransition(QpType type, QpState from, QpState to);

// Path migration (IBA 17.2.8), besides the table: IBV_QP_PATH_MIG_STATE may
// load REARM from MIGRATED when an alternate path exists (in this modify or
// an earlier one), confirm ARMED from REARM, and force MIGRATED from ARMED
// in RTS; IBV_QP_ALT_PATH may not replace an ARMED alternate path.
//
// Whether ibv_modify_qp(qp of `type` whose attributes are `current`,
// `requested`, `mask`) is legal. Without IBV_QP_STATE in mask the QP stays in
// its state (an RTS->RTS modify, for example); with IBV_QP_CUR_STATE,
// requested.cur_state must equal current.state. No side effects. Every
// failure is EINVAL with a sentence naming the attribute and the rule.
Status CheckModify(QpType type, const QpAttributes& current, const QpAttributes& requested,
                   uint32_t mask, const QpLimits& limits);

// Applies a modify that CheckModify accepted: copies exactly the masked
// attributes (IBV_QP_ALT_PATH carries alt_ah_attr, alt_port_num,
// alt_pkey_index and alt_timeout) and the new state. PSNs are cut to 24 bits
// as the kernel does. A transition to RESET returns every attribute but cap
// to its creation value; entering SQD sets sq_draining, leaving it clears it.
void ApplyModify(QpAttributes& current, const QpAttributes& requested, uint32_t mask);

}  // namespace rdmaemu::objects
