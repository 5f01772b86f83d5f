/* Mistake: waiting for a completion event without arming the CQ first (it
 * hangs forever on a NIC). A second thread arms it after two seconds and
 * posts again, so the program ends. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"

static void *rescue(void *arg) {
  struct pair *p = arg;
  sleep(2);
  if (ibv_req_notify_cq(p->cq, 0)) die("ibv_req_notify_cq");
  if (post_write(p, 2, 64, 1)) die("post_write");
  return NULL;
}

int main(void) {
  struct pair p;
  open_pair(&p, 64, 1);
  connect_pair(&p, 8, 8);
  if (post_write(&p, 1, 64, 1)) die("post_write");
  pthread_t t;
  pthread_create(&t, NULL, rescue, &p);
  struct ibv_cq *cq;
  void *cq_context;
  if (ibv_get_cq_event(p.channel, &cq, &cq_context)) die("ibv_get_cq_event");
  ibv_ack_cq_events(cq, 1);
  pthread_join(t, NULL);
  wait_wc(&p);
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
