/* Mistake: deregistering the MR a WR posted through ibv_wr_* uses, before
 * its completion. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair_ex(&p, 64);
  connect_pair(&p, 8, 8);
  if (post_write(&p, 5, 64, 1)) die("post_write");
  if (ibv_dereg_mr(p.mr)) die("ibv_dereg_mr");
  p.mr = NULL;
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
