/* What the checker's mistake programs share: one context, PD, 4 KiB
 * registered buffer, a CQ (optionally on a completion channel) and two RC
 * QPs connected to each other on port 1 of emu0. Each program then makes one
 * mistake. Any failure of the setup exits with status 3, so a test tells it
 * apart from the checker's 86. The *_ex programs open the pair with
 * open_pair_ex: the same helpers then post through ibv_wr_* and poll through
 * ibv_start_poll. */
#ifndef RDMAEMU_TESTS_CHECK_COMMON_H_
#define RDMAEMU_TESTS_CHECK_COMMON_H_

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pair {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_comp_channel *channel; /* NULL unless asked for */
  struct ibv_cq *cq;
  struct ibv_mr *mr;
  char *buf;
  struct ibv_qp *a, *b;
  struct ibv_cq_ex *cqx; /* open_pair_ex: the CQ, polled with ibv_start_poll */
  struct ibv_qp_ex *ax;  /* open_pair_ex: qp a, posted to with ibv_wr_* */
};

static inline void die(const char *what) {
  perror(what);
  exit(3);
}

static inline void to_rts(struct ibv_qp *qp, uint32_t peer, union ibv_gid gid) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("INIT");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer;
  a.rq_psn = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    die("RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    die("RTS");
}

static inline struct ibv_qp *create_rc(struct pair *p, uint32_t send_wr, uint32_t recv_wr) {
  struct ibv_qp_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.send_cq = a.recv_cq = p->cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = send_wr;
  a.cap.max_recv_wr = recv_wr;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = p->pd;
  if (p->cqx) {
    a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;
  }
  struct ibv_qp *qp = ibv_create_qp_ex(p->ctx, &a);
  if (!qp) die("ibv_create_qp_ex");
  return qp;
}

static inline void open_pair_with(struct pair *p, int cqe, int with_channel, int extended) {
  memset(p, 0, sizeof *p);
  struct ibv_device **list = ibv_get_device_list(NULL);
  if (!list || !list[0]) die("ibv_get_device_list");
  p->ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!p->ctx) die("ibv_open_device");
  p->pd = ibv_alloc_pd(p->ctx);
  if (!p->pd) die("ibv_alloc_pd");
  if (with_channel) {
    p->channel = ibv_create_comp_channel(p->ctx);
    if (!p->channel) die("ibv_create_comp_channel");
  }
  if (extended) {
    struct ibv_cq_init_attr_ex attr;
    memset(&attr, 0, sizeof attr);
    attr.cqe = cqe;
    attr.channel = p->channel;
    attr.wc_flags = IBV_WC_EX_WITH_QP_NUM;
    p->cqx = ibv_create_cq_ex(p->ctx, &attr);
    if (!p->cqx) die("ibv_create_cq_ex");
    p->cq = ibv_cq_ex_to_cq(p->cqx);
  } else {
    p->cq = ibv_create_cq(p->ctx, cqe, NULL, p->channel, 0);
    if (!p->cq) die("ibv_create_cq");
  }
  p->buf = calloc(1, 4096);
  p->mr = ibv_reg_mr(p->pd, p->buf, 4096,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
  if (!p->mr) die("ibv_reg_mr");
}

/* cqe entries; with_channel: the CQ completes onto a channel. */
static inline void open_pair(struct pair *p, int cqe, int with_channel) {
  open_pair_with(p, cqe, with_channel, 0);
}

/* open_pair for the extended API: ibv_create_cq_ex, and QPs that post through ibv_wr_*. */
static inline void open_pair_ex(struct pair *p, int cqe) { open_pair_with(p, cqe, 0, 1); }

static inline void connect_pair(struct pair *p, uint32_t send_wr, uint32_t recv_wr) {
  p->a = create_rc(p, send_wr, recv_wr);
  if (p->cqx) {
    p->ax = ibv_qp_to_qp_ex(p->a);
    if (!p->ax) die("ibv_qp_to_qp_ex");
  }
  p->b = create_rc(p, send_wr, recv_wr);
  union ibv_gid gid;
  if (ibv_query_gid(p->ctx, 1, 0, &gid)) die("ibv_query_gid");
  to_rts(p->a, p->b->qp_num, gid);
  to_rts(p->b, p->a->qp_num, gid);
}

/* An RDMA WRITE of buf[0, len) to buf[2048, ...) through qp a. */
static inline int post_write(struct pair *p, uint64_t wr_id, uint32_t len, int signaled) {
  if (p->ax) {
    ibv_wr_start(p->ax);
    p->ax->wr_id = wr_id;
    p->ax->wr_flags = signaled ? IBV_SEND_SIGNALED : 0;
    ibv_wr_rdma_write(p->ax, p->mr->rkey, (uintptr_t)p->buf + 2048);
    ibv_wr_set_sge(p->ax, p->mr->lkey, (uintptr_t)p->buf, len);
    return ibv_wr_complete(p->ax);
  }
  struct ibv_sge sge = {(uintptr_t)p->buf, len, p->mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.wr.rdma.remote_addr = (uintptr_t)p->buf + 2048;
  wr.wr.rdma.rkey = p->mr->rkey;
  return ibv_post_send(p->a, &wr, &bad);
}

/* A signaled SEND of buf[0, len) through qp a. Until post_recv_b gives b a
 * receive, b answers RNR NAK and a, whose rnr_retry is 7 (for ever), keeps
 * trying: the WR stays in flight for as long as the program wants. */
static inline int post_send_a(struct pair *p, uint64_t wr_id, uint32_t len) {
  if (p->ax) {
    ibv_wr_start(p->ax);
    p->ax->wr_id = wr_id;
    p->ax->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(p->ax);
    ibv_wr_set_sge(p->ax, p->mr->lkey, (uintptr_t)p->buf, len);
    return ibv_wr_complete(p->ax);
  }
  struct ibv_sge sge = {(uintptr_t)p->buf, len, p->mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(p->a, &wr, &bad);
}

/* A receive of len bytes into buf[2048, ...) on qp b. */
static inline int post_recv_b(struct pair *p, uint64_t wr_id, uint32_t len) {
  struct ibv_sge sge = {(uintptr_t)p->buf + 2048, len, p->mr->lkey};
  struct ibv_recv_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(p->b, &wr, &bad);
}

/* A new type 2 window, bound over buf[0, 64) by a signaled IBV_WR_BIND_MW
 * (wr_id 9) posted on qp a; the bind's completion is not waited for. */
static inline struct ibv_mw *post_bind_a(struct pair *p) {
  struct ibv_mw *mw = ibv_alloc_mw(p->pd, IBV_MW_TYPE_2);
  if (!mw) die("ibv_alloc_mw");
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 9;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info.mr = p->mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)p->buf;
  wr.bind_mw.bind_info.length = 64;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_post_send(p->a, &wr, &bad)) die("ibv_post_send");
  return mw;
}

/* The next completion, or exit 3 after ~5 s. */
static inline struct ibv_wc wait_wc(struct pair *p) {
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  for (long i = 0; i < 5000000 && p->cqx; ++i) {
    struct ibv_poll_cq_attr attr;
    memset(&attr, 0, sizeof attr);
    int rc = ibv_start_poll(p->cqx, &attr);
    if (rc == ENOENT) continue;
    if (rc) die("ibv_start_poll");
    wc.wr_id = p->cqx->wr_id;
    wc.status = p->cqx->status;
    wc.opcode = ibv_wc_read_opcode(p->cqx);
    wc.qp_num = ibv_wc_read_qp_num(p->cqx);
    ibv_end_poll(p->cqx);
    return wc;
  }
  for (long i = 0; i < 5000000 && !p->cqx; ++i) {
    int n = ibv_poll_cq(p->cq, 1, &wc);
    if (n < 0) die("ibv_poll_cq");
    if (n == 1) return wc;
  }
  fprintf(stderr, "no completion\n");
  exit(3);
}

static inline void close_pair(struct pair *p) {
  if (p->a && ibv_destroy_qp(p->a)) die("ibv_destroy_qp");
  if (p->b && ibv_destroy_qp(p->b)) die("ibv_destroy_qp");
  if (p->mr && ibv_dereg_mr(p->mr)) die("ibv_dereg_mr");
  if (ibv_destroy_cq(p->cq)) die("ibv_destroy_cq");
  if (p->channel && ibv_destroy_comp_channel(p->channel)) die("ibv_destroy_comp_channel");
  if (ibv_dealloc_pd(p->pd)) die("ibv_dealloc_pd");
  if (ibv_close_device(p->ctx)) die("ibv_close_device");
  free(p->buf);
}

#endif
