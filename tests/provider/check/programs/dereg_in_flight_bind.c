/* Mistake: deregistering the MR a posted bind WR binds a window over,
 * before the bind's completion. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  struct ibv_mw *mw = post_bind_a(&p);
  /* Too early. Whether the device has bound the window yet or not, the
   * program cannot know before the completion (if it has, the dereg fails
   * with EBUSY). */
  if (ibv_dereg_mr(p.mr) == 0) p.mr = NULL;
  wait_wc(&p);
  if (ibv_dealloc_mw(mw)) die("ibv_dealloc_mw");
  close_pair(&p);
  return 0;
}
