/* Mistake: reusing a send buffer before the WR's completion (a NIC may send
 * either version, and a retransmission sends the new one). */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  memset(p.buf, 'a', 64);
  if (post_write(&p, 7, 64, 1)) die("post_write");
  memset(p.buf, 'b', 64); /* too early: the completion is not polled yet */
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
