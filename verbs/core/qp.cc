// Queue pairs and address handles.
#include <cerrno>

#include "provider/check/check.h"
#include "provider/check/ops.h"
#include "provider/provider.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {

ibv_qp* LibCreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  // The checker judges what the program asked for, not what the device
  // rounded it up to.
  const ibv_qp_init_attr_ex requested = *attr;
  auto qp = provider::CreateQp(context, attr);
  if (!qp.ok()) return FailWith<ibv_qp>(qp.status().code());
  if (check::On()) check::QpCreated(*qp, requested, attr->cap.max_send_wr);
  return *qp;
}

}  // namespace rdmaemu::verbs

using namespace rdmaemu;
using namespace rdmaemu::verbs;
using rdmaemu::provider::Kind;
using rdmaemu::provider::LiveHandle;

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!LiveHandle(pd, Kind::kPd, "ibv_create_qp")) return FailWith<ibv_qp>(kNoSuchObject);
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = qp_init_attr->qp_context;
  ex.send_cq = qp_init_attr->send_cq;
  ex.recv_cq = qp_init_attr->recv_cq;
  ex.srq = qp_init_attr->srq;
  ex.cap = qp_init_attr->cap;
  ex.qp_type = qp_init_attr->qp_type;
  ex.sq_sig_all = qp_init_attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = LibCreateQpEx(pd->context, &ex);
  // As rdma-core, report the capabilities the QP got.
  if (qp != nullptr) qp_init_attr->cap = ex.cap;
  return qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (!LiveHandle(qp, Kind::kQp, "ibv_modify_qp")) return FailInt(kNoSuchObject);
  return provider::ModifyQp(qp, attr, attr_mask);
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  if (!LiveHandle(qp, Kind::kQp, "ibv_query_qp")) return FailInt(kNoSuchObject);
  return provider::QueryQp(qp, attr, attr_mask, init_attr);
}

int ibv_destroy_qp(ibv_qp* qp) {
  if (!LiveHandle(qp, Kind::kQp, "ibv_destroy_qp")) return FailInt(kNoSuchObjectToDestroy);
  if (int rc = provider::DetachQp(qp); rc != 0) return FailInt(rc);
  unsigned reported = Private(qp->context)->async_events.Discard(qp);
  WaitForAcks(&qp->mutex, &qp->cond, &qp->events_completed, reported, nullptr, 0, "qp", qp);
  if (check::On()) check::QpDestroyed(qp);
  provider::FreeQp(qp);
  return 0;
}

int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (!LiveHandle(qp, Kind::kQp, "ibv_attach_mcast")) return FailInt(kNoSuchObject);
  if (gid == nullptr) return EINVAL;
  return provider::AttachMcast(qp, *gid, lid);
}

int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (!LiveHandle(qp, Kind::kQp, "ibv_detach_mcast")) return FailInt(kNoSuchObject);
  if (gid == nullptr) return EINVAL;
  return provider::DetachMcast(qp, *gid, lid);
}

ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!LiveHandle(pd, Kind::kPd, "ibv_create_ah")) return FailWith<ibv_ah>(kNoSuchObject);
  auto ah = provider::CreateAh(pd, *attr);
  if (!ah.ok()) return FailWith<ibv_ah>(ah.status().code());
  return *ah;
}

int ibv_destroy_ah(ibv_ah* ah) {
  if (!LiveHandle(ah, Kind::kAh, "ibv_destroy_ah")) return FailInt(kNoSuchObjectToDestroy);
  return provider::DestroyAh(ah);
}

// NULL (errno untouched, as rdma-core) for a QP created without
// IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (!LiveHandle(qp, Kind::kQp, "ibv_qp_to_qp_ex")) return FailWith<ibv_qp_ex>(kNoSuchObject);
  return provider::QpToQpEx(qp);
}

}  // extern "C"
