// A small verbs program for path_migration_e2e_test.sh: on the first device
// (which must have two ports) it connects two RC QPs of its own on port
// PORT, with the other port as their alternate path, rearms them and
// exchanges a write each way so that they arm. It prints "armed qpn A B"
// and then keeps one RDMA WRITE in flight from the first QP, checking its
// data and printing every async event it gets, until both QPs have
// reported IBV_EVENT_PATH_MIG (or 20 s pass). It then checks with
// ibv_query_qp that both are MIGRATED onto the other port.
// Usage: path_target [PORT]   (1 or 2; default 1)
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kBuf = 1 << 20;
constexpr uint32_t kLen = 8192;

struct Program {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<unsigned char> buf = std::vector<unsigned char>(kBuf);
  ibv_qp* qp[2] = {nullptr, nullptr};
};

int Fail(const char* what) {
  std::fprintf(stderr, "path_target: %s\n", what);
  return 1;
}

ibv_ah_attr Av(const ibv_gid& gid, uint8_t port) {
  ibv_ah_attr av{};
  av.is_global = 1;
  av.grh.dgid = gid;
  av.grh.hop_limit = 1;
  av.port_num = port;
  return av;
}

// RESET -> INIT -> RTR -> RTS on port `port` towards `peer` (at g1), port
// `alt` (at g2) as the alternate path, path migration state REARM.
int Connect(ibv_qp* qp, uint32_t peer, uint8_t port, const ibv_gid& g1, uint8_t alt,
            const ibv_gid& g2) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS)) {
    return rc;
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer;
  a.rq_psn = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr = Av(g1, port);
  a.alt_ah_attr = Av(g2, alt);
  a.alt_port_num = alt;
  a.alt_timeout = 12;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                         IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH)) {
    return rc;
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  a.timeout = 12;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  a.path_mig_state = IBV_MIG_REARM;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                                   IBV_QP_PATH_MIG_STATE);
}

int PostWrite(Program& p, ibv_qp* qp, uint64_t id, size_t from, size_t to) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(p.buf.data() + from), kLen, p.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(p.buf.data() + to);
  wr.wr.rdma.rkey = p.mr->rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

// One completion within 10 s; false on a timeout or an error status.
bool WaitWc(Program& p, uint64_t id) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  ibv_wc wc;
  while (std::chrono::steady_clock::now() < until) {
    int n = ibv_poll_cq(p.cq, 1, &wc);
    if (n < 0) return false;
    if (n == 0) continue;
    if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id) {
      std::fprintf(stderr, "path_target: wr %llu completed with %s\n",
                   static_cast<unsigned long long>(wc.wr_id), ibv_wc_status_str(wc.status));
      return false;
    }
    return true;
  }
  std::fprintf(stderr, "path_target: no completion for wr %llu in 10 s\n",
               static_cast<unsigned long long>(id));
  return false;
}

ibv_mig_state MigState(ibv_qp* qp, uint8_t* port) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  ibv_query_qp(qp, &a, IBV_QP_PATH_MIG_STATE | IBV_QP_PORT, &init);
  if (port != nullptr) *port = a.port_num;
  return a.path_mig_state;
}

}  // namespace

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 1;
  if (port != 1 && port != 2) return Fail("usage: path_target [1|2]");
  const uint8_t alt = port == 1 ? 2 : 1;
  Program p;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) return Fail("no device");
  p.ctx = ibv_open_device(list[0]);
  if (p.ctx == nullptr) return Fail("cannot open the device");
  ibv_device_attr da{};
  if (ibv_query_device(p.ctx, &da) != 0 || da.phys_port_cnt != 2) return Fail("the device needs 2 ports");
  if (!(da.device_cap_flags & IBV_DEVICE_AUTO_PATH_MIG)) return Fail("no IBV_DEVICE_AUTO_PATH_MIG");
  ibv_gid g1{}, g2{};
  if (ibv_query_gid(p.ctx, port, 0, &g1) != 0 || ibv_query_gid(p.ctx, alt, 0, &g2) != 0) {
    return Fail("ibv_query_gid");
  }
  p.pd = ibv_alloc_pd(p.ctx);
  p.cq = p.pd ? ibv_create_cq(p.ctx, 64, nullptr, nullptr, 0) : nullptr;
  p.mr = p.cq ? ibv_reg_mr(p.pd, p.buf.data(), kBuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
              : nullptr;
  if (p.mr == nullptr) return Fail("setup failed");
  for (ibv_qp*& qp : p.qp) {
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = p.cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap = {16, 1, 1, 1, 0};
    qp = ibv_create_qp(p.pd, &qa);
    if (qp == nullptr) return Fail("ibv_create_qp");
  }
  if (Connect(p.qp[0], p.qp[1]->qp_num, port, g1, alt, g2) != 0 ||
      Connect(p.qp[1], p.qp[0]->qp_num, port, g1, alt, g2) != 0) {
    return Fail("connecting with an alternate path failed");
  }
  // One write each way: each QP then hears MigReq clear from its rearmed peer.
  if (PostWrite(p, p.qp[0], 1, 0, kBuf / 2) != 0 || !WaitWc(p, 1)) return Fail("first write");
  if (PostWrite(p, p.qp[1], 2, 0, kBuf / 2) != 0 || !WaitWc(p, 2)) return Fail("second write");
  for (ibv_qp* qp : p.qp) {
    if (MigState(qp, nullptr) != IBV_MIG_ARMED) return Fail("a QP did not arm");
  }
  std::printf("armed qpn %u %u\n", p.qp[0]->qp_num, p.qp[1]->qp_num);
  std::fflush(stdout);

  fcntl(p.ctx->async_fd, F_SETFL, fcntl(p.ctx->async_fd, F_GETFL) | O_NONBLOCK);
  bool migrated[2] = {false, false};
  uint64_t id = 10;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(migrated[0] && migrated[1])) {
    if (std::chrono::steady_clock::now() > until) return Fail("no PATH_MIG on both QPs within 20 s");
    // Traffic keeps flowing: the requester migrates when it next sends.
    const size_t off = (id % 32) * kLen;
    for (size_t i = 0; i < kLen; ++i) p.buf[off + i] = static_cast<unsigned char>(id + i * 7);
    if (PostWrite(p, p.qp[0], id, off, kBuf / 2 + off) != 0 || !WaitWc(p, id)) {
      return Fail("a write failed");
    }
    if (std::memcmp(p.buf.data() + off, p.buf.data() + kBuf / 2 + off, kLen) != 0) {
      return Fail("a write landed wrong data");
    }
    ++id;
    pollfd pf{p.ctx->async_fd, POLLIN, 0};
    if (poll(&pf, 1, 20) != 1) continue;
    ibv_async_event ev;
    if (ibv_get_async_event(p.ctx, &ev) != 0) continue;
    const char* on = "a port or the device";
    if (ev.event_type == IBV_EVENT_PATH_MIG || ev.event_type == IBV_EVENT_PATH_MIG_ERR) {
      on = ev.element.qp == p.qp[0] ? "the requester" : ev.element.qp == p.qp[1] ? "the responder" : "another qp";
      if (ev.event_type == IBV_EVENT_PATH_MIG) {
        if (ev.element.qp == p.qp[0]) migrated[0] = true;
        if (ev.element.qp == p.qp[1]) migrated[1] = true;
      }
    }
    std::printf("%s on %s\n", ibv_event_type_str(ev.event_type), on);
    std::fflush(stdout);
    ibv_ack_async_event(&ev);
  }
  for (ibv_qp* qp : p.qp) {
    uint8_t now = 0;
    if (MigState(qp, &now) != IBV_MIG_MIGRATED || now != alt) {
      return Fail("after PATH_MIG a QP is not MIGRATED onto the alternate port");
    }
  }
  std::printf("migrated to port %d after %llu writes\n", alt, static_cast<unsigned long long>(id - 10));
  for (ibv_qp* qp : p.qp) ibv_destroy_qp(qp);
  ibv_dereg_mr(p.mr);
  ibv_destroy_cq(p.cq);
  ibv_dealloc_pd(p.pd);
  ibv_close_device(p.ctx);
  ibv_free_device_list(list);
  return 0;
}
