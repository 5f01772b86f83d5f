// Connections: rdma_connect, rdma_listen, rdma_accept, rdma_reject(_ece),
// rdma_disconnect, rdma_establish, rdma_notify, and the processing of
// CONNECT_RESPONSE inside rdma_get_cm_event (rdma-core's
// ucma_process_conn_resp).
//
// Negotiation is rdma-core's: 0xFF in responder_resources/initiator_depth
// means the device's maximum on connect and min(the peer's, the device's)
// on accept; larger than the device's maximum is EINVAL (RDMA_PS_TCP).
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cstring>

#include "verbs/rdmacm/address.h"
#include "verbs/rdmacm/id.h"
#include "verbs/rdmacm/library.h"

namespace rdmaemu::rdmacm {
namespace {

// rdma-core's ucma_valid_param: RDMA_PS_TCP checks the depths against the
// device. Returns 0 or -1 with errno.
int ValidParam(Id* p, const rdma_conn_param* param, const char* what) {
  if (p->id.ps != RDMA_PS_TCP) return 0;
  if (p->id.qp == nullptr && param == nullptr) {
    Log().warn("{}: id {} has no QP and no rdma_conn_param (its qp_num)", what, p->handle);
    return Fail(EINVAL);
  }
  if (param == nullptr || p->device == nullptr) return 0;
  if (param->responder_resources != RDMA_MAX_RESP_RES &&
      param->responder_resources > p->device->max_responder_resources) {
    Log().warn("{}: responder_resources {} is more than the device's maximum {} "
               "(max_qp_rd_atom; 0xFF asks for the maximum)",
               what, param->responder_resources, p->device->max_responder_resources);
    return Fail(EINVAL);
  }
  if (param->initiator_depth != RDMA_MAX_INIT_DEPTH &&
      param->initiator_depth > p->device->max_initiator_depth) {
    Log().warn("{}: initiator_depth {} is more than the device's maximum {} "
               "(max_qp_init_rd_atom; 0xFF asks for the maximum)",
               what, param->initiator_depth, p->device->max_initiator_depth);
    return Fail(EINVAL);
  }
  return 0;
}

// Copies the application's private data (after `prefix`) into `out`,
// checking the message's limit. Returns 0 or -1 with errno.
int SetPrivateData(rdmaemu_cm_param* out, const std::vector<uint8_t>& prefix,
                   const rdma_conn_param* param, uint8_t limit, const char* what,
                   const char* message) {
  size_t len = prefix.size();
  size_t user = param != nullptr && param->private_data != nullptr ? param->private_data_len : 0;
  if (len + user > limit) {
    Log().warn("{}: {} bytes of private data; a {} carries at most {}", what, len + user, message,
               limit);
    return Fail(EINVAL);
  }
  if (!prefix.empty()) std::memcpy(out->private_data, prefix.data(), prefix.size());
  if (user > 0) std::memcpy(out->private_data + len, param->private_data, user);
  out->private_data_len = static_cast<uint8_t>(len + user);
  return 0;
}

uint8_t WireQpType(const Id* p) {
  if (p->id.qp_type == IBV_QPT_UD) return IBV_QPT_UD;
  if (p->id.qp != nullptr) return static_cast<uint8_t>(p->id.qp->qp_type);
  return static_cast<uint8_t>(p->id.qp_type);
}

Id* Checked(rdma_cm_id* id, const char* what) {
  if (id == nullptr) {
    Log().warn("{}: the id is NULL", what);
    errno = EINVAL;
    return nullptr;
  }
  if (!LiveId(id, what)) {
    errno = EINVAL;
    return nullptr;
  }
  return ToId(id);
}

}  // namespace

void ProcessConnectResponse(Event* event) {
  Id* p = event->target;
  CopyConnParam(event);
  const rdmaemu_cm_param& rep = event->param;
  p->have_peer = true;
  p->peer_qpn = rep.qp_num;
  p->peer_psn = rep.starting_psn;
  p->rnr_retry_count = rep.rnr_retry_count;
  p->responder_resources = rep.initiator_depth;
  p->initiator_depth = rep.responder_resources;
  if (p->id.qp == nullptr) return;  // the application moves its QP, then rdma_establish
  int error = MoveQpToRts(p, RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
  if (error == 0) {
    error = rdmaemu_cm_establish(p->handle);
    if (error != 0) {
      Log().warn("rdma cm: id {}: sending the RTU failed: {}", p->handle, std::strerror(error));
    }
  }
  if (error == 0) {
    event->event.event = RDMA_CM_EVENT_ESTABLISHED;
    p->state = State::kEstablished;
    return;
  }
  ModifyQpToError(p);
  rdmaemu_cm_reject(p->handle, 28, nullptr, 0);
  event->event.event = RDMA_CM_EVENT_CONNECT_ERROR;
  event->event.status = -error;
  p->connect_error = true;
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  Id* p = Checked(id, "rdma_connect");
  if (p == nullptr) return -1;
  if (p->state != State::kRouteResolved) {
    Log().warn("rdma_connect: id {} is {}: resolve the address (rdma_resolve_addr) and the "
               "route (rdma_resolve_route) first", p->handle, StateName(p->state));
    return Fail(EINVAL);
  }
  if (ValidParam(p, conn_param, "rdma_connect") != 0) return -1;
  bool ud = id->qp_type == IBV_QPT_UD;
  Device* device = p->device;
  p->initiator_depth = conn_param != nullptr && conn_param->initiator_depth != RDMA_MAX_INIT_DEPTH
                           ? conn_param->initiator_depth
                           : device->max_initiator_depth;
  p->responder_resources =
      conn_param != nullptr && conn_param->responder_resources != RDMA_MAX_RESP_RES
          ? conn_param->responder_resources
          : device->max_responder_resources;
  rdmaemu_cm_param param{};
  if (id->qp != nullptr) {
    param.qp_num = id->qp->qp_num;
    param.srq = id->qp->srq != nullptr;
  } else if (conn_param != nullptr) {
    param.qp_num = conn_param->qp_num;
    param.srq = conn_param->srq;
  }
  param.starting_psn = p->psn;
  param.qp_type = WireQpType(p);
  param.responder_resources = p->responder_resources;
  param.initiator_depth = p->initiator_depth;
  if (conn_param != nullptr) {
    param.flow_control = conn_param->flow_control;
    param.retry_count = std::min<uint8_t>(conn_param->retry_count, kMaxRetry);
    param.rnr_retry_count = std::min<uint8_t>(conn_param->rnr_retry_count, kMaxRetry);
  } else {
    param.retry_count = kMaxRetry;
    param.rnr_retry_count = kMaxRetry;
  }
  param.path_mtu = p->path_mtu;
  param.local_ack_timeout =
      p->ack_timeout >= 0 ? static_cast<uint8_t>(p->ack_timeout) : kDefaultAckTimeout;
  if (SetPrivateData(&param, p->connect_data, conn_param, ud ? kSidrReqPrivateData : kReqPrivateData,
                     "rdma_connect", ud ? "SIDR_REQ (RDMA_PS_UDP)" : "REQ (RDMA_PS_TCP)") != 0) {
    return -1;
  }
  p->qp_timeout = param.local_ack_timeout;
  p->retry_count = param.retry_count;
  sockaddr_in dst;
  std::memcpy(&dst, &id->route.addr.dst_sin, sizeof dst);
  if (int error = rdmaemu_cm_connect(p->handle, &dst, &param); error != 0) {
    Log().warn("rdma_connect: id {} to {}: {}", p->handle, AddressString(dst),
               std::strerror(error));
    return Fail(error);
  }
  p->state = State::kConnect;
  p->connect_data.clear();
  return Complete(p);
}

int rdma_listen(rdma_cm_id* id, int backlog) {
  Id* p = Checked(id, "rdma_listen");
  if (p == nullptr) return -1;
  if (p->state == State::kIdle) {
    // As the kernel: an unbound listener binds the any-address first.
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (BindIpv4(p, any) != 0) return -1;
  } else if (p->state != State::kBound) {
    Log().warn("rdma_listen: id {} is {}: listen on a bound id, once", p->handle,
               StateName(p->state));
    return Fail(EINVAL);
  }
  if (int error = rdmaemu_cm_listen(p->handle, backlog); error != 0) {
    Log().warn("rdma_listen: id {} on {}: {}", p->handle, AddressString(id->route.addr.src_sin),
               std::strerror(error));
    return Fail(error);
  }
  p->state = State::kListen;
  return 0;
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  Id* p = Checked(id, "rdma_accept");
  if (p == nullptr) return -1;
  if (p->state != State::kRequest) {
    Log().warn("rdma_accept: id {} is {}, not a connection request: accept the id a "
               "CONNECT_REQUEST event brings (event->id)", p->handle, StateName(p->state));
    return Fail(EINVAL);
  }
  if (id->qp == nullptr && conn_param == nullptr) {
    Log().warn("rdma_accept: id {} has no QP and no rdma_conn_param (its qp_num)", p->handle);
    return Fail(EINVAL);
  }
  if (ValidParam(p, conn_param, "rdma_accept") != 0) return -1;
  bool ud = id->qp_type == IBV_QPT_UD;
  Device* device = p->device;
  uint8_t max_init = device != nullptr ? device->max_initiator_depth : 0;
  uint8_t max_resp = device != nullptr ? device->max_responder_resources : 0;
  p->initiator_depth = conn_param == nullptr || conn_param->initiator_depth == RDMA_MAX_INIT_DEPTH
                           ? std::min(p->initiator_depth, max_init)
                           : conn_param->initiator_depth;
  p->responder_resources =
      conn_param == nullptr || conn_param->responder_resources == RDMA_MAX_RESP_RES
          ? std::min(p->responder_resources, max_resp)
          : conn_param->responder_resources;
  rdmaemu_cm_param param{};
  if (SetPrivateData(&param, {}, conn_param, ud ? kSidrRepPrivateData : kRepPrivateData,
                     "rdma_accept", ud ? "SIDR_REP" : "REP") != 0) {
    return -1;
  }
  if (id->qp != nullptr) {
    param.qp_num = id->qp->qp_num;
    param.srq = id->qp->srq != nullptr;
  } else {
    param.qp_num = conn_param->qp_num;
    param.srq = conn_param->srq;
  }
  param.qkey = RDMA_UDP_QKEY;
  if (ud && id->qp != nullptr) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (ibv_query_qp(id->qp, &attr, IBV_QP_QKEY, &init) == 0) param.qkey = attr.qkey;
  }
  param.starting_psn = p->psn;
  param.qp_type = WireQpType(p);
  param.responder_resources = p->responder_resources;
  param.initiator_depth = p->initiator_depth;
  if (conn_param != nullptr) {
    param.flow_control = conn_param->flow_control;
    param.rnr_retry_count = std::min<uint8_t>(conn_param->rnr_retry_count, kMaxRetry);
  } else {
    param.rnr_retry_count = kMaxRetry;
  }
  if (!ud) {
    if (int error = MoveQpToRts(p, p->responder_resources, p->initiator_depth); error != 0) {
      return Fail(error);
    }
  }
  if (int error = rdmaemu_cm_accept(p->handle, &param); error != 0) {
    Log().warn("rdma_accept: id {}: {}", p->handle, std::strerror(error));
    ModifyQpToError(p);
    return Fail(error);
  }
  if (ud) {
    p->state = State::kEstablished;
    return 0;
  }
  p->state = State::kAccepted;
  return Complete(p);
}

static int RejectWithReason(rdma_cm_id* id, const void* private_data, uint8_t private_data_len,
                            uint16_t reason, const char* what) {
  Id* p = Checked(id, what);
  if (p == nullptr) return -1;
  if (p->state != State::kRequest) {
    Log().warn("{}: id {} is {}, not a connection request", what, p->handle,
               StateName(p->state));
    return Fail(EINVAL);
  }
  uint8_t limit = id->qp_type == IBV_QPT_UD ? kSidrRepPrivateData : kRejPrivateData;
  if (private_data == nullptr) private_data_len = 0;
  if (private_data_len > limit) {
    Log().warn("{}: {} bytes of private data; a {} carries at most {}", what, private_data_len,
               id->qp_type == IBV_QPT_UD ? "SIDR_REP" : "REJ", limit);
    return Fail(EINVAL);
  }
  if (int error = rdmaemu_cm_reject(p->handle, reason, private_data, private_data_len);
      error != 0) {
    Log().warn("{}: id {}: {}", what, p->handle, std::strerror(error));
    return Fail(error);
  }
  p->state = State::kDisconnected;
  return 0;
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return RejectWithReason(id, private_data, private_data_len, 28, "rdma_reject");
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  // IBTA's reason 35: vendor option not supported.
  return RejectWithReason(id, private_data, private_data_len, 35, "rdma_reject_ece");
}

int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  Id* p = Checked(id, "rdma_notify");
  if (p == nullptr) return -1;
  if (event != IBV_EVENT_COMM_EST) {
    Log().warn("rdma_notify: id {}: only IBV_EVENT_COMM_EST means something to the CM "
               "(event {})", p->handle, ibv_event_type_str(event));
    return Fail(EINVAL);
  }
  if (int error = rdmaemu_cm_establish(p->handle); error != 0) {
    Log().warn("rdma_notify: id {}: {}", p->handle, std::strerror(error));
    return Fail(error);
  }
  return 0;
}

int rdma_establish(rdma_cm_id* id) {
  Id* p = Checked(id, "rdma_establish");
  if (p == nullptr) return -1;
  if (id->qp != nullptr) {
    Log().warn("rdma_establish: id {} has a QP: the library establishes its connection itself; "
               "rdma_establish is for ids connected without one", p->handle);
    return Fail(EINVAL);
  }
  if (int error = rdmaemu_cm_establish(p->handle); error != 0) {
    Log().warn("rdma_establish: id {}: {}", p->handle, std::strerror(error));
    return Fail(error);
  }
  p->state = State::kEstablished;
  return 0;
}

int rdma_disconnect(rdma_cm_id* id) {
  Id* p = Checked(id, "rdma_disconnect");
  if (p == nullptr) return -1;
  if (id->verbs == nullptr) {
    Log().warn("rdma_disconnect: id {} is {}: there is no connection", p->handle,
               StateName(p->state));
    return Fail(EINVAL);
  }
  if (int error = ModifyQpToError(p); error != 0) return Fail(error);
  if (int error = rdmaemu_cm_disconnect(p->handle); error != 0) {
    Log().warn("rdma_disconnect: id {} is {}: {}", p->handle, StateName(p->state),
               std::strerror(error));
    return Fail(error);
  }
  p->state = State::kDisconnected;
  return Complete(p);
}

}  // extern "C"
