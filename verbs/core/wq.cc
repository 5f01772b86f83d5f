// Work queues and receive indirection tables. verbs.h's inline wrappers
// (ibv_create_wq, ibv_destroy_wq, …) call these through the verbs_context
// slots; ibv_create_wq initialises the WQ's mutex, cond and event count
// itself after the slot returns.
#include <cerrno>

#include "provider/provider.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {
namespace {

using provider::Kind;
using provider::LiveHandle;

ibv_wq* CreateWq(ibv_context* context, ibv_wq_init_attr* attr) {
  auto wq = provider::CreateWq(context, attr);
  if (!wq.ok()) return FailWith<ibv_wq>(wq.status().code());
  return *wq;
}

int ModifyWq(ibv_wq* wq, ibv_wq_attr* attr) {
  if (!LiveHandle(wq, Kind::kWq, "ibv_modify_wq")) return FailInt(kNoSuchObject);
  return provider::ModifyWq(wq, attr);
}

// As rdma-core's ibv_cmd_destroy_wq: once the device has let go of the WQ,
// wait until every WQ_FATAL the application read is acknowledged; events
// still queued are discarded with their fd counts.
int DestroyWq(ibv_wq* wq) {
  if (!LiveHandle(wq, Kind::kWq, "ibv_destroy_wq")) return FailInt(kNoSuchObjectToDestroy);
  if (int rc = provider::DetachWq(wq); rc != 0) return FailInt(rc);
  unsigned reported = Private(wq->context)->async_events.Discard(wq);
  WaitForAcks(&wq->mutex, &wq->cond, &wq->events_completed, reported, nullptr, 0, "wq", wq);
  provider::FreeWq(wq);
  return 0;
}

ibv_rwq_ind_table* CreateRwqIndTable(ibv_context* context, ibv_rwq_ind_table_init_attr* attr) {
  auto table = provider::CreateRwqIndTable(context, attr);
  if (!table.ok()) return FailWith<ibv_rwq_ind_table>(table.status().code());
  return *table;
}

int DestroyRwqIndTable(ibv_rwq_ind_table* table) {
  if (!LiveHandle(table, Kind::kRwqIndTable, "ibv_destroy_rwq_ind_table")) {
    return FailInt(kNoSuchObjectToDestroy);
  }
  return provider::DestroyRwqIndTable(table);
}

}  // namespace

void InstallWqSlots(verbs_context* vctx) {
  vctx->create_wq = CreateWq;
  vctx->modify_wq = ModifyWq;
  vctx->destroy_wq = DestroyWq;
  vctx->create_rwq_ind_table = CreateRwqIndTable;
  vctx->destroy_rwq_ind_table = DestroyRwqIndTable;
}

}  // namespace rdmaemu::verbs
