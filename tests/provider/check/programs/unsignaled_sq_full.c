/* Mistake: posting only unsignaled WRs: no completion ever frees the send
 * queue, and the fifth post of a 4-deep queue fails with ENOMEM. */
#include <errno.h>

#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 4, 4);
  int rc = 0;
  for (int i = 0; i < 5 && rc == 0; ++i) rc = post_write(&p, i, 64, 0);
  printf("the fifth unsignaled post returned %d (%s)\n", rc, strerror(rc));
  close_pair(&p);
  return rc == ENOMEM ? 0 : 1;
}
