/* Mistake: acknowledging two completion events after getting one (rdma-core's
 * ibv_destroy_cq then waits forever). */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 1);
  connect_pair(&p, 8, 8);
  if (ibv_req_notify_cq(p.cq, 0)) die("ibv_req_notify_cq");
  if (post_write(&p, 1, 64, 1)) die("post_write");
  struct ibv_cq *cq;
  void *cq_context;
  if (ibv_get_cq_event(p.channel, &cq, &cq_context)) die("ibv_get_cq_event");
  ibv_ack_cq_events(cq, 2);
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
