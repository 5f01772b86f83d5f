/* Mistake: reusing a send buffer before the WR's completion (a NIC may send
 * either version, and a retransmission sends the new one). The peer has
 * no receive yet, so the SEND is certainly still in flight at the change. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  memset(p.buf, 'a', 64);
  if (post_send_a(&p, 7, 64)) die("post_send_a");
  memset(p.buf, 'b', 64); /* too early: the completion is not polled yet */
  if (post_recv_b(&p, 8, 64)) die("post_recv_b");
  wait_wc(&p);
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
