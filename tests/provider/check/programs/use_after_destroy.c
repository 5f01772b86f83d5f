/* Mistake: posting to a QP after destroying it (a NIC's library follows the
 * freed pointer: a crash or worse). The checker reports it and the post
 * fails with EINVAL. */
#include <errno.h>

#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  struct ibv_qp *stale = p.a;
  if (ibv_destroy_qp(p.a)) die("ibv_destroy_qp");
  p.a = stale;
  int rc = post_write(&p, 1, 64, 1);
  printf("ibv_post_send on the destroyed QP returned %d (%s)\n", rc, strerror(rc));
  p.a = NULL;
  close_pair(&p);
  return rc == EINVAL ? 0 : 1;
}
