// Internal: each provider module installs its own op slots.
#pragma once

#include <infiniband/verbs.h>

namespace rdmaemu::provider {

void InstallCqOps(verbs_context* vctx);
void InstallQpOps(verbs_context* vctx);
void InstallSrqOps(verbs_context* vctx);
// ibv_alloc_mw, ibv_bind_mw, ibv_dealloc_mw (mw.cc).
void InstallMwOps(verbs_context* vctx);
// ibv_advise_mr (memory.cc).
void InstallMemoryOps(verbs_context* vctx);
// ibv_alloc_dm, ibv_free_dm, ibv_reg_dm_mr and the DM's copy functions (dm.cc).
void InstallDmOps(verbs_context* vctx);
// ibv_create_flow, ibv_destroy_flow (flow.cc).
void InstallFlowOps(verbs_context* vctx);

}  // namespace rdmaemu::provider
