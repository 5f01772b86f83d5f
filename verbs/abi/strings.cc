// The enum-to-string helpers of verbs.h. The texts are rdma-core 44's (checked
// against the installed libibverbs.so.1), so programs print what they print on
// real hardware; any value outside a table gives "unknown", as rdma-core does.

#include <infiniband/verbs.h>

#include <cstddef>
#include <iterator>

#include "verbs/abi/exports.h"

namespace {

// Looks `value` up in a table indexed from `first`; empty slots and values
// outside the table are "unknown".
template <size_t N>
const char* Lookup(const char* const (&table)[N], long value, long first = 0) {
  const long index = value - first;
  if (index < 0 || index >= static_cast<long>(N) || table[index] == nullptr) return "unknown";
  return table[index];
}

}  // namespace

extern "C" {

const char* ibv_node_type_str(enum ibv_node_type node_type) {
  // Indexed from IBV_NODE_CA (1); 0 and IBV_NODE_UNKNOWN (-1) are "unknown".
  static const char* const kNames[] = {
      "InfiniBand channel adapter",  // IBV_NODE_CA
      "InfiniBand switch",           // IBV_NODE_SWITCH
      "InfiniBand router",           // IBV_NODE_ROUTER
      "iWARP NIC",                   // IBV_NODE_RNIC
      "usNIC",                       // IBV_NODE_USNIC
      "usNIC UDP",                   // IBV_NODE_USNIC_UDP
      "unspecified",                 // IBV_NODE_UNSPECIFIED
  };
  static_assert(IBV_NODE_CA == 1 && IBV_NODE_UNSPECIFIED == 7);
  return Lookup(kNames, node_type, IBV_NODE_CA);
}

const char* ibv_port_state_str(enum ibv_port_state port_state) {
  static const char* const kNames[] = {
      "no state change (NOP)",  // IBV_PORT_NOP
      "down",                   // IBV_PORT_DOWN
      "init",                   // IBV_PORT_INIT
      "armed",                  // IBV_PORT_ARMED
      "active",                 // IBV_PORT_ACTIVE
      "active defer",           // IBV_PORT_ACTIVE_DEFER
  };
  static_assert(IBV_PORT_ACTIVE_DEFER == 5);
  return Lookup(kNames, port_state);
}

const char* ibv_event_type_str(enum ibv_event_type event) {
  static const char* const kNames[] = {
      "CQ error",                                 // IBV_EVENT_CQ_ERR
      "local work queue catastrophic error",      // IBV_EVENT_QP_FATAL
      "invalid request local work queue error",   // IBV_EVENT_QP_REQ_ERR
      "local access violation work queue error",  // IBV_EVENT_QP_ACCESS_ERR
      "communication established",                // IBV_EVENT_COMM_EST
      "send queue drained",                       // IBV_EVENT_SQ_DRAINED
      "path migrated",                            // IBV_EVENT_PATH_MIG
      "path migration request error",             // IBV_EVENT_PATH_MIG_ERR
      "local catastrophic error",                 // IBV_EVENT_DEVICE_FATAL
      "port active",                              // IBV_EVENT_PORT_ACTIVE
      "port error",                               // IBV_EVENT_PORT_ERR
      "LID change",                               // IBV_EVENT_LID_CHANGE
      "P_Key change",                             // IBV_EVENT_PKEY_CHANGE
      "SM change",                                // IBV_EVENT_SM_CHANGE
      "SRQ catastrophic error",                   // IBV_EVENT_SRQ_ERR
      "SRQ limit reached",                        // IBV_EVENT_SRQ_LIMIT_REACHED
      "last WQE reached",                         // IBV_EVENT_QP_LAST_WQE_REACHED
      "client reregistration",                    // IBV_EVENT_CLIENT_REREGISTER
      "GID table change",                         // IBV_EVENT_GID_CHANGE
      "WQ fatal",                                 // IBV_EVENT_WQ_FATAL
      "device speed change",                      // IBV_EVENT_DEVICE_SPEED_CHANGE (rdma-core 62)
  };
  static_assert(IBV_EVENT_WQ_FATAL == 19 && IBV_EVENT_DEVICE_SPEED_CHANGE == 20);
  static_assert(std::size(kNames) == 21);
  return Lookup(kNames, event);
}

const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const kNames[] = {
      "success",                            // IBV_WC_SUCCESS
      "local length error",                 // IBV_WC_LOC_LEN_ERR
      "local QP operation error",           // IBV_WC_LOC_QP_OP_ERR
      "local EE context operation error",   // IBV_WC_LOC_EEC_OP_ERR
      "local protection error",             // IBV_WC_LOC_PROT_ERR
      "Work Request Flushed Error",         // IBV_WC_WR_FLUSH_ERR
      "memory management operation error",  // IBV_WC_MW_BIND_ERR
      "bad response error",                 // IBV_WC_BAD_RESP_ERR
      "local access error",                 // IBV_WC_LOC_ACCESS_ERR
      "remote invalid request error",       // IBV_WC_REM_INV_REQ_ERR
      "remote access error",                // IBV_WC_REM_ACCESS_ERR
      "remote operation error",             // IBV_WC_REM_OP_ERR
      "transport retry counter exceeded",   // IBV_WC_RETRY_EXC_ERR
      "RNR retry counter exceeded",         // IBV_WC_RNR_RETRY_EXC_ERR
      "local RDD violation error",          // IBV_WC_LOC_RDD_VIOL_ERR
      "remote invalid RD request",          // IBV_WC_REM_INV_RD_REQ_ERR
      "aborted error",                      // IBV_WC_REM_ABORT_ERR
      "invalid EE context number",          // IBV_WC_INV_EECN_ERR
      "invalid EE context state",           // IBV_WC_INV_EEC_STATE_ERR
      "fatal error",                        // IBV_WC_FATAL_ERR
      "response timeout error",             // IBV_WC_RESP_TIMEOUT_ERR
      "general error",                      // IBV_WC_GENERAL_ERR
      "TM error",                           // IBV_WC_TM_ERR
      "TM software rendezvous",             // IBV_WC_TM_RNDV_INCOMPLETE
  };
  static_assert(IBV_WC_TM_RNDV_INCOMPLETE == 23);
  return Lookup(kNames, status);
}

}  // extern "C"
