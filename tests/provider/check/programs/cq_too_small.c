/* Mistake: two QPs of 16 send and 16 receive WRs each completing into a CQ
 * of 8 entries: it overruns as soon as the program falls behind polling.
 * Reported at the first post, which puts qp a's send queue to use. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 8, 0);
  connect_pair(&p, 16, 16);
  if (post_write(&p, 1, 64, 1)) die("post_write");
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
