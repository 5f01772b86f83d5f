// Every op slot a program can reach through verbs.h's inline functions is
// non-NULL, as in rdma-core: a slot the provider does not implement fails
// cleanly with EOPNOTSUPP instead of crashing the caller.
#include <cerrno>

#include "emulator/base/log.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {
namespace {

void Unsupported(const char* what) {
  RDMAEMU_WARN_LIMITED("{} is not supported by the emulated device", what);
}

#define FAIL_INT(what) \
  do {                 \
    Unsupported(what); \
    return EOPNOTSUPP; \
  } while (0)
#define FAIL_PTR(what)    \
  do {                    \
    Unsupported(what);    \
    errno = EOPNOTSUPP;   \
    return nullptr;       \
  } while (0)

void* CompatVoid() { FAIL_PTR("a pre-1.1 libibverbs op"); }

ibv_mw* AllocMw(ibv_pd*, ibv_mw_type) { FAIL_PTR("ibv_alloc_mw"); }
int BindMw(ibv_qp*, ibv_mw*, ibv_mw_bind*) { FAIL_INT("ibv_bind_mw"); }
int DeallocMw(ibv_mw*) { FAIL_INT("ibv_dealloc_mw"); }
int PollCq(ibv_cq*, int, ibv_wc*) {
  Unsupported("ibv_poll_cq");
  return -1;
}
int ReqNotifyCq(ibv_cq*, int) { FAIL_INT("ibv_req_notify_cq"); }
int PostSrqRecv(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  *bad = wr;
  FAIL_INT("ibv_post_srq_recv");
}
int PostSend(ibv_qp*, ibv_send_wr* wr, ibv_send_wr** bad) {
  *bad = wr;
  FAIL_INT("ibv_post_send");
}
int PostRecv(ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  *bad = wr;
  FAIL_INT("ibv_post_recv");
}

int QueryPort(ibv_context*, uint8_t, ibv_port_attr*, size_t) { FAIL_INT("ibv_query_port"); }
int AdviseMr(ibv_pd*, ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t) { FAIL_INT("ibv_advise_mr"); }
ibv_mr* AllocNullMr(ibv_pd*) { FAIL_PTR("ibv_alloc_null_mr"); }
int ReadCounters(ibv_counters*, uint64_t*, uint32_t, uint32_t) { FAIL_INT("ibv_read_counters"); }
int AttachCountersPointFlow(ibv_counters*, ibv_counter_attach_attr*, ibv_flow*) {
  FAIL_INT("ibv_attach_counters_point_flow");
}
ibv_counters* CreateCounters(ibv_context*, ibv_counters_init_attr*) { FAIL_PTR("ibv_create_counters"); }
int DestroyCounters(ibv_counters*) { FAIL_INT("ibv_destroy_counters"); }
int ModifyFlowActionEsp(ibv_flow_action*, ibv_flow_action_esp_attr*) {
  FAIL_INT("ibv_modify_flow_action_esp");
}
int DestroyFlowAction(ibv_flow_action*) { FAIL_INT("ibv_destroy_flow_action"); }
ibv_flow_action* CreateFlowActionEsp(ibv_context*, ibv_flow_action_esp_attr*) {
  FAIL_PTR("ibv_create_flow_action_esp");
}
int ModifyQpRateLimit(ibv_qp*, ibv_qp_rate_limit_attr*) { FAIL_INT("ibv_modify_qp_rate_limit"); }
int ModifyCq(ibv_cq*, ibv_modify_cq_attr*) { FAIL_INT("ibv_modify_cq"); }
int PostSrqOps(ibv_srq*, ibv_ops_wr* op, ibv_ops_wr** bad) {
  *bad = op;
  FAIL_INT("ibv_post_srq_ops");
}
int QueryRtValues(ibv_context*, ibv_values_ex*) { FAIL_INT("ibv_query_rt_values_ex"); }
ibv_cq_ex* CreateCqEx(ibv_context*, ibv_cq_init_attr_ex*) { FAIL_PTR("ibv_create_cq_ex"); }
int QueryDeviceEx(ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*, size_t) {
  FAIL_INT("ibv_query_device_ex");
}
int DestroyFlow(ibv_flow*) { FAIL_INT("ibv_destroy_flow"); }
ibv_flow* CreateFlow(ibv_qp*, ibv_flow_attr*) { FAIL_PTR("ibv_create_flow"); }
ibv_qp* OpenQp(ibv_context*, ibv_qp_open_attr*) { FAIL_PTR("ibv_open_qp"); }
ibv_qp* CreateQpEx(ibv_context*, ibv_qp_init_attr_ex*) { FAIL_PTR("ibv_create_qp_ex"); }
int GetSrqNum(ibv_srq*, uint32_t*) { FAIL_INT("ibv_get_srq_num"); }
ibv_srq* CreateSrqEx(ibv_context*, ibv_srq_init_attr_ex*) { FAIL_PTR("ibv_create_srq_ex"); }
ibv_xrcd* OpenXrcd(ibv_context*, ibv_xrcd_init_attr*) { FAIL_PTR("ibv_open_xrcd"); }
int CloseXrcd(ibv_xrcd*) { FAIL_INT("ibv_close_xrcd"); }

}  // namespace

void InstallDummyOps(verbs_context* vctx) {
  using Compat = void* (*)();
  ibv_context_ops& ops = vctx->context.ops;
  ops._compat_alloc_pd = ops._compat_dealloc_pd = ops._compat_reg_mr = ops._compat_rereg_mr =
      ops._compat_dereg_mr = ops._compat_create_cq = ops._compat_cq_event =
          ops._compat_resize_cq = ops._compat_destroy_cq = ops._compat_create_srq =
              ops._compat_modify_srq = ops._compat_query_srq = ops._compat_destroy_srq =
                  ops._compat_create_qp = ops._compat_query_qp = ops._compat_modify_qp =
                      ops._compat_destroy_qp = ops._compat_create_ah = ops._compat_destroy_ah =
                          ops._compat_attach_mcast = ops._compat_detach_mcast =
                              ops._compat_async_event = static_cast<Compat>(CompatVoid);
  ops.alloc_mw = AllocMw;
  ops.bind_mw = BindMw;
  ops.dealloc_mw = DeallocMw;
  ops.poll_cq = PollCq;
  ops.req_notify_cq = ReqNotifyCq;
  ops.post_srq_recv = PostSrqRecv;
  ops.post_send = PostSend;
  ops.post_recv = PostRecv;

  vctx->query_port = QueryPort;
  vctx->advise_mr = AdviseMr;
  vctx->alloc_null_mr = AllocNullMr;
  vctx->read_counters = ReadCounters;
  vctx->attach_counters_point_flow = AttachCountersPointFlow;
  vctx->create_counters = CreateCounters;
  vctx->destroy_counters = DestroyCounters;
  vctx->modify_flow_action_esp = ModifyFlowActionEsp;
  vctx->destroy_flow_action = DestroyFlowAction;
  vctx->create_flow_action_esp = CreateFlowActionEsp;
  vctx->modify_qp_rate_limit = ModifyQpRateLimit;
  // alloc_td, dealloc_td and alloc_parent_domain are the provider's (domain.cc).
  vctx->modify_cq = ModifyCq;
  vctx->post_srq_ops = PostSrqOps;
  vctx->query_rt_values = QueryRtValues;
  vctx->create_cq_ex = CreateCqEx;
  // create_wq, modify_wq, destroy_wq and the indirection-table slots are
  // always the library's own (wq.cc).
  vctx->query_device_ex = QueryDeviceEx;
  vctx->ibv_destroy_flow = DestroyFlow;
  vctx->ibv_create_flow = CreateFlow;
  // Apps built against libibverbs 1.1.8 call flows through the placeholders.
  vctx->ABI_placeholder1 = reinterpret_cast<void (*)()>(CreateFlow);
  vctx->ABI_placeholder2 = reinterpret_cast<void (*)()>(DestroyFlow);
  vctx->open_qp = OpenQp;
  vctx->create_qp_ex = CreateQpEx;
  vctx->get_srq_num = GetSrqNum;
  vctx->create_srq_ex = CreateSrqEx;
  vctx->open_xrcd = OpenXrcd;
  vctx->close_xrcd = CloseXrcd;
}

}  // namespace rdmaemu::verbs
