// Queue pairs and address handles: creation, the IB state machine on
// modify (checked, then applied), queries, and posting work.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
#include "emulator/engine/rss.h"
#include "emulator/engine/trace.h"
#include "emulator/net/udp_socket.h"
#include "emulator/objects/qp_state.h"
#include "provider/handles.h"
#include "provider/check/quarantine.h"
#include "provider/object_slot.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

using objects::QpAttributes;

static_assert(static_cast<int>(objects::QpState::kErr) == IBV_QPS_ERR);
static_assert(static_cast<int>(objects::QpType::kUd) == IBV_QPT_UD);
static_assert(static_cast<int>(objects::QpType::kRawPacket) == IBV_QPT_RAW_PACKET);
static_assert(static_cast<int>(engine::QpType::kRawPacket) == IBV_QPT_RAW_PACKET);
static_assert(static_cast<int>(objects::QpType::kXrcSend) == IBV_QPT_XRC_SEND);
static_assert(static_cast<int>(objects::QpType::kXrcRecv) == IBV_QPT_XRC_RECV);
static_assert(static_cast<int>(engine::QpType::kXrcRecv) == IBV_QPT_XRC_RECV);
static_assert(objects::kQpDestQpn == uint32_t{IBV_QP_DEST_QPN});
static_assert(objects::kQpRateLimit == uint32_t{IBV_QP_RATE_LIMIT});

objects::AddressVector ToAv(const ibv_ah_attr& a) {
  objects::AddressVector av{};
  av.has_grh = a.is_global != 0;
  std::memcpy(av.dgid, a.grh.dgid.raw, 16);
  av.flow_label = a.grh.flow_label;
  av.sgid_index = a.grh.sgid_index;
  av.hop_limit = a.grh.hop_limit;
  av.traffic_class = a.grh.traffic_class;
  av.dlid = a.dlid;
  av.sl = a.sl;
  av.src_path_bits = a.src_path_bits;
  av.static_rate = a.static_rate;
  av.port_num = a.port_num;
  return av;
}

ibv_ah_attr FromAv(const objects::AddressVector& av) {
  ibv_ah_attr a{};
  a.is_global = av.has_grh;
  std::memcpy(a.grh.dgid.raw, av.dgid, 16);
  a.grh.flow_label = av.flow_label;
  a.grh.sgid_index = av.sgid_index;
  a.grh.hop_limit = av.hop_limit;
  a.grh.traffic_class = av.traffic_class;
  a.dlid = av.dlid;
  a.sl = av.sl;
  a.src_path_bits = av.src_path_bits;
  a.static_rate = av.static_rate;
  a.port_num = av.port_num;
  return a;
}

QpAttributes ToAttributes(const ibv_qp_attr& a) {
  QpAttributes q{};
  q.state = static_cast<objects::QpState>(a.qp_state);
  q.cur_state = static_cast<objects::QpState>(a.cur_qp_state);
  q.path_mtu = static_cast<objects::Mtu>(a.path_mtu);
  q.path_mig_state = static_cast<objects::MigState>(a.path_mig_state);
  q.qkey = a.qkey;
  q.rq_psn = a.rq_psn;
  q.sq_psn = a.sq_psn;
  q.dest_qp_num = a.dest_qp_num;
  q.qp_access_flags = a.qp_access_flags;
  q.cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
           a.cap.max_inline_data};
  q.ah_attr = ToAv(a.ah_attr);
  q.alt_ah_attr = ToAv(a.alt_ah_attr);
  q.pkey_index = a.pkey_index;
  q.alt_pkey_index = a.alt_pkey_index;
  q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
  q.sq_draining = a.sq_draining != 0;
  q.max_rd_atomic = a.max_rd_atomic;
  q.max_dest_rd_atomic = a.max_dest_rd_atomic;
  q.min_rnr_timer = a.min_rnr_timer;
  q.port_num = a.port_num;
  q.timeout = a.timeout;
  q.retry_cnt = a.retry_cnt;
  q.rnr_retry = a.rnr_retry;
  q.alt_port_num = a.alt_port_num;
  q.alt_timeout = a.alt_timeout;
  q.rate_limit = a.rate_limit;
  return q;
}

// The IPv4 address inside an IPv4-mapped GID (::ffff:a.b.c.d), network order.
bool Ipv4FromGid(const uint8_t* gid, uint32_t* ip) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid, kPrefix, 12) != 0) return false;
  std::memcpy(ip, gid + 12, 4);
  return true;
}

engine::QpState ToEngineState(objects::QpState s) { return static_cast<engine::QpState>(s); }

// Which send opcodes each transport carries (IBA 9.2, and what rxe accepts);
// an XRC initiator carries RC's.
bool OpcodeAllowed(engine::QpType type, ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND:
      return true;
    case IBV_WR_SEND_WITH_IMM:
      // A raw frame has no header for immediate data.
      return type != engine::QpType::kRawPacket;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return type != engine::QpType::kUd && type != engine::QpType::kRawPacket;
    case IBV_WR_BIND_MW:
    case IBV_WR_LOCAL_INV:
      // Binding and invalidating windows are RC and UC work (as rxe).
      return type == engine::QpType::kRc || type == engine::QpType::kUc;
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return type == engine::QpType::kRc || type == engine::QpType::kXrcSend;
    case IBV_WR_ATOMIC_WRITE:
      // The Memory Placement Extensions are RC's only (as rxe).
      return type == engine::QpType::kRc;
    default:
      return op == kWrFlush && type == engine::QpType::kRc;
  }
}

engine::SendOp ToSendOp(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND_WITH_IMM: return engine::SendOp::kSendWithImm;
    case IBV_WR_SEND_WITH_INV: return engine::SendOp::kSendWithInv;
    case IBV_WR_RDMA_WRITE: return engine::SendOp::kRdmaWrite;
    case IBV_WR_RDMA_WRITE_WITH_IMM: return engine::SendOp::kRdmaWriteWithImm;
    case IBV_WR_RDMA_READ: return engine::SendOp::kRdmaRead;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return engine::SendOp::kCompareSwap;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return engine::SendOp::kFetchAdd;
    case IBV_WR_BIND_MW: return engine::SendOp::kBindMw;
    case IBV_WR_LOCAL_INV: return engine::SendOp::kLocalInv;
    case IBV_WR_ATOMIC_WRITE: return engine::SendOp::kAtomicWrite;
    default: return op == kWrFlush ? engine::SendOp::kFlush : engine::SendOp::kSend;
  }
}

// The bind a BIND_MW WR asks for, with what a driver checks at post: the
// window and region are objects of this context (the pointers are followed
// only then), a type 1 window is bound through ibv_bind_mw. The rest (PDs,
// rights, bounds, the window's state) the device checks when it executes
// the bind, as a NIC does: a completion with IBV_WC_MW_BIND_ERR.
Status FillBind(Qp& qp, const ibv_send_wr& wr, bool bind_verb, engine::SendWqe& w) {
  ibv_context* context = qp.ibv.qp_base.context;
  const auto& b = wr.bind_mw;
  if (!HandleOf(b.mw, Kind::kMw, context, "ibv_post_send (BIND_MW)", "wr.bind_mw.mw")) {
    return InvalidArgument("not a memory window of this context");
  }
  if (b.mw->type == IBV_MW_TYPE_1 && !bind_verb) {
    return InvalidArgument("a type 1 window is bound with ibv_bind_mw(), not with a posted "
                           "IBV_WR_BIND_MW (that is for type 2 windows)");
  }
  if (b.bind_info.mr != nullptr &&
      !HandleOf(b.bind_info.mr, Kind::kMr, context, "ibv_post_send (BIND_MW)",
                "wr.bind_mw.bind_info.mr")) {
    return InvalidArgument("not a memory region of this context");
  }
  objects::BindRequest& r = w.bind;
  r.mw_rkey = ToMw(b.mw)->key;
  r.new_rkey = b.rkey;
  r.has_mr = b.bind_info.mr != nullptr;
  r.mr_lkey = r.has_mr ? ToMr(b.bind_info.mr)->mr->lkey : 0;
  r.addr = b.bind_info.addr;
  r.length = b.bind_info.length;
  r.access = b.bind_info.mw_access_flags;
  r.type1_verb = bind_verb;
  return Status::Ok();
}

// The NIC's read of inline data at the doorbell: the application's own
// bytes, which it must not change until the post returns. Under TSan this
// read is the NIC's DMA, which no sanitizer sees: a program that sends
// from the buffer it receives into (Debian's srq_pingpong does) races its
// own receives there, as it would on hardware, and TSan must not call
// that the library's race. So it is not instrumented, and copies byte by
// byte (a memcpy call would be intercepted); the barrier keeps the
// compiler from turning the loop back into one.
#if defined(__SANITIZE_THREAD__)
[[gnu::no_sanitize_thread, gnu::noinline]] void CopyInlineData(const ibv_send_wr& wr,
                                                               std::vector<uint8_t>* out) {
  size_t bytes = 0;
  for (int i = 0; i < wr.num_sge; ++i) bytes += wr.sg_list[i].length;
  const size_t start = out->size();
  out->resize(start + bytes);
  uint8_t* to = out->data() + start;
  for (int i = 0; i < wr.num_sge; ++i) {
    const auto* from = reinterpret_cast<const uint8_t*>(wr.sg_list[i].addr);
    for (uint32_t j = 0; j < wr.sg_list[i].length; ++j) {
      *to++ = from[j];
      asm volatile("" ::: "memory");
    }
  }
}
#else
void CopyInlineData(const ibv_send_wr& wr, std::vector<uint8_t>* out) {
  for (int i = 0; i < wr.num_sge; ++i) {
    const auto* p = reinterpret_cast<const uint8_t*>(wr.sg_list[i].addr);
    out->insert(out->end(), p, p + wr.sg_list[i].length);
  }
}
#endif

}  // namespace

Result<engine::SendWqe> BuildSendWqe(Qp& qp, const ibv_send_wr& wr, bool bind_verb) {
  const engine::Qp& eqp = *qp.qp;
  auto fail = [&](std::string why) -> Status {
    RDMAEMU_WARN_LIMITED("ibv_post_send qp#{} wr_id {}: {}", eqp.qpn, wr.wr_id, why);
    return InvalidArgument(std::move(why));
  };
  if (eqp.type == engine::QpType::kXrcRecv) {
    return fail("an XRC_RECV QP has no send queue: send through an XRC_SEND QP");
  }
  if (eqp.send_cq == nullptr) {
    return fail("the QP has no send queue (a RAW_PACKET QP with an indirection table created "
                "without a send_cq only receives)");
  }
  if (!OpcodeAllowed(eqp.type, wr.opcode)) {
    return fail(fmt::format("opcode {} is not valid on a {} QP", static_cast<int>(wr.opcode),
                            objects::ToString(qp.type)));
  }
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > eqp.caps.max_send_sge) {
    return fail(fmt::format("num_sge {} exceeds the QP's max_send_sge {}", wr.num_sge,
                            eqp.caps.max_send_sge));
  }
  engine::SendWqe w;
  w.wr_id = wr.wr_id;
  w.op = ToSendOp(wr.opcode);
  w.signaled = qp.sq_sig_all || (wr.send_flags & IBV_SEND_SIGNALED);
  w.solicited = wr.send_flags & IBV_SEND_SOLICITED;
  w.fence = wr.send_flags & IBV_SEND_FENCE;
  w.imm_data = wr.imm_data;
  if (wr.opcode == IBV_WR_SEND_WITH_INV || wr.opcode == IBV_WR_LOCAL_INV) {
    w.invalidate_rkey = wr.invalidate_rkey;
  }
  if (wr.opcode == IBV_WR_BIND_MW || wr.opcode == IBV_WR_LOCAL_INV) {
    // Local operations carry no data: their SGEs (if any) are not read.
    if (wr.opcode == IBV_WR_BIND_MW) {
      if (Status s = FillBind(qp, wr, bind_verb, w); !s.ok()) return fail(s.message());
    }
    return w;
  }
  if (wr.opcode == IBV_WR_ATOMIC_WRITE || wr.opcode == kWrFlush) {
    // Built only by ibv_wr_atomic_write / ibv_wr_flush (qp_ex.cc), which
    // carry their operands in wr.wr.atomic: see PlacementWr there.
    w.remote_addr = wr.wr.atomic.remote_addr;
    w.rkey = wr.wr.atomic.rkey;
    if (wr.opcode == IBV_WR_ATOMIC_WRITE) {
      const uint64_t value = wr.wr.atomic.compare_add;
      const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
      w.inline_data.assign(bytes, bytes + sizeof value);
      w.is_inline = true;
      w.length = sizeof value;
    } else {
      w.length = wr.wr.atomic.compare_add;
      w.flush_type = static_cast<uint8_t>(wr.wr.atomic.swap);
      w.flush_level = static_cast<uint8_t>(wr.wr.atomic.swap >> 8);
    }
    return w;
  }
  const bool atomic = wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  if (wr.send_flags & IBV_SEND_INLINE) {
    if (wr.opcode == IBV_WR_RDMA_READ || atomic) {
      return fail("IBV_SEND_INLINE cannot be used with RDMA READ or atomics (they write locally)");
    }
    w.is_inline = true;
    uint64_t bytes = 0;
    for (int i = 0; i < wr.num_sge; ++i) bytes += wr.sg_list[i].length;
    if (bytes > eqp.caps.max_inline_data) {
      return fail(fmt::format("{} inline bytes exceed the QP's max_inline_data {}", bytes,
                              eqp.caps.max_inline_data));
    }
    CopyInlineData(wr, &w.inline_data);
    w.length = w.inline_data.size();
  } else {
    for (int i = 0; i < wr.num_sge; ++i) {
      w.sges.push_back({wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey});
      w.length += wr.sg_list[i].length;
    }
  }
  if (w.length > device::kMaxMsgSize) {
    return fail(fmt::format("message of {} bytes exceeds max_msg_sz {}", w.length, device::kMaxMsgSize));
  }
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      w.remote_addr = wr.wr.rdma.remote_addr;
      w.rkey = wr.wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      // A wrong-sized local buffer or an unaligned remote address is found
      // by the NIC, not its driver: a completion error (requester.cc, and
      // the responder's invalid-request NAK).
      w.remote_addr = wr.wr.atomic.remote_addr;
      w.rkey = wr.wr.atomic.rkey;
      w.compare_add = wr.wr.atomic.compare_add;
      w.swap = wr.wr.atomic.swap;
      break;
    default:
      break;
  }
  if (eqp.type == engine::QpType::kUd) {
    if (wr.wr.ud.ah == nullptr) return fail("a UD send needs wr.ud.ah");
    w.ud.dst_ip = ToAh(wr.wr.ud.ah)->dst_ip;
    w.ud.remote_qpn = wr.wr.ud.remote_qpn & 0xffffff;
    w.ud.remote_qkey = wr.wr.ud.remote_qkey;
    const ibv_ah_attr& ah = ToAh(wr.wr.ud.ah)->attr;
    if (ah.is_global) w.ud.traffic_class = ah.grh.traffic_class;
  }
  if (eqp.type == engine::QpType::kXrcSend) {
    const uint32_t srqn = wr.qp_type.xrc.remote_srqn;
    if (srqn > objects::kMax24Bit) {
      return fail(fmt::format("qp_type.xrc.remote_srqn {:#x} does not fit the XRCETH's 24 bits",
                              srqn));
    }
    w.xrc_remote_srqn = srqn;
  }
  return w;
}

int QueueSends(Qp& qp, std::vector<engine::SendWqe>& wqes, size_t* queued) {
  engine::Qp& eqp = *qp.qp;
  *queued = 0;
  bool posted = false;
  bool flush = false;
  bool busy = false;
  int rc = 0;
  {
    std::lock_guard lock(eqp.mu);
    // As mlx5's driver (qp_state_max_gs: no send SGEs until RTS has been
    // set, none at all in RESET), which rdma-core's own tests expect
    // (post_sq_state_bad_flow).
    engine::QpState state = eqp.attrs.state;
    if (state == engine::QpState::kReset || state == engine::QpState::kInit ||
        state == engine::QpState::kRtr) {
      RDMAEMU_WARN_LIMITED("ibv_post_send: qp#{} is in {}; it must reach RTS before sending",
                           eqp.qpn, objects::ToString(static_cast<objects::QpState>(state)));
      return EINVAL;
    }
    busy = eqp.sq_outstanding > 0;
    for (auto& w : wqes) {
      if (eqp.sq_outstanding >= eqp.caps.max_send_wr) {
        rc = ENOMEM;
        break;
      }
      ++eqp.sq_outstanding;
      eqp.sq.push_back(std::move(w));
      ++*queued;
    }
    // A QP in ERR accepts work and completes it at once with a flush error.
    flush = state == engine::QpState::kErr;
    posted = *queued > 0 && !flush;
  }
  if (posted) {
    // The program streams when earlier sends are unfinished or their
    // completions unpolled (a UD send completes as it leaves): its packets
    // may wait for the next round to leave with others. One that waits
    // for each completion before it posts again sends at once.
    const bool streaming = busy || (eqp.send_cq != nullptr && eqp.send_cq->depth() > 0);
    ToContext(qp.ibv.qp_base.context)->engine->Doorbell(eqp.qpn, streaming);
  }
  if (flush) engine::FlushQp(eqp);
  return rc;
}

namespace {

int PostSend(ibv_qp* ibv, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Qp* qp = ToQp(ibv);
  std::vector<engine::SendWqe> wqes;
  std::vector<ibv_send_wr*> order;
  int rc = 0;
  ibv_send_wr* first_bad = nullptr;
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    if (w->opcode == IBV_WR_ATOMIC_WRITE || w->opcode == kWrFlush) {
      // As rxe: ibv_send_wr has no field for an atomic write's 8 bytes nor
      // for a flush's type and level; only the extended post API has.
      RDMAEMU_WARN_LIMITED("ibv_post_send qp#{} wr_id {}: {} is posted with {} (the extended post "
                           "API, ibv_qp_to_qp_ex), not with ibv_post_send",
                           qp->qp->qpn, w->wr_id,
                           w->opcode == kWrFlush ? "IBV_WR_FLUSH" : "IBV_WR_ATOMIC_WRITE",
                           w->opcode == kWrFlush ? "ibv_wr_flush" : "ibv_wr_atomic_write");
      rc = EINVAL;
      first_bad = w;
      break;
    }
    auto built = BuildSendWqe(*qp, *w);
    if (!built.ok()) {
      rc = built.status().code();
      first_bad = w;
      break;
    }
    wqes.push_back(std::move(built).value());
    order.push_back(w);
  }
  size_t queued = 0;
  int qrc = QueueSends(*qp, wqes, &queued);
  if (qrc != 0) {
    *bad_wr = queued < order.size() ? order[queued] : first_bad;
    return qrc;
  }
  if (rc != 0) *bad_wr = first_bad;
  return rc;
}

int PostRecv(ibv_qp* ibv, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  engine::Qp& eqp = *ToQp(ibv)->qp;
  int rc = 0;
  bool flush = false;
  for (; wr != nullptr; wr = wr->next) {
    std::lock_guard lock(eqp.mu);
    if (engine::IsXrc(eqp.type)) {
      RDMAEMU_WARN_LIMITED("ibv_post_recv: qp#{} is an {} QP, which has no receive queue{}",
                           eqp.qpn, engine::QpTypeName(eqp.type),
                           eqp.type == engine::QpType::kXrcRecv
                               ? ": its messages land in the XRC SRQs they name (ibv_post_srq_recv)"
                               : "");
      rc = EINVAL;
      break;
    }
    if (eqp.rss) {
      RDMAEMU_WARN_LIMITED("ibv_post_recv: qp#{} receives through its indirection table's WQs; "
                           "use ibv_post_wq_recv on them", eqp.qpn);
      rc = EINVAL;
      break;
    }
    if (eqp.srq) {
      RDMAEMU_WARN_LIMITED("ibv_post_recv: qp#{} receives through an SRQ; use ibv_post_srq_recv", eqp.qpn);
      rc = EINVAL;
      break;
    }
    // mlx5 takes receives from INIT on, never in RESET (post_rq_state_bad_flow).
    if (eqp.attrs.state == engine::QpState::kReset) {
      RDMAEMU_WARN_LIMITED("ibv_post_recv: qp#{} is in RESET; move it to INIT first", eqp.qpn);
      rc = EINVAL;
      break;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > eqp.caps.max_recv_sge) {
      RDMAEMU_WARN_LIMITED("ibv_post_recv: qp#{}: num_sge {} exceeds max_recv_sge {}", eqp.qpn,
                           wr->num_sge, eqp.caps.max_recv_sge);
      rc = EINVAL;
      break;
    }
    if (eqp.rq.size() >= eqp.caps.max_recv_wr) {
      rc = ENOMEM;
      break;
    }
    eqp.rq.push_back(ToRecvWqe(*wr));
    if (engine::DebugOn()) {
      Log().debug("{} qp#{} recv WR {} {} bytes", ToContext(ibv->context)->device->name(), eqp.qpn,
                  wr->wr_id, eqp.rq.back().length);
    }
    flush = eqp.attrs.state == engine::QpState::kErr;
  }
  if (rc != 0) *bad_wr = wr;
  if (flush) engine::FlushQp(eqp);
  return rc;
}

// Serialises counting an XRC target's handles (ibv_open_qp against the last
// destroy).
std::mutex& TargetsMutex() {
  static auto& mu = *new std::mutex;
  return mu;
}

// The engine moves a QP to ERR by itself (retries exhausted, a fatal NAK);
// modify and query start from the state it is really in.
void SyncEngineState(Qp& qp) {
  std::lock_guard lock(qp.qp->mu);
  auto state = static_cast<objects::QpState>(qp.qp->attrs.state);
  if (state != qp.attrs.state) {
    qp.attrs.state = qp.attrs.cur_state = state;
    qp.ibv.qp_base.state = static_cast<ibv_qp_state>(state);
  }
  // The engine clears sq_draining once the started WQEs have completed.
  qp.attrs.sq_draining = state == objects::QpState::kSqd && qp.qp->sq_draining;
  // It arms a REARM path and migrates (path.cc): the current path is then
  // the old alternate one, and the old current path the alternate.
  qp.attrs.path_mig_state = static_cast<objects::MigState>(qp.qp->attrs.mig_state);
  for (; qp.migrations_seen != qp.qp->migrations; ++qp.migrations_seen) {
    objects::QpAttributes& a = qp.attrs;
    std::swap(a.ah_attr, a.alt_ah_attr);
    std::swap(a.port_num, a.alt_port_num);
    std::swap(a.pkey_index, a.alt_pkey_index);
    std::swap(a.timeout, a.alt_timeout);
  }
}

// A QP with an indirection table (IBV_QP_INIT_ATTR_IND_TABLE and
// IBV_QP_INIT_ATTR_RX_HASH, both): a UD QP that receives through the
// table's WQs, steered by a Toeplitz hash of the selected fields (rss.h).
// mlx5 does this on RAW_PACKET QPs, and so does this device (hashing the
// frame's IPv4 addresses and UDP ports, engine/raw.cc); the rules are the
// kernel's for such QPs: no SRQ and no receive queue of its own.
Status CheckRss(ibv_context* context, const ibv_qp_init_attr_ex& attr) {
  auto fail = [](int code, std::string why) -> Status {
    Log().warn("ibv_create_qp_ex: {}", why);
    return Status::Error(code, std::move(why));
  };
  constexpr uint32_t kBoth = IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
  if ((attr.comp_mask & kBoth) != kBoth || attr.rwq_ind_tbl == nullptr) {
    return fail(EINVAL, "receive-side scaling needs both IBV_QP_INIT_ATTR_IND_TABLE (with "
                        "rwq_ind_tbl) and IBV_QP_INIT_ATTR_RX_HASH");
  }
  if (attr.qp_type != IBV_QPT_UD && attr.qp_type != IBV_QPT_RAW_PACKET) {
    return fail(EOPNOTSUPP, "only UD and RAW_PACKET QPs can steer their receives through an "
                            "indirection table on this device");
  }
  if (!HandleOf(attr.rwq_ind_tbl, Kind::kRwqIndTable, context, "ibv_create_qp_ex", "rwq_ind_tbl")) {
    return InvalidArgument("not an indirection table of this context");
  }
  if (attr.srq != nullptr || attr.cap.max_recv_wr != 0 || attr.cap.max_recv_sge != 0) {
    return fail(EINVAL, "a QP with an indirection table receives through its WQs: srq must be NULL "
                        "and max_recv_wr and max_recv_sge 0");
  }
  const ibv_rx_hash_conf& h = attr.rx_hash_conf;
  if (h.rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ) {
    return fail(EOPNOTSUPP, fmt::format("rx_hash_function {:#x}: the device hashes with "
                                        "IBV_RX_HASH_FUNC_TOEPLITZ only",
                                        h.rx_hash_function));
  }
  if (h.rx_hash_key == nullptr || h.rx_hash_key_len != engine::kRxHashKeyBytes) {
    return fail(EINVAL, fmt::format("the Toeplitz key must be {} bytes (rx_hash_key_len {}{})",
                                    engine::kRxHashKeyBytes, h.rx_hash_key_len,
                                    h.rx_hash_key == nullptr ? ", rx_hash_key NULL" : ""));
  }
  if (uint64_t bad = h.rx_hash_fields_mask & ~engine::kRxHashSupportedFields; bad != 0) {
    return fail(EOPNOTSUPP, fmt::format("rx_hash_fields_mask {:#x}: RoCE v2 packets are IPv4 UDP; "
                                        "the device hashes on IBV_RX_HASH_SRC/DST_IPV4 and "
                                        "IBV_RX_HASH_SRC/DST_PORT_UDP only",
                                        bad));
  }
  return Status::Ok();
}

// An XRC QP, before the common checks: what the kernel ignores for its type
// is cleared (an initiator has no receive side; a target no queues, CQs or
// PD of its own), and a target's XRCD must be a live one. The target's XRCD
// (NULL for an initiator).
Result<Xrcd*> PrepareXrc(ibv_context* context, ibv_qp_init_attr_ex& attr) {
  attr.recv_cq = nullptr;
  attr.srq = nullptr;
  attr.cap.max_recv_wr = attr.cap.max_recv_sge = 0;
  if (attr.qp_type == IBV_QPT_XRC_SEND) return static_cast<Xrcd*>(nullptr);
  if (!(attr.comp_mask & IBV_QP_INIT_ATTR_XRCD) || attr.xrcd == nullptr) {
    Log().warn("ibv_create_qp_ex: an XRC_RECV QP belongs to an XRC domain: set "
               "IBV_QP_INIT_ATTR_XRCD and xrcd (ibv_open_xrcd)");
    return InvalidArgument("no XRCD");
  }
  if (!HandleOf(attr.xrcd, Kind::kXrcd, context, "ibv_create_qp_ex", "xrcd")) {
    return InvalidArgument("not an XRCD of this context");
  }
  if (attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    Log().warn("ibv_create_qp_ex: an XRC_RECV QP sends nothing: IBV_QP_INIT_ATTR_SEND_OPS_FLAGS "
               "does not apply");
    return InvalidArgument("send_ops_flags on XRC_RECV");
  }
  attr.send_cq = nullptr;
  attr.pd = nullptr;
  attr.comp_mask &= ~IBV_QP_INIT_ATTR_PD;
  attr.cap = {};
  return ToXrcd(attr.xrcd);
}

// The CQs and SRQ a new QP names must be live objects of its context (the
// kernel finds them by handle in the context's own table).
Status CheckQueues(ibv_context* context, const ibv_qp_init_attr_ex& attr, bool rss) {
  // A null send_cq got here only where it is optional (CreateQp).
  if ((attr.send_cq != nullptr && !HandleOf(attr.send_cq, Kind::kCq, context, "ibv_create_qp", "send_cq")) ||
      (!rss && !HandleOf(attr.recv_cq, Kind::kCq, context, "ibv_create_qp", "recv_cq")) ||
      (attr.srq != nullptr && !HandleOf(attr.srq, Kind::kSrq, context, "ibv_create_qp", "srq"))) {
    return InvalidArgument("a CQ or the SRQ is not one of this context");
  }
  // Tag matching is RC's (tm_caps.flags is IBV_TM_CAP_RC): only an RC QP
  // carries the TMHs a TM SRQ matches.
  if (attr.srq != nullptr && ToSrq(attr.srq)->srq->tags && attr.qp_type != IBV_QPT_RC) {
    Log().warn("ibv_create_qp: a QP of type {} cannot receive through a tag-matching SRQ; only RC "
               "can (IBV_TM_CAP_RC)",
               static_cast<int>(attr.qp_type));
    return InvalidArgument("tag-matching SRQ on a non-RC QP");
  }
  return Status::Ok();
}

// As the kernel and rxe: a flag outside ibv_qp_create_flags is EINVAL (the
// kernel's uverbs refuses it), a known one EOPNOTSUPP (rxe supports none:
// they are multicast loopback, raw-packet and mlx5 features).
Status CheckCreateFlags(uint32_t flags) {
  auto fail = [](int code, std::string why) -> Status {
    Log().warn("ibv_create_qp_ex: {}", why);
    return Status::Error(code, std::move(why));
  };
  constexpr uint32_t kKnown = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB | IBV_QP_CREATE_SCATTER_FCS |
                              IBV_QP_CREATE_CVLAN_STRIPPING | IBV_QP_CREATE_SOURCE_QPN |
                              IBV_QP_CREATE_PCI_WRITE_END_PADDING;
  if (uint32_t unknown = flags & ~kKnown; unknown != 0) {
    return fail(EINVAL, fmt::format("create_flags {:#x} are not QP creation flags", unknown));
  }
  if (flags != 0) {
    return fail(EOPNOTSUPP, fmt::format("create_flags {:#x}: the device supports no QP creation "
                                        "flags", flags));
  }
  return Status::Ok();
}

}  // namespace

void InstallQpOps(verbs_context* vctx) {
  vctx->context.ops.post_send = PostSend;
  vctx->context.ops.post_recv = PostRecv;
}

Result<ibv_qp*> CreateQp(ibv_context* context, ibv_qp_init_attr_ex* given) {
  if (Status dead = DeadDevice(context, "ibv_create_qp"); !dead.ok()) return dead;
  Context* ctx = ToContext(context);
  // A copy: an XRC QP's unused fields are cleared here, not in the caller's.
  ibv_qp_init_attr_ex copy = *given;
  ibv_qp_init_attr_ex* attr = &copy;
  const bool xrc = attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV;
  const bool target = attr->qp_type == IBV_QPT_XRC_RECV;
  Xrcd* xrcd = nullptr;
  if (xrc) {
    auto x = PrepareXrc(context, *attr);
    if (!x.ok()) return x.status();
    xrcd = *x;
  }
  if (target) {
    // A target has no PD of its own: memory is checked against the PD of
    // the XRC SRQ each message lands in.
  } else if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || attr->pd == nullptr) {
    Log().warn("ibv_create_qp: a QP needs a protection domain");
    return InvalidArgument("no PD");
  }
  if (!target && !HandleOf(attr->pd, Kind::kPd, context, "ibv_create_qp", "pd")) {
    return InvalidArgument("not a PD of this context");
  }
  // IBV_QP_INIT_ATTR_CREATE_FLAGS only says the field is set: the flags in
  // it are what asks for a feature (the kernel judges them, not the bit).
  constexpr uint32_t kCompMask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                                 IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH |
                                 IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_XRCD;
  if (attr->comp_mask & ~kCompMask) {
    Log().warn("ibv_create_qp_ex: comp_mask {:#x} asks for features the device does not support "
               "(TSO, max_user_rd_atomic …)", attr->comp_mask & ~kCompMask);
    return NotSupported("comp_mask");
  }
  if (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) {
    if (Status s = CheckCreateFlags(attr->create_flags); !s.ok()) return s;
  }
  const bool rss = attr->comp_mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH);
  if (rss) {
    if (Status s = CheckRss(context, *attr); !s.ok()) return s;
  }
  const bool qp_ex = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  // RAW_PACKET needs CAP_NET_RAW on Linux; an emulated port is no host
  // interface to eavesdrop on, so here it needs nothing.
  if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD &&
      attr->qp_type != IBV_QPT_RAW_PACKET && !xrc) {
    Log().warn("ibv_create_qp: QP type {} is not supported (RC, UC, UD, RAW_PACKET, XRC_SEND and "
               "XRC_RECV are)",
               static_cast<int>(attr->qp_type));
    return NotSupported("qp_type");
  }
  if (qp_ex) {
    if (Status s = CheckSendOpsFlags(attr->qp_type, attr->send_ops_flags); !s.ok()) return s;
  }
  ObjectSlot slot(*ctx->device, ObjectSlot::Limited::kQp, "ibv_create_qp");
  if (!slot.ok()) return NoMemory("max_qp");
  // Which CQs the QP completes on: a target has none, an initiator no recv_cq.
  // A RAW_PACKET QP with an indirection table only receives (as mlx5's,
  // whose RSS QP is a TIR without a send queue): its send_cq is optional,
  // and without one it cannot send.
  const bool raw_rss = rss && attr->qp_type == IBV_QPT_RAW_PACKET;
  const bool has_send_cq = !target && !(raw_rss && attr->send_cq == nullptr);
  const bool has_recv_cq = !rss && !xrc;
  if ((has_send_cq && attr->send_cq == nullptr) || (has_recv_cq && attr->recv_cq == nullptr)) {
    Log().warn("ibv_create_qp: send_cq and recv_cq are required (recv_cq is not used by a QP "
               "with an indirection table, whose WQs have their own CQs, nor by an XRC_SEND QP)");
    return InvalidArgument("no CQ");
  }
  if (!target) {
    if (Status s = CheckQueues(context, *attr, !has_recv_cq); !s.ok()) return s;
  }
  const ibv_qp_cap& cap = attr->cap;
  if (cap.max_send_wr > device::kMaxQpWr || cap.max_recv_wr > device::kMaxQpWr ||
      cap.max_send_sge > device::kMaxSge || cap.max_recv_sge > device::kMaxSge ||
      cap.max_inline_data > device::kMaxInlineData) {
    Log().warn("ibv_create_qp: capabilities exceed the device's (max_qp_wr {}, max_sge {}, "
               "max_inline_data {})", device::kMaxQpWr, device::kMaxSge, device::kMaxInlineData);
    return InvalidArgument("cap");
  }
  if (has_send_cq) {
    // As rxe (rxe_qp_init_req): a send WQE has room for max_send_sge SGEs
    // or the inline data, whichever is larger, so inline data may use the
    // SGEs' room; ibv_create_qp(3) returns the actual caps, "greater than or
    // equal to" those asked. (rdma_xclient asks for no inline data and
    // sends 16 bytes inline with one SGE, as mlx5 and rxe allow.)
    attr->cap.max_inline_data = std::max<uint32_t>(
        cap.max_inline_data,
        std::min<uint32_t>(cap.max_send_sge * sizeof(ibv_sge), device::kMaxInlineData));
  }
  auto qpn = ctx->engine->AllocateQpn();
  if (!qpn.ok()) return qpn.status();
  engine::QpCaps caps{cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge,
                      cap.max_inline_data};
  auto* qp = new Qp{};
  ibv_qp& q = qp->ibv.qp_base;
  qp->qp = std::make_shared<engine::Qp>(
      *qpn, static_cast<engine::QpType>(attr->qp_type), target ? 0 : ToPd(attr->pd)->handle,
      has_send_cq ? ToCq(attr->send_cq)->cq.get() : nullptr,
      has_recv_cq ? ToCq(attr->recv_cq)->cq.get() : nullptr, caps, reinterpret_cast<uint64_t>(&q));
  if (target) {
    qp->qp->xrcd = xrcd->domain->number;
    qp->tgt_owner = qp;
    qp->tgt_handles = 1;
    qp->xrcd = xrcd;
    ++xrcd->users;
  }
  if (rss) {
    qp->rss = ToRwqIndTable(attr->rwq_ind_tbl);
    ++qp->rss->users;
    qp->qp->rss = qp->rss->table;
    const ibv_rx_hash_conf& h = attr->rx_hash_conf;
    qp->qp->rx_hash.fields = h.rx_hash_fields_mask;
    qp->qp->rx_hash.key.assign(h.rx_hash_key, h.rx_hash_key + h.rx_hash_key_len);
  }
  if (attr->srq != nullptr) {
    qp->qp->srq = ToSrq(attr->srq)->srq;
    ++ToSrq(attr->srq)->users;
  }
  qp->type = static_cast<objects::QpType>(attr->qp_type);
  qp->attrs.cap = {cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge,
                   cap.max_inline_data};
  qp->sq_sig_all = attr->sq_sig_all != 0;
  if (qp_ex) InstallQpEx(*qp, attr->send_ops_flags);
  q.context = context;
  q.qp_context = attr->qp_context;
  // A target uses no PD, but shows the one it was given, as rdma-core's
  // set_qp does (librdmacm's XRC server registers its memory with qp->pd).
  q.pd = target && (given->comp_mask & IBV_QP_INIT_ATTR_PD) ? given->pd : attr->pd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.srq = attr->srq;
  q.handle = *qpn;
  q.qp_num = *qpn;
  q.state = IBV_QPS_RESET;
  q.qp_type = attr->qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  q.events_completed = 0;
  if (!target) ++ToPd(attr->pd)->users;
  if (has_send_cq) ++ToCq(attr->send_cq)->users;
  if (has_recv_cq) ++ToCq(attr->recv_cq)->users;
  given->cap = attr->cap;
  ctx->engine->AddQp(qp->qp);
  // `rdmaemu list` shows it by QPN with its type and current state.
  engine::Qp* eqp = qp->qp.get();
  const objects::QpType type = qp->type;
  auto listed = ctx->device->directory().Add(
      objects::ObjectKind::kQp, reinterpret_cast<uint64_t>(&q),
      [eqp, type] {
        std::lock_guard lock(eqp->mu);
        return fmt::format("{} {}", objects::ToString(type),
                           objects::ToString(static_cast<objects::QpState>(eqp->attrs.state)));
      },
      *qpn);
  if (!listed.ok()) Log().error("ibv_create_qp qp#{}: {}", *qpn, listed.status().message());
  AddHandle(&q, Kind::kQp, context);
  Log().debug("{} qp#{}: created {} QP", ctx->device->name(), *qpn, objects::ToString(qp->type));
  slot.Keep();
  return &q;
}

namespace {

// The handle that holds a QP's attributes: an XRC target's creator, else
// the QP's own.
Qp* Control(Qp* qp) { return qp->tgt_owner != nullptr ? qp->tgt_owner : qp; }

}  // namespace

int ModifyQp(ibv_qp* ibv, ibv_qp_attr* attr, int mask) {
  if (Status dead = DeadDevice(ibv->context, "ibv_modify_qp"); !dead.ok()) return dead.code();
  Qp* qp = Control(ToQp(ibv));
  Context* ctx = ToContext(ibv->context);
  const device::Device& dev = *ctx->device;
  QpAttributes requested = ToAttributes(*attr);
  objects::QpLimits limits;
  limits.num_ports = dev.num_ports();
  limits.gid_table_len = device::kGidTableLength;
  limits.max_rd_atomic = device::kMaxQpRdAtom;
  limits.max_dest_rd_atomic = device::kMaxQpRdAtom;
  int port = (mask & IBV_QP_PORT) ? attr->port_num : qp->attrs.port_num;
  if (!dev.ValidPort(port)) port = 1;
  device::PortAttr pa = dev.QueryPort(port);
  limits.roce = pa.link_layer == device::LinkLayer::kEthernet;
  limits.pkey_table_len = pa.pkey_table_len;
  limits.port_active_mtu = pa.active_mtu;
  limits.auto_path_mig = true;
  const int alt_port = (mask & IBV_QP_ALT_PATH) ? attr->alt_port_num : qp->attrs.alt_port_num;
  limits.alt_roce = !dev.ValidPort(alt_port) ||
                    dev.QueryPort(alt_port).link_layer == device::LinkLayer::kEthernet;
  std::lock_guard modify(qp->modify_mu);
  SyncEngineState(*qp);
  Status s = objects::CheckModify(qp->type, qp->attrs, requested, static_cast<uint32_t>(mask), limits);
  uint32_t dest_ip = 0;
  if (s.ok() && (mask & IBV_QP_AV)) {
    if (!requested.ah_attr.has_grh) {
      // Reaches here only on an InfiniBand port: CheckModify refuses RoCE AVs without a GRH.
      dest_ip = dev.LidAddress(port, requested.ah_attr.dlid);
      if (dest_ip == 0) {
        Log().warn("ibv_modify_qp qp#{}: no port of the subnet has DLID {:#x} (now): packets to it are lost, "
                   "as on a subnet where the LID is unassigned", ibv->qp_num, requested.ah_attr.dlid);
      }
    } else if (!Ipv4FromGid(requested.ah_attr.dgid, &dest_ip)) {
      s = InvalidArgument("the destination GID is not an IPv4-mapped RoCE v2 GID; "
                          "this device reaches IPv4 hosts only");
    }
  }
  uint32_t alt_dest_ip = 0;
  if (s.ok() && (mask & IBV_QP_ALT_PATH)) {
    if (!requested.alt_ah_attr.has_grh) {
      // Reaches here only on an InfiniBand port (see above).
      alt_dest_ip = dev.LidAddress(requested.alt_port_num, requested.alt_ah_attr.dlid);
    } else if (!Ipv4FromGid(requested.alt_ah_attr.dgid, &alt_dest_ip)) {
      s = InvalidArgument("IBV_QP_ALT_PATH: alt_ah_attr.grh.dgid is not an IPv4-mapped RoCE v2 "
                          "GID; this device reaches IPv4 hosts only");
    }
  }
  if (!s.ok()) {
    Log().warn("ibv_modify_qp qp#{}: {}", ibv->qp_num, s.message());
    return s.code();
  }
  const bool forced_migration = (mask & IBV_QP_PATH_MIG_STATE) &&
                                qp->attrs.path_mig_state == objects::MigState::kArmed &&
                                requested.path_mig_state == objects::MigState::kMigrated;
  objects::ApplyModify(qp->attrs, requested, static_cast<uint32_t>(mask));
  engine::Qp& eqp = *qp->qp;
  objects::QpState before;
  {
    std::lock_guard lock(eqp.mu);
    before = static_cast<objects::QpState>(eqp.attrs.state);
    engine::TransportAttrs& t = eqp.attrs;
    t.state = ToEngineState(qp->attrs.state);
    t.qkey = qp->attrs.qkey;
    t.dest_qpn = qp->attrs.dest_qp_num;
    t.path_mtu = objects::MtuBytes(qp->attrs.path_mtu);
    if (mask & IBV_QP_AV) {
      t.dest_ip = dest_ip;
      t.traffic_class = requested.ah_attr.has_grh ? requested.ah_attr.traffic_class : 0;
    }
    t.access = qp->attrs.qp_access_flags;
    // Port, P_Key index and timeout belong to the current path, which the
    // engine swaps when it migrates: written only when the application sets them.
    if (mask & IBV_QP_PORT) t.port = qp->attrs.port_num == 0 ? 1 : qp->attrs.port_num;
    if (mask & IBV_QP_PKEY_INDEX) t.pkey_index = qp->attrs.pkey_index;
    if (mask & IBV_QP_TIMEOUT) t.timeout = qp->attrs.timeout;
    if (mask & IBV_QP_ALT_PATH) {
      t.alt_dest_ip = alt_dest_ip;
      t.alt_traffic_class = requested.alt_ah_attr.has_grh ? requested.alt_ah_attr.traffic_class : 0;
      t.alt_port = qp->attrs.alt_port_num;
      t.alt_pkey_index = qp->attrs.alt_pkey_index;
      t.alt_timeout = qp->attrs.alt_timeout;
    }
    if (mask & IBV_QP_PATH_MIG_STATE) {
      t.mig_state = static_cast<engine::MigState>(qp->attrs.path_mig_state);
    }
    if (forced_migration) {
      // The application migrates the QP itself (IBA 17.2.8): no event.
      engine::SwapPaths(t);
      ++eqp.migrations;
    }
    t.retry_cnt = qp->attrs.retry_cnt;
    t.rnr_retry = qp->attrs.rnr_retry;
    t.min_rnr_timer = qp->attrs.min_rnr_timer;
    t.max_rd_atomic = qp->attrs.max_rd_atomic;
    t.sqd_notify = qp->attrs.en_sqd_async_notify;
    if (qp->attrs.sq_draining && !eqp.sq_draining) eqp.sqd_admit = eqp.sq.size();
    eqp.sq_draining = qp->attrs.sq_draining;
    if (!eqp.sq_draining) eqp.sqd_admit = 0;
    if (mask & IBV_QP_SQ_PSN) {
      eqp.next_send_psn = qp->attrs.sq_psn;
      eqp.last_acked_psn = (qp->attrs.sq_psn - 1) & 0xffffff;
    }
    if (mask & IBV_QP_RQ_PSN) eqp.epsn = qp->attrs.rq_psn;
    if (qp->attrs.state == objects::QpState::kReset) {
      // Back to the state of a new QP: every queue and transport context emptied.
      eqp.sq.clear();
      eqp.rq.clear();
      eqp.inflight.clear();
      eqp.replay.clear();
      eqp.sq_outstanding = 0;
      eqp.in_send = eqp.in_write = false;
      eqp.write_mr.reset();
      eqp.nak_sent = eqp.uc_resync = eqp.rnr_waiting = false;
      eqp.ack_held = false;  // its peer may be another by RTR
      eqp.msn = 0;
      eqp.comm_est = false;
      eqp.cwnd.Reset();
      t.alt_port = 0;
      t.alt_dest_ip = 0;
      t.mig_state = engine::MigState::kMigrated;
      qp->migrations_seen = eqp.migrations;
      // Its completions not yet polled go too (under eqp.mu, so the engine
      // adds none meanwhile): libmlx5 and libmlx4 clean the CQs at RESET,
      // and code that restates a QP from ERR expects to poll only new ones.
      size_t cleaned = eqp.send_cq != nullptr ? eqp.send_cq->RemoveQp(eqp.qpn) : 0;
      if (eqp.recv_cq != nullptr && eqp.recv_cq != eqp.send_cq) {
        cleaned += eqp.recv_cq->RemoveQp(eqp.qpn);
      }
      if (cleaned != 0) {
        Log().debug("{} qp#{}: RESET took {} unpolled completions out of its CQs", dev.name(),
                    eqp.qpn, cleaned);
      }
    }
  }
  ibv->state = qp->ibv.qp_base.state = static_cast<ibv_qp_state>(qp->attrs.state);
  if (before != qp->attrs.state) {
    Log().debug("{} qp#{} {}→{} (ibv_modify_qp)", dev.name(), ibv->qp_num, objects::ToString(before),
                objects::ToString(qp->attrs.state));
  }
  // Entering SQD lets the engine find the queue drained (and raise
  // SQ_DRAINED); returning to RTS resumes the WQEs posted meanwhile.
  if (qp->attrs.state == objects::QpState::kSqd || qp->attrs.state == objects::QpState::kRts) {
    ctx->engine->Doorbell(eqp.qpn);
  }
  if (qp->attrs.state == objects::QpState::kErr && before != objects::QpState::kErr) {
    engine::FlushQp(eqp);
    // An XRC target is attached to no SRQ (it only receives into them).
    if (eqp.srq && eqp.type != engine::QpType::kXrcRecv) {
      ctx->device->Raise({device::AsyncEventType::kQpLastWqeReached, eqp.handle, 0});
    }
  }
  return 0;
}

int QueryQp(ibv_qp* ibv, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr) {
  if (Status dead = DeadDevice(ibv->context, "ibv_query_qp"); !dead.ok()) return dead.code();
  Qp* qp = Control(ToQp(ibv));
  std::lock_guard modify(qp->modify_mu);
  SyncEngineState(*qp);
  const QpAttributes& a = qp->attrs;
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = static_cast<ibv_qp_state>(a.state);
  attr->cur_qp_state = static_cast<ibv_qp_state>(a.state);
  attr->path_mtu = static_cast<ibv_mtu>(a.path_mtu);
  attr->path_mig_state = static_cast<ibv_mig_state>(a.path_mig_state);
  attr->qkey = a.qkey;
  attr->rq_psn = a.rq_psn;
  attr->sq_psn = a.sq_psn;
  attr->dest_qp_num = a.dest_qp_num;
  attr->qp_access_flags = a.qp_access_flags;
  attr->cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
               a.cap.max_inline_data};
  attr->ah_attr = FromAv(a.ah_attr);
  attr->alt_ah_attr = FromAv(a.alt_ah_attr);
  attr->pkey_index = a.pkey_index;
  attr->alt_pkey_index = a.alt_pkey_index;
  attr->en_sqd_async_notify = a.en_sqd_async_notify;
  attr->sq_draining = a.sq_draining;
  attr->max_rd_atomic = a.max_rd_atomic;
  attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
  attr->min_rnr_timer = a.min_rnr_timer;
  attr->port_num = a.port_num;
  attr->timeout = a.timeout;
  attr->retry_cnt = a.retry_cnt;
  attr->rnr_retry = a.rnr_retry;
  attr->alt_port_num = a.alt_port_num;
  attr->alt_timeout = a.alt_timeout;
  if (init_attr != nullptr) {
    std::memset(init_attr, 0, sizeof *init_attr);
    init_attr->qp_context = ibv->qp_context;
    init_attr->send_cq = ibv->send_cq;
    init_attr->recv_cq = ibv->recv_cq;
    init_attr->srq = ibv->srq;
    init_attr->cap = attr->cap;
    init_attr->qp_type = ibv->qp_type;
    init_attr->sq_sig_all = qp->sq_sig_all;
  }
  return 0;
}

int DetachQp(ibv_qp* ibv) {
  Qp* qp = ToQp(ibv);
  if (int n = qp->flows.load(); n > 0) {
    Log().warn("ibv_destroy_qp qp#{}: {} flow rule(s) still steer to it; ibv_destroy_flow them first",
               ibv->qp_num, n);
    return EBUSY;
  }
  if (qp->tgt_owner != nullptr) {
    // An XRC target lives on while another handle to it does.
    std::lock_guard lock(TargetsMutex());
    qp->tgt_last = --qp->tgt_owner->tgt_handles == 0;
    if (!qp->tgt_last) {
      RetireHandle(ibv);
      return 0;
    }
  }
  // No control-plane event names it after this (see DetachCq).
  ToContext(ibv->context)->device->directory().Remove(objects::ObjectKind::kQp, ibv->qp_num);
  ToContext(ibv->context)->engine->StartPosted(ibv->qp_num);
  ToContext(ibv->context)->engine->RemoveQp(ibv->qp_num);
  RetireHandle(ibv);
  return 0;
}

void FreeQp(ibv_qp* ibv) {
  RemoveHandle(ibv);
  Qp* qp = ToQp(ibv);
  if (qp->tgt_owner != nullptr) {
    // One handle of an XRC target: the owner's memory holds the attributes
    // of them all and goes with the last handle.
    Qp* owner = qp->tgt_owner;
    --qp->xrcd->users;
    const bool last = qp->tgt_last;
    if (last) {
      ToContext(owner->ibv.qp_base.context)->device->ReturnObject(device::Device::Limited::kQp);
    }
    pthread_mutex_destroy(&ibv->mutex);
    pthread_cond_destroy(&ibv->cond);
    if (qp != owner) check::Dispose(qp);
    if (last) check::Dispose(owner);
    return;
  }
  ToContext(ibv->context)->device->ReturnObject(device::Device::Limited::kQp);
  --ToPd(ibv->pd)->users;
  if (ibv->srq != nullptr) --ToSrq(ibv->srq)->users;
  if (ibv->send_cq != nullptr) --ToCq(ibv->send_cq)->users;
  if (ToQp(ibv)->rss != nullptr) {
    --ToQp(ibv)->rss->users;
  } else if (ibv->recv_cq != nullptr) {
    --ToCq(ibv->recv_cq)->users;
  }
  pthread_mutex_destroy(&ibv->mutex);
  pthread_cond_destroy(&ibv->cond);
  check::Dispose(ToQp(ibv));
}

Result<ibv_qp*> OpenQp(ibv_context* context, const ibv_qp_open_attr& attr) {
  if (Status dead = DeadDevice(context, "ibv_open_qp"); !dead.ok()) return dead;
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  constexpr uint32_t kKnown = kNeeded | IBV_QP_OPEN_ATTR_CONTEXT;
  if (attr.comp_mask & ~kKnown) {
    Log().warn("ibv_open_qp: comp_mask {:#x} has unknown bits", attr.comp_mask & ~kKnown);
    return NotSupported("comp_mask");
  }
  if ((attr.comp_mask & kNeeded) != kNeeded || attr.xrcd == nullptr) {
    Log().warn("ibv_open_qp: comp_mask needs IBV_QP_OPEN_ATTR_NUM, _XRCD and _TYPE (with an xrcd)");
    return InvalidArgument("comp_mask");
  }
  if (attr.qp_type != IBV_QPT_XRC_RECV) {
    Log().warn("ibv_open_qp: only XRC_RECV QPs are opened (qp_type {})",
               static_cast<int>(attr.qp_type));
    return InvalidArgument("qp_type");
  }
  if (!HandleOf(attr.xrcd, Kind::kXrcd, context, "ibv_open_qp", "xrcd")) {
    return InvalidArgument("not an XRCD of this context");
  }
  Xrcd* xrcd = ToXrcd(attr.xrcd);
  Context* ctx = ToContext(context);
  std::lock_guard lock(TargetsMutex());
  std::shared_ptr<engine::Qp> eqp = ctx->engine->FindQp(attr.qp_num);
  if (!eqp || eqp->type != engine::QpType::kXrcRecv || eqp->xrcd != xrcd->domain->number) {
    // As the kernel, which looks in the domain's list of targets.
    Log().warn("ibv_open_qp: XRC domain {} has no XRC_RECV QP {:#x}", xrcd->domain->number,
               attr.qp_num);
    return InvalidArgument("no such target QP in the XRC domain");
  }
  Qp* owner = ToQp(reinterpret_cast<ibv_qp*>(eqp->handle));
  auto* qp = new Qp{};
  qp->qp = std::move(eqp);
  qp->type = objects::QpType::kXrcRecv;
  qp->tgt_owner = owner;
  ++owner->tgt_handles;
  qp->xrcd = xrcd;
  ++xrcd->users;
  ibv_qp& q = qp->ibv.qp_base;
  q.context = context;
  q.qp_context = (attr.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr.qp_context : nullptr;
  q.handle = q.qp_num = attr.qp_num;
  q.state = owner->ibv.qp_base.state;
  q.qp_type = IBV_QPT_XRC_RECV;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  q.events_completed = 0;
  AddHandle(&q, Kind::kQp, context);
  Log().debug("{} qp#{}: another handle to the XRC_RECV QP (ibv_open_qp)", ctx->device->name(),
              q.qp_num);
  return &q;
}

Result<ibv_ah*> CreateAh(ibv_pd* pd, const ibv_ah_attr& attr) {
  if (Status dead = DeadDevice(pd->context, "ibv_create_ah"); !dead.ok()) return dead;
  const device::Device& dev = *ToContext(pd->context)->device;
  if (!dev.ValidPort(attr.port_num)) {
    Log().warn("ibv_create_ah: port_num {} is not a port of {}", attr.port_num, dev.name());
    return InvalidArgument("port");
  }
  bool roce = dev.QueryPort(attr.port_num).link_layer == device::LinkLayer::kEthernet;
  if (roce && !attr.is_global) {
    Log().warn("ibv_create_ah: on RoCE (Ethernet link layer) an address handle needs a GRH: set "
               "is_global = 1 and grh.dgid (ibv_ud_pingpong: use -g 0)");
    return InvalidArgument("no GRH on RoCE");
  }
  if (attr.is_global && attr.grh.sgid_index >= device::kGidTableLength) {
    Log().warn("ibv_create_ah: sgid_index {} is outside the GID table", attr.grh.sgid_index);
    return InvalidArgument("sgid_index");
  }
  uint32_t ip = attr.is_global ? 0 : dev.LidAddress(attr.port_num, attr.dlid);
  if (!attr.is_global && ip == 0) {
    Log().warn("ibv_create_ah: no port of the subnet has DLID {:#x} (now): packets to it are lost, as on a "
               "subnet where the LID is unassigned", attr.dlid);
  }
  if (attr.is_global && !Ipv4FromGid(attr.grh.dgid.raw, &ip)) {
    Log().warn("ibv_create_ah: the destination GID is not an IPv4-mapped RoCE v2 GID; this "
               "device reaches IPv4 hosts only");
    return InvalidArgument("dgid");
  }
  ObjectSlot slot(*ToContext(pd->context)->device, ObjectSlot::Limited::kAh, "ibv_create_ah");
  if (!slot.ok()) return NoMemory("max_ah");
  slot.Keep();
  auto* ah = new Ah{};
  ++ToPd(pd)->users;
  ah->ibv.context = pd->context;
  ah->ibv.pd = pd;
  ah->attr = attr;
  ah->dst_ip = ip;
  AddHandle(&ah->ibv, Kind::kAh, pd->context);
  return &ah->ibv;
}

namespace {

// The group of an IPv4-mapped multicast GID (::ffff:224.0.0.0/4), network
// order; EINVAL, with a line naming what is wrong, for any other GID.
Result<uint32_t> McastGroup(const ibv_gid& gid, const char* verb) {
  uint32_t group = 0;
  if (!Ipv4FromGid(gid.raw, &group)) {
    Log().warn("{}: the GID is not IPv4-mapped (::ffff:a.b.c.d): this RoCE v2 device carries "
               "multicast as IPv4 multicast, the MGID of group 239.1.2.3 being ::ffff:239.1.2.3",
               verb);
    return InvalidArgument("not an IPv4-mapped multicast GID");
  }
  if (!IN_MULTICAST(ntohl(group))) {
    Log().warn("{}: ::ffff:{} is not a multicast GID (its IPv4 address is not in 224.0.0.0/4)",
               verb, net::ToString(in_addr{group}));
    return InvalidArgument("not a multicast GID");
  }
  return group;
}

// Checks what ibv_attach_mcast and ibv_detach_mcast share; the QP's port.
Result<uint8_t> McastPort(ibv_qp* ibv, const char* verb) {
  if (Status dead = DeadDevice(ibv->context, verb); !dead.ok()) return dead;
  if (ibv->qp_type != IBV_QPT_UD) {
    Log().warn("{}: qp#{} is not a UD QP: only UD QPs receive multicast (IBA 10.5)", verb,
               ibv->qp_num);
    return InvalidArgument("not a UD QP");
  }
  Qp* qp = ToQp(ibv);
  std::lock_guard lock(qp->modify_mu);
  // A QP in RESET has no port yet: port 1, where every device has one.
  return qp->attrs.port_num != 0 ? qp->attrs.port_num : uint8_t{1};
}

}  // namespace

int AttachMcast(ibv_qp* ibv, const ibv_gid& gid, uint16_t lid) {
  (void)lid;  // RoCE has no multicast LIDs: the group is the address
  auto port = McastPort(ibv, "ibv_attach_mcast");
  if (!port.ok()) return port.status().code();
  auto group = McastGroup(gid, "ibv_attach_mcast");
  if (!group.ok()) return group.status().code();
  Status s = ToContext(ibv->context)->engine->AttachMcast(ibv->qp_num, *port, *group);
  if (!s.ok()) {
    Log().warn("ibv_attach_mcast: qp#{} cannot join {}: {}", ibv->qp_num,
               net::ToString(in_addr{*group}), s.message());
  }
  return s.code();
}

int DetachMcast(ibv_qp* ibv, const ibv_gid& gid, uint16_t lid) {
  (void)lid;
  auto port = McastPort(ibv, "ibv_detach_mcast");
  if (!port.ok()) return port.status().code();
  auto group = McastGroup(gid, "ibv_detach_mcast");
  if (!group.ok()) return group.status().code();
  Status s = ToContext(ibv->context)->engine->DetachMcast(ibv->qp_num, *port, *group);
  if (!s.ok()) Log().warn("ibv_detach_mcast: {}", s.message());
  return s.code();
}

int DestroyAh(ibv_ah* ah) {
  RemoveHandle(ah);
  ToContext(ah->context)->device->ReturnObject(device::Device::Limited::kAh);
  --ToPd(ah->pd)->users;
  check::Dispose(ToAh(ah));
  return 0;
}

engine::CounterValues QueryQpCounters(ibv_qp* qp) { return ToQp(qp)->qp->counters.Snapshot(); }

}  // namespace rdmaemu::provider
