// A fixed RC workload for seed_replay_test.sh: two RC QPs of one process,
// connected to each other through device 0, with fixed starting PSNs. A
// sends SENDs to B and B writes into A's buffer, one message at a time, with
// sizes from a fixed table (1 to 3 packets at MTU 1024). Every byte that
// arrives is checked. Under RDMAEMU_FAULTS the packets are the same in every
// run (QPNs, opcodes and PSNs), so the fault rules' decisions on them depend
// on the seed alone.
//
// Exits 0 after kMessages messages each way, 1 with a message on stderr.
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr int kMessages = 60;
constexpr size_t kSlot = 4096;  // bytes per message slot in the buffers
constexpr uint32_t kPsnA = 1000;
constexpr uint32_t kPsnB = 7000;

int Fail(const char* what) {
  std::fprintf(stderr, "seed_replay_program: %s\n", what);
  return 1;
}

uint32_t SizeOf(int i) { return 100 + static_cast<uint32_t>(i * 997) % 2900; }
uint8_t ByteOf(int i, size_t k) { return static_cast<uint8_t>(i * 31 + k * 7 + 1); }

struct Side {
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kSlot * 2);
  ibv_mr* mr = nullptr;
};

bool Connect(ibv_qp* qp, uint32_t peer_qpn, const ibv_gid& gid, uint32_t sq_psn, uint32_t rq_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return false;
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return false;
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = sq_psn;
  a.timeout = 12;  // 16.8 ms: a lost last packet costs one timeout
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

// One completion from `cq` within 10 s, successful.
bool Wait(ibv_cq* cq, ibv_wc* wc) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) return false;
    if (n == 1) {
      if (wc->status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "seed_replay_program: WR %llu: %s\n",
                     static_cast<unsigned long long>(wc->wr_id), ibv_wc_status_str(wc->status));
        return false;
      }
      return true;
    }
  }
  std::fprintf(stderr, "seed_replay_program: no completion within 10 s\n");
  return false;
}

bool Post(ibv_qp* qp, ibv_wr_opcode op, uint64_t wr_id, Side& from, uint32_t len, Side* to) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(from.buf.data()), len, from.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (to != nullptr) {
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(to->buf.data() + kSlot);
    wr.wr.rdma.rkey = to->mr->rkey;
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad) == 0;
}

bool PostRecv(Side& s, uint64_t wr_id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data() + kSlot), kSlot, s.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(s.qp, &wr, &bad) == 0;
}

bool Fill(Side& s, int i, uint32_t len) {
  for (size_t k = 0; k < len; ++k) s.buf[k] = ByteOf(i, k);
  return true;
}

bool Arrived(const Side& s, int i, uint32_t len) {
  for (size_t k = 0; k < len; ++k) {
    if (s.buf[kSlot + k] != ByteOf(i, k)) return false;
  }
  return true;
}

}  // namespace

int main() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) return Fail("no device");
  ibv_context* ctx = ibv_open_device(list[0]);
  if (ctx == nullptr) return Fail("ibv_open_device failed (RDMAEMU_FAULTS?)");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) return Fail("ibv_alloc_pd");
  Side a, b;
  for (Side* s : {&a, &b}) {
    s->cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
    s->mr = ibv_reg_mr(pd, s->buf.data(), s->buf.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = s->cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {4, 4, 1, 1, 0};
    s->qp = s->cq && s->mr ? ibv_create_qp(pd, &init) : nullptr;
    if (s->qp == nullptr) return Fail("cannot create a CQ, MR or QP");
  }
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 0, &gid)) return Fail("ibv_query_gid");
  if (!Connect(a.qp, b.qp->qp_num, gid, kPsnA, kPsnB) ||
      !Connect(b.qp, a.qp->qp_num, gid, kPsnB, kPsnA)) {
    return Fail("cannot connect the QPs");
  }
  ibv_wc wc;
  for (int i = 0; i < kMessages; ++i) {
    const uint32_t len = SizeOf(i);
    // A SENDs to B.
    std::memset(b.buf.data() + kSlot, 0, kSlot);
    if (!PostRecv(b, i) || !Fill(a, i, len) || !Post(a.qp, IBV_WR_SEND, i, a, len, nullptr)) {
      return Fail("cannot post the SEND");
    }
    if (!Wait(a.cq, &wc) || !Wait(b.cq, &wc)) return Fail("the SEND failed");
    if (wc.byte_len != len || !Arrived(b, i, len)) return Fail("the SEND's data differs");
    // B writes into A.
    const uint32_t wlen = SizeOf(i + kMessages);
    std::memset(a.buf.data() + kSlot, 0, kSlot);
    if (!Fill(b, i + kMessages, wlen) || !Post(b.qp, IBV_WR_RDMA_WRITE, i, b, wlen, &a)) {
      return Fail("cannot post the WRITE");
    }
    if (!Wait(b.cq, &wc)) return Fail("the WRITE failed");
    if (!Arrived(a, i + kMessages, wlen)) return Fail("the WRITE's data differs");
  }
  for (Side* s : {&a, &b}) {
    ibv_destroy_qp(s->qp);
    ibv_dereg_mr(s->mr);
    ibv_destroy_cq(s->cq);
  }
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  std::printf("seed_replay_program: %d SENDs and %d WRITEs, every byte checked\n", kMessages,
              kMessages);
  return 0;
}
