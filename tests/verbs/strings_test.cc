// ibv_*_str: every enum value is named as rdma-core names it, out-of-range
// values are "unknown", and IBV_EVENT_DEVICE_SPEED_CHANGE (20, newer than the
// installed header) is "device speed change".

#include <infiniband/verbs.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/verbs/real_libibverbs.h"
#include "verbs/abi/exports.h"

namespace {

TEST(Strings, WcStatus) {
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_SUCCESS), "success");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_LEN_ERR), "local length error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_QP_OP_ERR), "local QP operation error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_EEC_OP_ERR), "local EE context operation error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_PROT_ERR), "local protection error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_MW_BIND_ERR), "memory management operation error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_BAD_RESP_ERR), "bad response error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_ACCESS_ERR), "local access error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_REM_INV_REQ_ERR), "remote invalid request error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_REM_OP_ERR), "remote operation error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_RNR_RETRY_EXC_ERR), "RNR retry counter exceeded");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_LOC_RDD_VIOL_ERR), "local RDD violation error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_REM_INV_RD_REQ_ERR), "remote invalid RD request");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_REM_ABORT_ERR), "aborted error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_INV_EECN_ERR), "invalid EE context number");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_INV_EEC_STATE_ERR), "invalid EE context state");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_FATAL_ERR), "fatal error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_RESP_TIMEOUT_ERR), "response timeout error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_GENERAL_ERR), "general error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_TM_ERR), "TM error");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_TM_RNDV_INCOMPLETE), "TM software rendezvous");
  EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(24)), "unknown");
  EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(-1)), "unknown");
  EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(1 << 30)), "unknown");
}

TEST(Strings, EventType) {
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_CQ_ERR), "CQ error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_QP_FATAL), "local work queue catastrophic error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_QP_REQ_ERR),
               "invalid request local work queue error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_QP_ACCESS_ERR),
               "local access violation work queue error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_COMM_EST), "communication established");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_SQ_DRAINED), "send queue drained");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_PATH_MIG), "path migrated");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_PATH_MIG_ERR), "path migration request error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_DEVICE_FATAL), "local catastrophic error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_PORT_ACTIVE), "port active");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_PORT_ERR), "port error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_LID_CHANGE), "LID change");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_PKEY_CHANGE), "P_Key change");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_SM_CHANGE), "SM change");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_SRQ_ERR), "SRQ catastrophic error");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_SRQ_LIMIT_REACHED), "SRQ limit reached");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_QP_LAST_WQE_REACHED), "last WQE reached");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_CLIENT_REREGISTER), "client reregistration");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_GID_CHANGE), "GID table change");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_WQ_FATAL), "WQ fatal");
  EXPECT_STREQ(ibv_event_type_str(static_cast<ibv_event_type>(-1)), "unknown");
  EXPECT_STREQ(ibv_event_type_str(static_cast<ibv_event_type>(21)), "unknown");
}

TEST(Strings, DeviceSpeedChangeIsEvent20) {
  EXPECT_EQ(static_cast<int>(IBV_EVENT_DEVICE_SPEED_CHANGE), 20);
  EXPECT_EQ(static_cast<int>(IBV_EVENT_DEVICE_SPEED_CHANGE), IBV_EVENT_WQ_FATAL + 1);
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_DEVICE_SPEED_CHANGE), "device speed change");
}

TEST(Strings, NodeType) {
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_SWITCH), "InfiniBand switch");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_ROUTER), "InfiniBand router");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_RNIC), "iWARP NIC");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_USNIC), "usNIC");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_USNIC_UDP), "usNIC UDP");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_UNSPECIFIED), "unspecified");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_UNKNOWN), "unknown");
  EXPECT_STREQ(ibv_node_type_str(static_cast<ibv_node_type>(0)), "unknown");
  EXPECT_STREQ(ibv_node_type_str(static_cast<ibv_node_type>(8)), "unknown");
}

TEST(Strings, PortState) {
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_NOP), "no state change (NOP)");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_DOWN), "down");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_INIT), "init");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ARMED), "armed");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ACTIVE), "active");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ACTIVE_DEFER), "active defer");
  EXPECT_STREQ(ibv_port_state_str(static_cast<ibv_port_state>(6)), "unknown");
  EXPECT_STREQ(ibv_port_state_str(static_cast<ibv_port_state>(-1)), "unknown");
}

// Same answer as the installed rdma-core 44 for every value it knows, and for
// a range of values around them (event 20 is the one deliberate difference).
template <typename Enum>
void CompareWithReal(const char* (*ours)(Enum), const char* (*real)(Enum), int lo, int hi,
                     int skip = -1000) {
  for (int v = lo; v <= hi; ++v) {
    if (v == skip) continue;
    EXPECT_STREQ(ours(static_cast<Enum>(v)), real(static_cast<Enum>(v))) << "value " << v;
  }
}

TEST(Strings, SameAsInstalledRdmaCore) {
  auto real_wc = REAL_SYMBOL(ibv_wc_status_str);
  auto real_event = REAL_SYMBOL(ibv_event_type_str);
  auto real_node = REAL_SYMBOL(ibv_node_type_str);
  auto real_port = REAL_SYMBOL(ibv_port_state_str);
  if (real_wc == nullptr || real_event == nullptr || real_node == nullptr || real_port == nullptr)
    GTEST_SKIP() << rdmaemu::testing::kRealLibibverbs << " is not installed";
  CompareWithReal(ibv_wc_status_str, real_wc, -3, 40);
  CompareWithReal(ibv_event_type_str, real_event, -3, 40, /*skip=*/20);
  CompareWithReal(ibv_node_type_str, real_node, -3, 40);
  CompareWithReal(ibv_port_state_str, real_port, -3, 40);
  EXPECT_STREQ(real_event(IBV_EVENT_DEVICE_SPEED_CHANGE), "unknown")
      << "the installed rdma-core now names event 20: use its text";
}

}  // namespace
