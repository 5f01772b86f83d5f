// The extended post API (ibv_wr_*, man ibv_wr_post): a QP created through
// ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS gets the function
// pointers of its ibv_qp_ex filled here.
//
// How a batch works here:
// - wr_start takes the QP's batch lock (held until wr_complete or wr_abort,
//   as rdma-core's providers hold their SQ lock) and empties the batch.
// - Each WR builder (wr_send, wr_rdma_write, …) appends a new ibv_send_wr
//   made from qpx->wr_id and qpx->wr_flags; the setters fill the last one.
//   Nothing is checked here beyond what cannot wait: a builder or setter that
//   can never succeed records its errno on the WR.
// - wr_complete turns each WR, in order, into the device's WQE through
//   BuildSendWqe, the validation ibv_post_send uses, then queues them all
//   through QueueSends. The man page says a failing batch is aborted as a
//   whole, and so it is here: on any error NOTHING of the batch is posted
//   (not even the WRs before the failing one), and the errno of the first
//   failing WR in batch order is returned.
// - wr_abort discards the batch.
//
// Data: set_sge/set_sge_list keep the application's SGEs (the data is read
// when the device sends it, as with ibv_post_send); set_inline_data(_list)
// copy the bytes at once, so the application may reuse its buffer as soon as
// the setter returns.
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "provider/objects.h"

namespace rdmaemu::provider {

struct WrBatch {
  struct Pending {
    ibv_send_wr wr;      // sg_list is set at wr_complete (the vectors may move)
    size_t first_sge;    // into WrBatch::sges
    unsigned app_flags;  // qpx->wr_flags when the builder ran
    bool inline_copy;    // its SGE addresses are offsets into inline_bytes
    int error;           // 0, or the errno a builder or setter recorded
    std::string why;     // for the log line when error != 0
  };

  uint64_t send_ops = 0;  // the QP's send_ops_flags, constant
  std::mutex mu;          // held from wr_start to wr_complete/wr_abort
  std::atomic<bool> open{false};
  std::atomic<std::thread::id> owner{};
  std::vector<Pending> wrs;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inline_bytes;
  std::vector<engine::SendWqe> wqes;  // reused between batches

  void Clear() {
    wrs.clear();
    sges.clear();
    inline_bytes.clear();
    wqes.clear();
  }
};

namespace {

// The send_ops_flags bits, named as verbs.h names them.
struct OpFlag {
  uint64_t bit;
  const char* name;
};
constexpr OpFlag kOpFlags[] = {
    {IBV_QP_EX_WITH_RDMA_WRITE, "RDMA_WRITE"},
    {IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, "RDMA_WRITE_WITH_IMM"},
    {IBV_QP_EX_WITH_SEND, "SEND"},
    {IBV_QP_EX_WITH_SEND_WITH_IMM, "SEND_WITH_IMM"},
    {IBV_QP_EX_WITH_RDMA_READ, "RDMA_READ"},
    {IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, "ATOMIC_CMP_AND_SWP"},
    {IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, "ATOMIC_FETCH_AND_ADD"},
    {IBV_QP_EX_WITH_LOCAL_INV, "LOCAL_INV"},
    {IBV_QP_EX_WITH_BIND_MW, "BIND_MW"},
    {IBV_QP_EX_WITH_SEND_WITH_INV, "SEND_WITH_INV"},
    {IBV_QP_EX_WITH_TSO, "TSO"},
    {IBV_QP_EX_WITH_ATOMIC_WRITE, "ATOMIC_WRITE"},
    {kQpExWithFlush, "FLUSH"},
};

std::string FlagNames(uint64_t flags) {
  std::string out;
  for (const OpFlag& f : kOpFlags) {
    if (flags & f.bit) {
      if (!out.empty()) out += '|';
      out += f.name;
      flags &= ~f.bit;
    }
  }
  if (flags != 0) {
    if (!out.empty()) out += '|';
    out += fmt::format("unknown bits {:#x}", flags);
  }
  return out;
}

// What this device carries on each transport (the opcodes ibv_post_send
// accepts, and ATOMIC_WRITE and FLUSH, which only this API posts; TSO is
// not implemented).
uint64_t SupportedSendOps(ibv_qp_type type) {
  constexpr uint64_t kSend = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  constexpr uint64_t kWrite = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  constexpr uint64_t kWindows = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
  switch (type) {
    case IBV_QPT_RC:
      return kSend | kWrite | kWindows | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_READ |
             IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
             IBV_QP_EX_WITH_ATOMIC_WRITE | kQpExWithFlush;
    case IBV_QPT_XRC_SEND:
      // RC's operations without the Memory Placement Extensions; windows
      // are bound on RC and UC QPs only (as rxe).
      return kSend | kWrite | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_READ |
             IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    case IBV_QPT_UC:
      return kSend | kWrite | kWindows;
    case IBV_QPT_UD:
      return kSend;
    case IBV_QPT_RAW_PACKET:
      return IBV_QP_EX_WITH_SEND;
    default:
      return 0;
  }
}

const char* TypeName(ibv_qp_type type) {
  switch (type) {
    case IBV_QPT_RC: return "RC";
    case IBV_QPT_UC: return "UC";
    case IBV_QPT_UD: return "UD";
    case IBV_QPT_RAW_PACKET: return "RAW_PACKET";
    case IBV_QPT_XRC_SEND: return "XRC_SEND";
    case IBV_QPT_XRC_RECV: return "XRC_RECV";
    default: return "this";
  }
}

Qp& QpOf(ibv_qp_ex* q) { return *reinterpret_cast<Qp*>(q); }
WrBatch& BatchOf(ibv_qp_ex* q) { return *QpOf(q).wr_batch; }

// A builder or setter used outside wr_start..wr_complete: the WR cannot be
// part of any batch (and touching the batch would race with its owner).
bool Outside(ibv_qp_ex* q, const char* verb) {
  if (BatchOf(q).open.load(std::memory_order_relaxed)) return false;
  RDMAEMU_WARN_LIMITED("{} on qp#{} outside ibv_wr_start()..ibv_wr_complete(): ignored", verb,
                       q->qp_base.qp_num);
  return true;
}

void Record(WrBatch::Pending& p, int error, std::string why) {
  if (p.error == 0) {
    p.error = error;
    p.why = std::move(why);
  }
}

// Starts a new WR. `needed` is the send_ops_flags bit the operation needs.
// An operation the QP was not created for fails the batch with EOPNOTSUPP:
// the QP does not support it (the errno creation gives for the same op), as
// opposed to EINVAL, which is kept for malformed work requests.
WrBatch::Pending* Begin(ibv_qp_ex* q, const char* verb, ibv_wr_opcode op, uint64_t needed) {
  if (Outside(q, verb)) return nullptr;
  WrBatch& b = BatchOf(q);
  WrBatch::Pending& p = b.wrs.emplace_back();
  p.wr = ibv_send_wr{};
  p.wr.wr_id = q->wr_id;
  p.wr.opcode = op;
  p.wr.send_flags = p.app_flags = q->wr_flags;
  p.first_sge = b.sges.size();
  p.inline_copy = false;
  p.error = 0;
  if (needed == 0 || !(b.send_ops & needed)) {
    Record(p, EOPNOTSUPP,
           needed == 0 ? fmt::format("{} is not supported by this device", verb)
                       : fmt::format("{} needs IBV_QP_EX_WITH_{} in the QP's send_ops_flags "
                                     "(created with {})",
                                     verb, FlagNames(needed), FlagNames(b.send_ops)));
  }
  return &p;
}

// The WR the setters fill: the last one started in this batch.
WrBatch::Pending* Current(ibv_qp_ex* q, const char* verb) {
  if (Outside(q, verb)) return nullptr;
  WrBatch& b = BatchOf(q);
  if (b.wrs.empty()) {
    // No WR to attach to: fail the batch through a placeholder WR.
    WrBatch::Pending& p = b.wrs.emplace_back();
    p.wr = ibv_send_wr{};
    p.wr.wr_id = q->wr_id;
    p.app_flags = 0;
    p.first_sge = b.sges.size();
    p.inline_copy = false;
    p.error = 0;
    Record(p, EINVAL, fmt::format("{} called before any WR builder (ibv_wr_send, …)", verb));
    return nullptr;
  }
  return &b.wrs.back();
}

// ---- builders ---------------------------------------------------------------

void WrSend(ibv_qp_ex* q) { Begin(q, "ibv_wr_send", IBV_WR_SEND, IBV_QP_EX_WITH_SEND); }

void WrSendImm(ibv_qp_ex* q, __be32 imm) {
  if (auto* p = Begin(q, "ibv_wr_send_imm", IBV_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM)) {
    p->wr.imm_data = imm;
  }
}

void WrSendInv(ibv_qp_ex* q, uint32_t invalidate_rkey) {
  if (auto* p = Begin(q, "ibv_wr_send_inv", IBV_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV)) {
    p->wr.invalidate_rkey = invalidate_rkey;
  }
}

void WrSendTso(ibv_qp_ex* q, void* hdr, uint16_t hdr_sz, uint16_t mss) {
  Begin(q, "ibv_wr_send_tso", IBV_WR_TSO, 0);
}

void WrRdmaWrite(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr) {
  if (auto* p = Begin(q, "ibv_wr_rdma_write", IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE)) {
    p->wr.wr.rdma.rkey = rkey;
    p->wr.wr.rdma.remote_addr = remote_addr;
  }
}

void WrRdmaWriteImm(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, __be32 imm) {
  if (auto* p = Begin(q, "ibv_wr_rdma_write_imm", IBV_WR_RDMA_WRITE_WITH_IMM,
                      IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)) {
    p->wr.wr.rdma.rkey = rkey;
    p->wr.wr.rdma.remote_addr = remote_addr;
    p->wr.imm_data = imm;
  }
}

void WrRdmaRead(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr) {
  if (auto* p = Begin(q, "ibv_wr_rdma_read", IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ)) {
    p->wr.wr.rdma.rkey = rkey;
    p->wr.wr.rdma.remote_addr = remote_addr;
  }
}

void WrAtomicCmpSwp(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
                    uint64_t swap) {
  if (auto* p = Begin(q, "ibv_wr_atomic_cmp_swp", IBV_WR_ATOMIC_CMP_AND_SWP,
                      IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)) {
    p->wr.wr.atomic.rkey = rkey;
    p->wr.wr.atomic.remote_addr = remote_addr;
    p->wr.wr.atomic.compare_add = compare;
    p->wr.wr.atomic.swap = swap;
  }
}

void WrAtomicFetchAdd(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  if (auto* p = Begin(q, "ibv_wr_atomic_fetch_add", IBV_WR_ATOMIC_FETCH_AND_ADD,
                      IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)) {
    p->wr.wr.atomic.rkey = rkey;
    p->wr.wr.atomic.remote_addr = remote_addr;
    p->wr.wr.atomic.compare_add = add;
  }
}

// The window, region and rights are checked at wr_complete (BuildSendWqe)
// and when the device executes the bind, as for IBV_WR_BIND_MW.
void WrBindMw(ibv_qp_ex* q, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  auto* p = Begin(q, "ibv_wr_bind_mw", IBV_WR_BIND_MW, IBV_QP_EX_WITH_BIND_MW);
  if (p == nullptr) return;
  if (info == nullptr) {
    Record(*p, EINVAL, "ibv_wr_bind_mw without bind_info");
    return;
  }
  p->wr.bind_mw.mw = mw;
  p->wr.bind_mw.rkey = rkey;
  p->wr.bind_mw.bind_info = *info;
}

void WrLocalInv(ibv_qp_ex* q, uint32_t invalidate_rkey) {
  if (auto* p = Begin(q, "ibv_wr_local_inv", IBV_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV)) {
    p->wr.invalidate_rkey = invalidate_rkey;
  }
}

// ATOMIC_WRITE and FLUSH have no fields of their own in ibv_send_wr; the
// batch carries their operands in wr.wr.atomic, which BuildSendWqe reads
// for these two opcodes only: remote_addr and rkey as named, compare_add the
// 8 bytes to write (copied now, as the man page lets the caller reuse
// atomic_wr at once) or the flush's length, swap the flush's type and level.
void WrAtomicWrite(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, const void* atomic_wr) {
  auto* p = Begin(q, "ibv_wr_atomic_write", IBV_WR_ATOMIC_WRITE, IBV_QP_EX_WITH_ATOMIC_WRITE);
  if (p == nullptr) return;
  if (atomic_wr == nullptr) {
    Record(*p, EINVAL, "ibv_wr_atomic_write without the 8 bytes to write (atomic_wr is NULL)");
    return;
  }
  p->wr.wr.atomic.rkey = rkey;
  p->wr.wr.atomic.remote_addr = remote_addr;
  std::memcpy(&p->wr.wr.atomic.compare_add, atomic_wr, sizeof p->wr.wr.atomic.compare_add);
}

void WrFlush(ibv_qp_ex* q, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type, uint8_t level) {
  auto* p = Begin(q, "ibv_wr_flush", kWrFlush, kQpExWithFlush);
  if (p == nullptr) return;
  constexpr uint8_t kGlobal = 1, kPersistent = 2, kRange = 0, kMr = 1;
  if (type == 0 || (type & ~(kGlobal | kPersistent)) != 0) {
    Record(*p, EINVAL, fmt::format("ibv_wr_flush: type {:#x} is not IBV_FLUSH_GLOBAL and/or "
                                   "IBV_FLUSH_PERSISTENT", type));
    return;
  }
  if (level != kRange && level != kMr) {
    Record(*p, EINVAL, fmt::format("ibv_wr_flush: level {} is neither IBV_FLUSH_RANGE (0) nor "
                                   "IBV_FLUSH_MR (1)", level));
    return;
  }
  if (len > UINT32_MAX) {
    Record(*p, EINVAL, fmt::format("ibv_wr_flush: length {} does not fit the RETH's 32 bits", len));
    return;
  }
  p->wr.wr.atomic.rkey = rkey;
  p->wr.wr.atomic.remote_addr = remote_addr;
  p->wr.wr.atomic.compare_add = len;
  p->wr.wr.atomic.swap = type | (uint64_t{level} << 8);
}

// ---- setters ----------------------------------------------------------------

void SetUdAddr(ibv_qp_ex* q, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  WrBatch::Pending* p = Current(q, "ibv_wr_set_ud_addr");
  if (p == nullptr) return;
  if (q->qp_base.qp_type != IBV_QPT_UD) {
    // wr.ud shares a union with wr.rdma/wr.atomic: never written on other QPs.
    Record(*p, EINVAL, fmt::format("ibv_wr_set_ud_addr on a {} QP (UD only)",
                                   TypeName(q->qp_base.qp_type)));
    return;
  }
  p->wr.wr.ud.ah = ah;
  p->wr.wr.ud.remote_qpn = remote_qpn;
  p->wr.wr.ud.remote_qkey = remote_qkey;
}

void SetXrcSrqn(ibv_qp_ex* q, uint32_t remote_srqn) {
  WrBatch::Pending* p = Current(q, "ibv_wr_set_xrc_srqn");
  if (p == nullptr) return;
  if (q->qp_base.qp_type != IBV_QPT_XRC_SEND) {
    Record(*p, EINVAL, fmt::format("ibv_wr_set_xrc_srqn on a {} QP (XRC_SEND only)",
                                   TypeName(q->qp_base.qp_type)));
    return;
  }
  p->wr.qp_type.xrc.remote_srqn = remote_srqn;
}

// A data setter replaces whatever data an earlier setter gave the same WR
// (the current WR's SGEs and inline bytes are always the last ones).
void ResetData(WrBatch& b, WrBatch::Pending& p) {
  if (p.inline_copy && p.wr.num_sge > 0) b.inline_bytes.resize(b.sges[p.first_sge].addr);
  b.sges.resize(p.first_sge);
  p.wr.num_sge = 0;
  p.inline_copy = false;
  p.wr.send_flags = p.app_flags;
}

void SetSges(ibv_qp_ex* q, const char* verb, size_t num_sge, const ibv_sge* sg_list) {
  WrBatch::Pending* p = Current(q, verb);
  if (p == nullptr) return;
  WrBatch& b = BatchOf(q);
  ResetData(b, *p);
  // BuildSendWqe checks num_sge against max_send_sge before it reads any SGE:
  // a list that long is not copied, only its length is passed on.
  p->wr.num_sge = static_cast<int>(std::min<size_t>(num_sge, INT_MAX));
  if (num_sge <= QpOf(q).qp->caps.max_send_sge) b.sges.insert(b.sges.end(), sg_list, sg_list + num_sge);
}

void SetSgeList(ibv_qp_ex* q, size_t num_sge, const ibv_sge* sg_list) {
  SetSges(q, "ibv_wr_set_sge_list", num_sge, sg_list);
}

void SetSge(ibv_qp_ex* q, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge sge{addr, length, lkey};
  SetSges(q, "ibv_wr_set_sge", 1, &sge);
}

// Copies the data now; the WR gets one SGE over the copy (its address an
// offset into inline_bytes until wr_complete) and IBV_SEND_INLINE, so that
// BuildSendWqe applies the inline rules of ibv_post_send (max_inline_data,
// not on RDMA READ or atomics).
void SetInline(ibv_qp_ex* q, const char* verb, size_t num_buf, const ibv_data_buf* buf_list) {
  WrBatch::Pending* p = Current(q, verb);
  if (p == nullptr) return;
  WrBatch& b = BatchOf(q);
  ResetData(b, *p);
  const size_t start = b.inline_bytes.size();
  size_t total = 0;
  for (size_t i = 0; i < num_buf; ++i) total += buf_list[i].length;
  if (total > UINT32_MAX) {
    Record(*p, EINVAL, fmt::format("{} bytes of inline data", total));
    return;
  }
  b.inline_bytes.reserve(start + total);
  for (size_t i = 0; i < num_buf; ++i) {
    const auto* d = static_cast<const uint8_t*>(buf_list[i].addr);
    b.inline_bytes.insert(b.inline_bytes.end(), d, d + buf_list[i].length);
  }
  p->inline_copy = true;
  p->wr.send_flags |= IBV_SEND_INLINE;
  if (total == 0) return;  // no SGE: a zero-length message
  b.sges.push_back(ibv_sge{start, static_cast<uint32_t>(total), 0});
  p->wr.num_sge = 1;
}

void SetInlineDataList(ibv_qp_ex* q, size_t num_buf, const ibv_data_buf* buf_list) {
  SetInline(q, "ibv_wr_set_inline_data_list", num_buf, buf_list);
}

void SetInlineData(ibv_qp_ex* q, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  SetInline(q, "ibv_wr_set_inline_data", 1, &buf);
}

// ---- start, complete, abort -------------------------------------------------

void Close(WrBatch& b) {
  b.Clear();
  b.owner.store(std::thread::id{}, std::memory_order_relaxed);
  b.open.store(false, std::memory_order_relaxed);
  b.mu.unlock();
}

void WrStart(ibv_qp_ex* q) {
  WrBatch& b = BatchOf(q);
  if (b.open.load(std::memory_order_relaxed) &&
      b.owner.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
    // Locking again would deadlock this thread: start over instead.
    RDMAEMU_WARN_LIMITED("ibv_wr_start on qp#{} twice without ibv_wr_complete/ibv_wr_abort: "
                         "the unfinished batch is discarded", q->qp_base.qp_num);
    b.Clear();
    return;
  }
  b.mu.lock();
  b.Clear();
  b.owner.store(std::this_thread::get_id(), std::memory_order_relaxed);
  b.open.store(true, std::memory_order_relaxed);
}

void WrAbort(ibv_qp_ex* q) {
  WrBatch& b = BatchOf(q);
  if (!b.open.load(std::memory_order_relaxed)) {
    RDMAEMU_WARN_LIMITED("ibv_wr_abort on qp#{} without ibv_wr_start", q->qp_base.qp_num);
    return;
  }
  Close(b);
}

// Validates the whole batch, then queues it; see the top of the file.
int Post(Qp& qp, WrBatch& b) {
  engine::Qp& eqp = *qp.qp;
  for (WrBatch::Pending& p : b.wrs) {
    if (p.error != 0) {
      RDMAEMU_WARN_LIMITED("ibv_wr_complete qp#{} wr_id {}: {}; nothing of the batch is posted",
                           eqp.qpn, p.wr.wr_id, p.why);
      return p.error;
    }
    p.wr.sg_list = p.wr.num_sge > 0 ? &b.sges[p.first_sge] : nullptr;
    if (p.inline_copy && p.wr.num_sge > 0) {
      p.wr.sg_list->addr = reinterpret_cast<uintptr_t>(b.inline_bytes.data() + p.wr.sg_list->addr);
    }
    auto built = BuildSendWqe(qp, p.wr);  // logs why it refuses
    if (!built.ok()) return built.status().code();
    b.wqes.push_back(std::move(built).value());
  }
  if (b.wqes.empty()) return 0;
  {
    // QueueSends posts up to the SQ's capacity; a batch must go in whole or
    // not at all. sq_outstanding only falls between this check and
    // QueueSends (the man page forbids ibv_post_send on this QP while a
    // batch is open), so a batch that fits here fits there.
    std::lock_guard lock(eqp.mu);
    if (eqp.sq_outstanding + b.wqes.size() > eqp.caps.max_send_wr) {
      Log().debug("ibv_wr_complete qp#{}: {} WRs do not fit the send queue ({} of {} in use); "
                  "nothing of the batch is posted",
                  eqp.qpn, b.wqes.size(), eqp.sq_outstanding, eqp.caps.max_send_wr);
      return ENOMEM;
    }
  }
  size_t queued = 0;
  return QueueSends(qp, b.wqes, &queued);
}

int WrComplete(ibv_qp_ex* q) {
  WrBatch& b = BatchOf(q);
  if (!b.open.load(std::memory_order_relaxed)) {
    RDMAEMU_WARN_LIMITED("ibv_wr_complete on qp#{} without ibv_wr_start", q->qp_base.qp_num);
    return EINVAL;
  }
  int rc = Post(QpOf(q), b);
  Close(b);
  return rc;
}

}  // namespace

Status CheckSendOpsFlags(ibv_qp_type type, uint64_t send_ops_flags) {
  const uint64_t unsupported = send_ops_flags & ~SupportedSendOps(type);
  if (unsupported == 0) return Status::Ok();
  Log().warn("ibv_create_qp_ex: send_ops_flags {} not supported on a {} QP by this device ({} "
             "QPs support {})",
             FlagNames(unsupported), TypeName(type), TypeName(type),
             FlagNames(SupportedSendOps(type)));
  return NotSupported("send_ops_flags");
}

void InstallQpEx(Qp& qp, uint64_t send_ops_flags) {
  qp.wr_batch = std::make_shared<WrBatch>();
  qp.wr_batch->send_ops = send_ops_flags;
  ibv_qp_ex& x = qp.ibv;
  x.wr_start = WrStart;
  x.wr_complete = WrComplete;
  x.wr_abort = WrAbort;
  x.wr_send = WrSend;
  x.wr_send_imm = WrSendImm;
  x.wr_send_inv = WrSendInv;
  x.wr_send_tso = WrSendTso;
  x.wr_rdma_write = WrRdmaWrite;
  x.wr_rdma_write_imm = WrRdmaWriteImm;
  x.wr_rdma_read = WrRdmaRead;
  x.wr_atomic_cmp_swp = WrAtomicCmpSwp;
  x.wr_atomic_fetch_add = WrAtomicFetchAdd;
  x.wr_bind_mw = WrBindMw;
  x.wr_local_inv = WrLocalInv;
  x.wr_atomic_write = WrAtomicWrite;
  qp.wr_flush = WrFlush;
  x.wr_set_ud_addr = SetUdAddr;
  x.wr_set_xrc_srqn = SetXrcSrqn;
  x.wr_set_inline_data = SetInlineData;
  x.wr_set_inline_data_list = SetInlineDataList;
  x.wr_set_sge = SetSge;
  x.wr_set_sge_list = SetSgeList;
}

BatchSends OpenBatch(ibv_qp_ex* q) {
  BatchSends out;
  if (!QpOf(q).wr_batch) return out;
  const WrBatch& b = BatchOf(q);
  std::vector<size_t> first;
  for (const WrBatch::Pending& p : b.wrs) {
    ibv_send_wr wr = p.wr;
    wr.next = nullptr;
    wr.sg_list = nullptr;
    first.push_back(out.sges.size());
    const bool listed = wr.num_sge > 0 && p.first_sge + static_cast<size_t>(wr.num_sge) <= b.sges.size();
    if (p.inline_copy || !listed) {
      wr.num_sge = 0;
    } else {
      out.sges.insert(out.sges.end(), b.sges.begin() + static_cast<std::ptrdiff_t>(p.first_sge),
                      b.sges.begin() + static_cast<std::ptrdiff_t>(p.first_sge + wr.num_sge));
    }
    out.wrs.push_back(wr);
  }
  for (size_t i = 0; i < out.wrs.size(); ++i) {
    if (out.wrs[i].num_sge > 0) out.wrs[i].sg_list = out.sges.data() + first[i];
    if (i + 1 < out.wrs.size()) out.wrs[i].next = &out.wrs[i + 1];
  }
  return out;
}

ibv_qp_ex* QpToQpEx(ibv_qp* qp) {
  Qp* q = ToQp(qp);
  return q->wr_batch ? &q->ibv : nullptr;
}

}  // namespace rdmaemu::provider
