// QPs and SRQs of cm ids: rdma_create_qp(_ex), rdma_destroy_qp,
// rdma_init_qp_attr, rdma_create_srq(_ex), rdma_destroy_srq.
//
// The attributes are the ones the kernel's CM gives on RoCE (research note
// §2.4): INIT {pkey_index 0, port, access 0 before the peer is known, else
// REMOTE_WRITE plus REMOTE_READ|REMOTE_ATOMIC iff responder resources};
// RTR {AV to the peer's IPv4-mapped GID, the connection's MTU, the peer's
// QPN, our own starting PSN, max_dest_rd_atomic, min_rnr_timer 0}; RTS
// {the peer's starting PSN, the REQ's ACK timeout and retry count, the
// peer's RNR retry count, max_rd_atomic}. UD: INIT with RDMA_UDP_QKEY, RTR,
// RTS with sq_psn 0.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cstring>

#include "verbs/rdmacm/address.h"
#include "verbs/rdmacm/id.h"
#include "verbs/rdmacm/library.h"
#include "verbs/rdmacm/multicast.h"

namespace rdmaemu::rdmacm {
namespace {

// Returns 0 or an errno value, having logged why.
int InitQpAttr(Id* p, ibv_qp_attr* attr, int* mask) {
  ibv_qp_state want = attr->qp_state;
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = want;
  if (p->id.verbs == nullptr) {
    Log().warn("rdma_init_qp_attr: id {} is not on a device yet (bind or resolve it first)",
               p->handle);
    return EINVAL;
  }
  bool ud = p->id.qp_type == IBV_QPT_UD;
  // What the kernel's ib_cm_init_qp_attr gives XRC: a target is RC's
  // responder (RTR's read depth; RTS only the timeout), an initiator
  // RC's requester (RTS's retries and read depth).
  bool responder = p->id.qp_type == IBV_QPT_RC || p->id.qp_type == IBV_QPT_XRC_RECV;
  bool requester = p->id.qp_type == IBV_QPT_RC || p->id.qp_type == IBV_QPT_XRC_SEND;
  switch (want) {
    case IBV_QPS_INIT:
      attr->pkey_index = 0;
      attr->port_num = p->id.port_num;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        attr->qkey = RDMA_UDP_QKEY;
        *mask |= IBV_QP_QKEY;
      } else {
        attr->qp_access_flags = 0;
        if (p->have_peer) {
          attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
          if (p->responder_resources != 0) {
            attr->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
          }
        }
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      *mask = IBV_QP_STATE;
      if (ud) return 0;
      if (!p->have_peer) {
        Log().warn("rdma_init_qp_attr: id {} has no peer yet (RTR needs the connection "
                   "request or response)", p->handle);
        return EINVAL;
      }
      attr->ah_attr.is_global = 1;
      std::memcpy(attr->ah_attr.grh.dgid.raw, p->id.route.addr.addr.ibaddr.dgid.raw, 16);
      attr->ah_attr.grh.sgid_index = 0;
      attr->ah_attr.grh.hop_limit = kHopLimit;
      attr->ah_attr.grh.traffic_class = p->tos;
      attr->ah_attr.port_num = p->id.port_num;
      attr->path_mtu = static_cast<ibv_mtu>(p->path_mtu);
      attr->dest_qp_num = p->peer_qpn;
      attr->rq_psn = p->psn;
      *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (responder) {
        attr->max_dest_rd_atomic = p->responder_resources;
        attr->min_rnr_timer = 0;
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (ud) {
        attr->sq_psn = 0;
        return 0;
      }
      if (!p->have_peer) {
        Log().warn("rdma_init_qp_attr: id {} has no peer yet (RTS needs the connection "
                   "request or response)", p->handle);
        return EINVAL;
      }
      attr->sq_psn = p->peer_psn;
      if (p->id.qp_type == IBV_QPT_XRC_RECV) {
        attr->timeout = p->qp_timeout;
        *mask |= IBV_QP_TIMEOUT;
      }
      if (requester) {
        attr->timeout = p->qp_timeout;
        attr->retry_cnt = std::min<uint8_t>(p->retry_count, kMaxRetry);
        attr->rnr_retry = std::min<uint8_t>(p->rnr_retry_count, kMaxRetry);
        attr->max_rd_atomic = p->initiator_depth;
        *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default:
      Log().warn("rdma_init_qp_attr: id {}: the CM gives attributes for INIT, RTR and RTS only",
                 p->handle);
      return EINVAL;
  }
}

// Moves a QP the way rdma_init_qp_attr says for `state`; 0 or errno value.
int MoveQp(Id* p, ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr attr{};
  attr.qp_state = state;
  int mask = 0;
  if (int error = InitQpAttr(p, &attr, &mask); error != 0) return error;
  if (int error = ibv_modify_qp(qp, &attr, mask); error != 0) {
    Log().warn("rdma cm: id {}: moving qp {} to state {} failed: {}", p->handle, qp->qp_num,
               static_cast<int>(state), std::strerror(error));
    return error;
  }
  return 0;
}

void DestroyCqs(rdma_cm_id* id) {
  // An XRC target's receive CQ is its XRC SRQ's: it goes with the SRQ.
  if (id->qp_type == IBV_QPT_XRC_RECV && id->srq != nullptr) return;
  if (id->recv_cq != nullptr) {
    ibv_destroy_cq(id->recv_cq);
    if (id->send_cq != nullptr && id->send_cq != id->recv_cq) ibv_destroy_cq(id->send_cq);
    id->recv_cq = nullptr;
    id->send_cq = nullptr;
  } else if (id->send_cq != nullptr) {
    ibv_destroy_cq(id->send_cq);
    id->send_cq = nullptr;
  }
  if (id->recv_cq_channel != nullptr) {
    ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel != nullptr && id->send_cq_channel != id->recv_cq_channel) {
      ibv_destroy_comp_channel(id->send_cq_channel);
    }
    id->recv_cq_channel = nullptr;
    id->send_cq_channel = nullptr;
  } else if (id->send_cq_channel != nullptr) {
    ibv_destroy_comp_channel(id->send_cq_channel);
    id->send_cq_channel = nullptr;
  }
}

// A comp channel and a CQ (cq_context = id, as rdma_get_*_comp assert) for
// each size that is not 0. Returns 0 or -1 with errno.
int CreateCqs(rdma_cm_id* id, uint32_t send_size, uint32_t recv_size) {
  if (recv_size != 0) {
    id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
    if (id->recv_cq_channel == nullptr) goto fail;
    id->recv_cq = ibv_create_cq(id->verbs, static_cast<int>(recv_size), id, id->recv_cq_channel, 0);
    if (id->recv_cq == nullptr) goto fail;
  }
  if (send_size != 0) {
    id->send_cq_channel = ibv_create_comp_channel(id->verbs);
    if (id->send_cq_channel == nullptr) goto fail;
    id->send_cq = ibv_create_cq(id->verbs, static_cast<int>(send_size), id, id->send_cq_channel, 0);
    if (id->send_cq == nullptr) goto fail;
  }
  return 0;
fail:
  int error = errno;
  Log().warn("rdma_create_qp: creating the id's completion queues failed: {}",
             std::strerror(error));
  DestroyCqs(id);
  return Fail(error);
}

}  // namespace

int ModifyQpToError(Id* id) {
  if (id->id.qp == nullptr) return 0;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return ibv_modify_qp(id->id.qp, &attr, IBV_QP_STATE);
}

// For connect.cc: INIT→INIT (access flags), RTR and RTS with the
// negotiated depths. 0 or an errno value.
int MoveQpToRts(Id* p, uint8_t responder_resources, uint8_t initiator_depth) {
  ibv_qp* qp = p->id.qp;
  if (qp == nullptr) return 0;
  if (int error = MoveQp(p, qp, IBV_QPS_INIT); error != 0) return error;
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_RTR;
  if (int error = InitQpAttr(p, &attr, &mask); error != 0) return error;
  if (responder_resources != RDMA_MAX_RESP_RES) attr.max_dest_rd_atomic = responder_resources;
  if (int error = ibv_modify_qp(qp, &attr, mask); error != 0) {
    Log().warn("rdma cm: id {}: moving qp {} to RTR failed: {}", p->handle, qp->qp_num,
               std::strerror(error));
    return error;
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  if (int error = InitQpAttr(p, &attr, &mask); error != 0) return error;
  if (initiator_depth != RDMA_MAX_INIT_DEPTH) attr.max_rd_atomic = initiator_depth;
  if (int error = ibv_modify_qp(qp, &attr, mask); error != 0) {
    Log().warn("rdma cm: id {}: moving qp {} to RTS failed: {}", p->handle, qp->qp_num,
               std::strerror(error));
    return error;
  }
  return 0;
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (id == nullptr || qp_attr == nullptr || qp_attr_mask == nullptr) {
    Log().warn("rdma_init_qp_attr: a NULL argument");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_init_qp_attr")) return Fail(EINVAL);
  return FromDevice(InitQpAttr(ToId(id), qp_attr, qp_attr_mask));
}

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr) {
    Log().warn("rdma_create_qp_ex: a NULL argument");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_create_qp_ex")) return Fail(EINVAL);
  Id* p = ToId(id);
  if (id->qp != nullptr) {
    Log().warn("rdma_create_qp: id {} has a QP already (qp {})", p->handle, id->qp->qp_num);
    return Fail(EINVAL);
  }
  if (id->verbs == nullptr) {
    Log().warn("rdma_create_qp: id {} is not on a device yet: bind it to an address, resolve "
               "an address, or take it from a connection request first", p->handle);
    return Fail(EINVAL);
  }
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = id->pd;
  } else if (attr->pd->context != id->verbs) {
    Log().warn("rdma_create_qp: the PD is on another device than id {}", p->handle);
    return Fail(EINVAL);
  }
  if ((id->recv_cq != nullptr && attr->recv_cq != nullptr && id->recv_cq != attr->recv_cq) ||
      (id->send_cq != nullptr && attr->send_cq != nullptr && id->send_cq != attr->send_cq)) {
    Log().warn("rdma_create_qp: id {} has its own CQs already; the attributes name others",
               p->handle);
    return Fail(EINVAL);
  }
  uint32_t send_size = attr->send_cq != nullptr || id->send_cq != nullptr ? 0 : attr->cap.max_send_wr;
  uint32_t recv_size = attr->recv_cq != nullptr || id->recv_cq != nullptr ? 0 : attr->cap.max_recv_wr;
  if (CreateCqs(id, send_size, recv_size) != 0) return -1;
  if (attr->send_cq == nullptr) attr->send_cq = id->send_cq;
  if (attr->recv_cq == nullptr) attr->recv_cq = id->recv_cq;
  if (id->srq != nullptr && attr->srq == nullptr) attr->srq = id->srq;
  if (id->qp_type == IBV_QPT_XRC_RECV && (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || attr->xrcd == nullptr)) {
    attr->xrcd = DeviceXrcd(p->device);
    if (attr->xrcd == nullptr) {
      int error = errno;
      DestroyCqs(id);
      return Fail(error);
    }
    attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
  }
  ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
  if (qp == nullptr) {
    int error = errno;
    Log().warn("rdma_create_qp: ibv_create_qp on id {} failed: {}", p->handle,
               std::strerror(error));
    DestroyCqs(id);
    return Fail(error);
  }
  int error = MoveQp(p, qp, IBV_QPS_INIT);
  if (error == 0 && id->qp_type == IBV_QPT_UD) {
    error = MoveQp(p, qp, IBV_QPS_RTR);
    if (error == 0) error = MoveQp(p, qp, IBV_QPS_RTS);
  }
  if (error != 0) {
    ibv_destroy_qp(qp);
    DestroyCqs(id);
    return Fail(error);
  }
  id->pd = qp->pd;
  id->qp = qp;
  return 0;
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || qp_init_attr == nullptr) {
    Log().warn("rdma_create_qp: a NULL argument");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_create_qp")) return Fail(EINVAL);
  ibv_qp_init_attr_ex attr_ex{};
  std::memcpy(&attr_ex, qp_init_attr, sizeof *qp_init_attr);
  attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  attr_ex.pd = pd != nullptr ? pd : id->pd;
  int ret = rdma_create_qp_ex(id, &attr_ex);
  std::memcpy(qp_init_attr, &attr_ex, sizeof *qp_init_attr);
  return ret;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  if (id == nullptr) {
    Log().warn("rdma_destroy_qp: the id is NULL");
    return;
  }
  if (!LiveId(id, "rdma_destroy_qp")) return;
  if (id->qp != nullptr) {
    // Its groups' memberships stay with the id, attached to no QP.
    DetachAll(ToId(id));
    if (int error = ibv_destroy_qp(id->qp); error != 0) {
      Log().warn("rdma_destroy_qp: ibv_destroy_qp failed: {}", std::strerror(error));
    }
    id->qp = nullptr;
  }
  DestroyCqs(id);
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr) {
    Log().warn("rdma_create_srq_ex: a NULL argument");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_create_srq_ex")) return Fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) {
    Log().warn("rdma_create_srq_ex: the attributes must say the SRQ's type "
               "(IBV_SRQ_INIT_ATTR_TYPE)");
    return Fail(EINVAL);
  }
  if (id->verbs == nullptr) {
    Log().warn("rdma_create_srq: id {} is not on a device yet", ToId(id)->handle);
    return Fail(EINVAL);
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->pd = id->pd;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  bool made_cq = false;
  if (attr->srq_type == IBV_SRQT_XRC) {
    // The device's XRC domain and the id's receive CQ unless given, as
    // rdma-core's rdma_create_srq_ex.
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || attr->xrcd == nullptr) {
      attr->xrcd = DeviceXrcd(ToId(id)->device);
      if (attr->xrcd == nullptr) return -1;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || attr->cq == nullptr) {
      if (id->recv_cq == nullptr) {
        if (CreateCqs(id, 0, attr->attr.max_wr) != 0) return -1;
        made_cq = true;
      }
      attr->cq = id->recv_cq;
    }
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  }
  ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
  if (srq == nullptr) {
    int error = errno;
    Log().warn("rdma_create_srq: ibv_create_srq failed: {}", std::strerror(error));
    if (made_cq) DestroyCqs(id);
    return Fail(error);
  }
  if (id->pd == nullptr) id->pd = attr->pd;
  id->srq = srq;
  return 0;
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (id == nullptr || attr == nullptr) {
    Log().warn("rdma_create_srq: a NULL argument");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_create_srq")) return Fail(EINVAL);
  ibv_srq_init_attr_ex attr_ex{};
  std::memcpy(&attr_ex, attr, sizeof *attr);
  attr_ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  attr_ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  attr_ex.pd = pd;
  int ret = rdma_create_srq_ex(id, &attr_ex);
  std::memcpy(attr, &attr_ex, sizeof *attr);
  return ret;
}

void rdma_destroy_srq(rdma_cm_id* id) {
  if (id == nullptr) {
    Log().warn("rdma_destroy_srq: the id is NULL");
    return;
  }
  if (!LiveId(id, "rdma_destroy_srq")) return;
  if (id->srq != nullptr) {
    if (int error = ibv_destroy_srq(id->srq); error != 0) {
      Log().warn("rdma_destroy_srq: ibv_destroy_srq failed: {}", std::strerror(error));
    }
    id->srq = nullptr;
  }
  DestroyCqs(id);
}

}  // extern "C"
