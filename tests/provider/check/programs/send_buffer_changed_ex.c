/* Mistake: reusing a send buffer before the WR's completion, posted through
 * ibv_wr_* and completed through ibv_start_poll. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair_ex(&p, 64);
  connect_pair(&p, 8, 8);
  memset(p.buf, 'a', 64);
  if (post_write(&p, 7, 64, 1)) die("post_write");
  memset(p.buf, 'b', 64); /* too early: the completion is not polled yet */
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
