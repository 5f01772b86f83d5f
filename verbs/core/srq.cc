// Shared receive queues.
#include <cerrno>

#include "provider/provider.h"
#include "verbs/core/library.h"

using namespace rdmaemu;
using namespace rdmaemu::verbs;
using rdmaemu::provider::Kind;
using rdmaemu::provider::LiveHandle;

extern "C" {

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* srq_init_attr) {
  if (!LiveHandle(pd, Kind::kPd, "ibv_create_srq")) return FailWith<ibv_srq>(kNoSuchObject);
  auto srq = provider::CreateSrq(pd, srq_init_attr);
  if (!srq.ok()) return FailWith<ibv_srq>(srq.status().code());
  return *srq;
}

int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* srq_attr, int srq_attr_mask) {
  if (!LiveHandle(srq, Kind::kSrq, "ibv_modify_srq")) return FailInt(kNoSuchObject);
  return provider::ModifySrq(srq, srq_attr, srq_attr_mask);
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* srq_attr) {
  if (!LiveHandle(srq, Kind::kSrq, "ibv_query_srq")) return FailInt(kNoSuchObject);
  return provider::QuerySrq(srq, srq_attr);
}

int ibv_destroy_srq(ibv_srq* srq) {
  if (!LiveHandle(srq, Kind::kSrq, "ibv_destroy_srq")) return FailInt(kNoSuchObjectToDestroy);
  if (int rc = provider::DetachSrq(srq); rc != 0) return FailInt(rc);
  unsigned reported = Private(srq->context)->async_events.Discard(srq);
  WaitForAcks(&srq->mutex, &srq->cond, &srq->events_completed, reported, nullptr, 0, "srq", srq);
  provider::FreeSrq(srq);
  return 0;
}

}  // extern "C"
