#include "tests/e2e/soak/rdma.h"

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace soak {
namespace {

[[noreturn]] void DieErrno(const char* call, int err) {
  Die(fmt::format("{} failed: {}", call, std::strerror(err)));
}

}  // namespace

uint32_t MtuBytes(ibv_mtu mtu) { return 128u << mtu; }

const char* MtuName(uint32_t mtu_enum) {
  switch (mtu_enum) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
  }
  return "?";
}

Verbs OpenVerbs(const Options& o, int cqe) {
  Verbs v;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) DieErrno("ibv_get_device_list", errno);
  ibv_device* dev = nullptr;
  for (int i = 0; i < n && dev == nullptr; ++i) {
    if (o.device.empty() || o.device == ibv_get_device_name(list[i])) dev = list[i];
  }
  if (dev == nullptr) {
    Die(o.device.empty() ? "no RDMA device (is the program running through `rdmaemu run`?)"
                         : fmt::format("no RDMA device named {}", o.device));
  }
  v.ctx = ibv_open_device(dev);
  if (v.ctx == nullptr) DieErrno("ibv_open_device", errno);
  ibv_free_device_list(list);
  if (int e = ibv_query_port(v.ctx, v.port_num, &v.port); e != 0) DieErrno("ibv_query_port", e);
  v.gid_index = o.gid_index;
  if (int e = ibv_query_gid(v.ctx, v.port_num, v.gid_index, &v.gid); e != 0) DieErrno("ibv_query_gid", e);
  v.pd = ibv_alloc_pd(v.ctx);
  if (v.pd == nullptr) DieErrno("ibv_alloc_pd", errno);
  v.channel = ibv_create_comp_channel(v.ctx);
  if (v.channel == nullptr) DieErrno("ibv_create_comp_channel", errno);
  v.cq = ibv_create_cq(v.ctx, cqe, nullptr, v.channel, 0);
  if (v.cq == nullptr) DieErrno("ibv_create_cq", errno);
  return v;
}

void CloseVerbs(Verbs& v) {
  if (int e = ibv_destroy_cq(v.cq); e != 0) DieErrno("ibv_destroy_cq", e);
  if (int e = ibv_destroy_comp_channel(v.channel); e != 0) DieErrno("ibv_destroy_comp_channel", e);
  if (int e = ibv_dealloc_pd(v.pd); e != 0) DieErrno("ibv_dealloc_pd", e);
  if (int e = ibv_close_device(v.ctx); e != 0) DieErrno("ibv_close_device", e);
}

ibv_mr* Register(Verbs& v, void* addr, size_t len, int access) {
  ibv_mr* mr = ibv_reg_mr(v.pd, addr, len, access);
  if (mr == nullptr) DieErrno("ibv_reg_mr", errno);
  return mr;
}

ibv_qp* CreateQp(Verbs& v, ibv_qp_type type, const ibv_qp_cap& cap) {
  ibv_qp_init_attr a{};
  a.send_cq = v.cq;
  a.recv_cq = v.cq;
  a.cap = cap;
  a.qp_type = type;
  ibv_qp* qp = ibv_create_qp(v.pd, &a);
  if (qp == nullptr) DieErrno("ibv_create_qp", errno);
  return qp;
}

Endpoint LocalEndpoint(const Verbs& v, const ibv_qp* qp, uint32_t psn) {
  Endpoint e;
  e.qpn = qp->qp_num;
  e.psn = psn;
  std::memcpy(e.gid, v.gid.raw, 16);
  e.active_mtu = v.port.active_mtu;
  return e;
}

void ConnectRc(Verbs& v, ibv_qp* qp, uint32_t local_psn, const Endpoint& remote, const RcPath& path) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = v.port_num;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
  if (int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      e != 0) {
    DieErrno("ibv_modify_qp to INIT", e);
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = path.mtu;
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = path.rd_atomic;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(v.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = v.port_num;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      e != 0) {
    DieErrno("ibv_modify_qp to RTR", e);
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = path.timeout;
  a.retry_cnt = path.retry_cnt;
  a.rnr_retry = path.rnr_retry;
  a.sq_psn = local_psn;
  a.max_rd_atomic = path.rd_atomic;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      e != 0) {
    DieErrno("ibv_modify_qp to RTS", e);
  }
}

void ReadyUd(Verbs& v, ibv_qp* qp, uint32_t qkey, uint32_t psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = v.port_num;
  a.qkey = qkey;
  if (int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY); e != 0) {
    DieErrno("ibv_modify_qp to INIT", e);
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (int e = ibv_modify_qp(qp, &a, IBV_QP_STATE); e != 0) DieErrno("ibv_modify_qp to RTR", e);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = psn;
  if (int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN); e != 0) DieErrno("ibv_modify_qp to RTS", e);
}

ibv_ah* CreateAh(Verbs& v, const Endpoint& remote) {
  ibv_ah_attr a{};
  a.is_global = 1;
  std::memcpy(a.grh.dgid.raw, remote.gid, 16);
  a.grh.sgid_index = static_cast<uint8_t>(v.gid_index);
  a.grh.hop_limit = 64;
  a.port_num = v.port_num;
  ibv_ah* ah = ibv_create_ah(v.pd, &a);
  if (ah == nullptr) DieErrno("ibv_create_ah", errno);
  return ah;
}

int WaitCompletionsFor(Verbs& v, ibv_wc* wc, int max, Channel& ctl, int quiet_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(quiet_ms);
  for (;;) {
    int n = ibv_poll_cq(v.cq, max, wc);
    if (n < 0) Die("ibv_poll_cq failed");
    if (n > 0) return n;
    // Arm, then poll again: a completion that arrived before arming raises
    // no event.
    if (int e = ibv_req_notify_cq(v.cq, 0); e != 0) DieErrno("ibv_req_notify_cq", e);
    n = ibv_poll_cq(v.cq, max, wc);
    if (n < 0) Die("ibv_poll_cq failed");
    if (n > 0) return n;
    if (ctl.PeerGone()) Die("the peer closed the control connection (it failed; see its output)");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{v.channel->fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (r < 0 && errno != EINTR) DieErrno("poll on the completion channel", errno);
    if (r > 0) {
      ibv_cq* cq = nullptr;
      void* cq_ctx = nullptr;
      if (ibv_get_cq_event(v.channel, &cq, &cq_ctx) != 0) DieErrno("ibv_get_cq_event", errno);
      if (cq != v.cq) Die("ibv_get_cq_event returned an event for another CQ");
      ibv_ack_cq_events(cq, 1);
      ++v.cq_events;
    }
  }
}

int WaitCompletions(Verbs& v, ibv_wc* wc, int max, Channel& ctl) {
  for (;;) {
    if (int n = WaitCompletionsFor(v, wc, max, ctl, 1000); n > 0) return n;
  }
}

}  // namespace soak
