/* Mistake: posting only unsignaled WRs through ibv_wr_*: no completion ever
 * frees the send queue, and the fifth batch on a 4-deep queue fails with
 * ENOMEM. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair_ex(&p, 64);
  connect_pair(&p, 4, 4);
  int rc = 0;
  for (int i = 0; i < 5 && rc == 0; ++i) rc = post_write(&p, i, 64, 0);
  printf("the fifth unsignaled ibv_wr_complete returned %d (%s)\n", rc, strerror(rc));
  close_pair(&p);
  return rc == ENOMEM ? 0 : 1;
}
