// The synchronous API: the sync-mode completion every blocking call ends
// with (rdma-core's ucma_complete), rdma_create_ep, rdma_destroy_ep and
// rdma_get_request.
//
// An id created without a channel (rdma_create_id(NULL, ...),
// rdma_create_ep) has a private one; rdma_resolve_addr, rdma_resolve_route,
// rdma_connect, rdma_accept and rdma_disconnect then wait for their event
// on it and leave it in id->event. If the application made the private fd
// non-blocking, they return -1/EAGAIN instead and the event comes later.
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cstring>

#include "verbs/rdmacm/id.h"
#include "verbs/rdmacm/library.h"

namespace rdmaemu::rdmacm {

int Complete(Id* p) {
  if (!p->sync) return 0;
  if (p->id.event != nullptr) {
    rdma_ack_cm_event(p->id.event);
    p->id.event = nullptr;
  }
  if (rdma_get_cm_event(p->id.channel, &p->id.event) != 0) return -1;
  const rdma_cm_event* event = p->id.event;
  if (event->status == 0) return 0;
  if (event->event == RDMA_CM_EVENT_REJECTED) return Fail(ECONNREFUSED);
  return Fail(event->status < 0 ? -event->status : event->status);
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (listen == nullptr || id == nullptr) {
    Log().warn("rdma_get_request: a NULL argument");
    return Fail(EINVAL);
  }
  if (!LiveId(listen, "rdma_get_request")) return Fail(EINVAL);
  Id* p = ToId(listen);
  if (!p->sync) {
    Log().warn("rdma_get_request: id {} is on an application's event channel: "
               "rdma_get_request is for ids without one (rdma_create_ep, or "
               "rdma_create_id with a NULL channel)", p->handle);
    return Fail(EINVAL);
  }
  if (listen->event != nullptr) {
    rdma_ack_cm_event(listen->event);
    listen->event = nullptr;
  }
  rdma_cm_event* event;
  if (rdma_get_cm_event(listen->channel, &event) != 0) return -1;
  int error = 0;
  if (event->event == RDMA_CM_EVENT_REJECTED) {
    error = ECONNREFUSED;
  } else if (event->status != 0) {
    error = event->status < 0 ? -event->status : event->status;
  } else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    Log().warn("rdma_get_request: id {} got {}, not a connection request", p->handle,
               rdma_event_str(event->event));
    error = EINVAL;
  } else if (p->has_qp_init_attr) {
    ibv_qp_init_attr attr = p->qp_init_attr;
    if (rdma_create_qp(event->id, listen->pd, &attr) != 0) error = errno;
  }
  if (error != 0) {
    listen->event = event;
    return Fail(error);
  }
  *id = event->id;
  (*id)->event = event;
  return 0;
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd,
                   ibv_qp_init_attr* qp_init_attr) {
  if (int error = Init(); error != 0) return Fail(error);
  if (id == nullptr || res == nullptr) {
    Log().warn("rdma_create_ep: a NULL argument");
    return Fail(EINVAL);
  }
  auto ps = static_cast<rdma_port_space>(res->ai_port_space);
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB) {
    Log().warn("rdma_create_ep: ai_port_space {:#x} is not a port space", res->ai_port_space);
    return Fail(EINVAL);
  }
  Id* p = NewId(nullptr, nullptr, ps, static_cast<ibv_qp_type>(res->ai_qp_type));
  if (p == nullptr) return -1;
  rdma_cm_id* cm_id = &p->id;
  int ret = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    if (res->ai_src_addr == nullptr) {
      Log().warn("rdma_create_ep: a passive rdma_addrinfo without ai_src_addr");
      errno = EINVAL;
      ret = -1;
    } else {
      ret = rdma_bind_addr(cm_id, res->ai_src_addr);
    }
    if (ret == 0) {
      if (pd != nullptr) cm_id->pd = pd;
      if (qp_init_attr != nullptr) {
        p->qp_init_attr = *qp_init_attr;
        p->qp_init_attr.qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
        p->has_qp_init_attr = true;
      }
    }
  } else {
    ret = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (ret == 0) {
      if (res->ai_route_len > 0) {
        ret = rdma_set_option(cm_id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, res->ai_route,
                              res->ai_route_len);
        if (ret == 0) ret = Complete(p);
      } else {
        ret = rdma_resolve_route(cm_id, 2000);
      }
    }
    if (ret == 0 && qp_init_attr != nullptr) {
      qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      ret = rdma_create_qp(cm_id, pd, qp_init_attr);
    }
    if (ret == 0 && res->ai_connect_len > 0 && res->ai_connect != nullptr) {
      auto* bytes = static_cast<const uint8_t*>(res->ai_connect);
      p->connect_data.assign(bytes, bytes + res->ai_connect_len);
    }
  }
  if (ret != 0) {
    int error = errno;
    rdma_destroy_ep(cm_id);
    return Fail(error);
  }
  *id = cm_id;
  return 0;
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (id == nullptr) {
    Log().warn("rdma_destroy_ep: the id is NULL");
    return;
  }
  if (!LiveId(id, "rdma_destroy_ep")) return;
  if (id->qp != nullptr) rdma_destroy_qp(id);
  if (id->srq != nullptr) rdma_destroy_srq(id);
  rdma_destroy_id(id);
}

}  // extern "C"
