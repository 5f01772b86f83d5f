/* A correct program whose RDMA WRITEs read device memory: the SGE's addr is
 * an offset into a region over a DM (ibv_reg_dm_mr), not an address of the
 * program's, so the checker must not read it as one (it would fault at
 * address 0). Under --check=error it prints nothing, exits 0. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  struct ibv_alloc_dm_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.length = 256;
  struct ibv_dm *dm = ibv_alloc_dm(p.ctx, &attr);
  if (!dm) die("ibv_alloc_dm");
  struct ibv_mr *dm_mr = ibv_reg_dm_mr(p.pd, dm, 0, 256, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  if (!dm_mr) die("ibv_reg_dm_mr");
  char text[64];
  memset(text, 'd', sizeof text);
  if (ibv_memcpy_to_dm(dm, 0, text, sizeof text)) die("ibv_memcpy_to_dm");
  for (int i = 0; i < 4; ++i) {
    struct ibv_sge sge = {0, 64, dm_mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)p.buf + 2048;
    wr.wr.rdma.rkey = p.mr->rkey;
    if (ibv_post_send(p.a, &wr, &bad)) die("ibv_post_send");
    struct ibv_wc wc = wait_wc(&p);
    if (wc.status != IBV_WC_SUCCESS) die("completion");
  }
  if (memcmp(p.buf + 2048, text, sizeof text) != 0) die("the DM's bytes did not arrive");
  if (ibv_dereg_mr(dm_mr)) die("ibv_dereg_mr");
  if (ibv_free_dm(dm)) die("ibv_free_dm");
  close_pair(&p);
  return 0;
}
