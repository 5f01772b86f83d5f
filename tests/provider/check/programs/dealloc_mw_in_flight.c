/* Mistake: deallocating a memory window a posted bind WR names, before the
 * bind's completion. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  struct ibv_mw *mw = post_bind_a(&p);
  if (ibv_dealloc_mw(mw)) die("ibv_dealloc_mw"); /* too early */
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
