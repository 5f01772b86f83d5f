// A small verbs program for event_test.sh: opens the first device, creates a
// CQ, an SRQ, an RC QP and a WQ, says so, then prints every async event it
// gets (and whether it names one of its own objects) until it has `count`.
// Usage: event_target COUNT
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  int count = argc > 1 ? std::atoi(argv[1]) : 1;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) return std::fprintf(stderr, "no device\n"), 1;
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  ibv_srq* srq = cq ? ibv_create_srq(pd, &sa) : nullptr;
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = srq ? ibv_create_qp(pd, &qa) : nullptr;
  ibv_wq_init_attr wa{};
  wa.wq_type = IBV_WQT_RQ;
  wa.max_wr = 4;
  wa.max_sge = 1;
  wa.pd = pd;
  wa.cq = cq;
  ibv_wq* wq = qp ? ibv_create_wq(ctx, &wa) : nullptr;
  if (wq == nullptr) return std::fprintf(stderr, "setup failed\n"), 1;
  std::printf("ready qpn %u wqn %u\n", qp->qp_num, wq->wq_num);
  std::fflush(stdout);
  for (int i = 0; i < count; ++i) {
    ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev) != 0) return std::perror("ibv_get_async_event"), 1;
    const char* on = "something else";
    switch (ev.event_type) {
      case IBV_EVENT_CQ_ERR: on = ev.element.cq == cq ? "our cq" : "another cq"; break;
      case IBV_EVENT_SRQ_ERR: case IBV_EVENT_SRQ_LIMIT_REACHED:
        on = ev.element.srq == srq ? "our srq" : "another srq";
        break;
      case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
      case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
        on = ev.element.qp == qp ? "our qp" : "another qp";
        break;
      case IBV_EVENT_WQ_FATAL: on = ev.element.wq == wq ? "our wq" : "another wq"; break;
      default:
        on = "a port or the device";
    }
    std::printf("%s on %s\n", ibv_event_type_str(ev.event_type), on);
    std::fflush(stdout);
    ibv_ack_async_event(&ev);
  }
  ibv_destroy_wq(wq);
  ibv_destroy_qp(qp);
  ibv_destroy_srq(srq);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
