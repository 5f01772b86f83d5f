/* A correct program on the extended API: signaled RDMA WRITEs posted through
 * ibv_wr_*, each polled through ibv_start_poll before the buffer is touched,
 * an unsignaled one retired by the signaled one after it, everything
 * destroyed. Under --check=error it prints nothing, exits 0. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair_ex(&p, 64);
  connect_pair(&p, 8, 8);
  for (int i = 0; i < 10; ++i) {
    memset(p.buf, 'a' + i, 64);
    if (post_write(&p, i, 64, 1)) die("post_write");
    struct ibv_wc wc = wait_wc(&p);
    if (wc.status != IBV_WC_SUCCESS) die("completion");
  }
  if (post_write(&p, 98, 64, 0)) die("post_write");
  if (post_write(&p, 99, 64, 1)) die("post_write");
  if (wait_wc(&p).wr_id != 99) die("completion of wr 99");
  memset(p.buf, 'z', 64);
  close_pair(&p);
  return 0;
}
