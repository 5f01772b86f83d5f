/* Mistake: deallocating a memory window a posted bind WR names, before the
 * bind's completion. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  struct ibv_mw *mw = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
  if (!mw) die("ibv_alloc_mw");
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 9;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info.mr = p.mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)p.buf;
  wr.bind_mw.bind_info.length = 64;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_post_send(p.a, &wr, &bad)) die("ibv_post_send");
  if (ibv_dealloc_mw(mw)) die("ibv_dealloc_mw"); /* too early */
  wait_wc(&p);
  close_pair(&p);
  return 0;
}
