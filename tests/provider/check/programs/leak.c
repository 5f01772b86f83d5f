/* Mistake: exiting with a QP, CQ, MR, memory window, PD and the context
 * still alive. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  if (!ibv_alloc_mw(p.pd, IBV_MW_TYPE_2)) die("ibv_alloc_mw");
  return 0;
}
