/* A correct program: signaled writes polled before the buffer is touched,
 * an armed CQ waited on through its channel, every event acknowledged,
 * everything destroyed. Under --check=error it prints nothing, exits 0. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 1);
  connect_pair(&p, 8, 8);
  for (int i = 0; i < 10; ++i) {
    memset(p.buf, 'a' + i, 64);
    if (post_write(&p, i, 64, 1)) die("post_write");
    struct ibv_wc wc = wait_wc(&p);
    if (wc.status != IBV_WC_SUCCESS) die("completion");
  }
  if (ibv_req_notify_cq(p.cq, 0)) die("ibv_req_notify_cq");
  if (post_write(&p, 99, 64, 1)) die("post_write");
  struct ibv_cq *cq;
  void *cq_context;
  if (ibv_get_cq_event(p.channel, &cq, &cq_context)) die("ibv_get_cq_event");
  ibv_ack_cq_events(cq, 1);
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
