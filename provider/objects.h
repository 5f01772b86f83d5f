// Provider objects: each embeds the rdma-core struct the application holds
// as its first member, and is recovered from that pointer (as in rdma-core's
// providers).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <vector>

#include "emulator/device/device.h"
#include "emulator/engine/engine.h"
#include "emulator/objects/qp_state.h"
#include "emulator/objects/cq.h"
#include "emulator/objects/device_memory.h"
#include "emulator/objects/mr.h"
#include "emulator/objects/xrcd.h"
#include "provider/provider.h"

namespace rdmaemu::provider {

struct CmdFile;

struct Context {
  verbs_context vctx;  // must be first
  std::shared_ptr<engine::Engine> engine;
  device::Device* device = nullptr;  // the engine's
  // The objects its cmd_fd names, shared with every context imported from
  // it (ibv_import_device); cmd_file.h.
  std::shared_ptr<CmdFile> file;
  int listener_id = 0;
  std::atomic<int> rwq_ind_tables{0};  // held against device::kMaxRwqIndTables
};

// How many objects use a PD. Every ibv_pd that names one PD (the one
// ibv_alloc_pd gave and those ibv_import_pd gave) shares one count, as the
// kernel counts the PD and not the program's structs; each also counts the
// objects that point at it (`local`), which its unimport must not leave
// dangling.
class UseCount {
 public:
  UseCount& operator++() {
    ++*n_;
    ++local_;
    return *this;
  }
  UseCount& operator--() {
    --*n_;
    --local_;
    return *this;
  }
  int load() const { return n_->load(); }
  int local() const { return local_.load(); }
  void ShareWith(const UseCount& other) { n_ = other.n_; }
  bool Shares(const UseCount& other) const { return n_ == other.n_; }

 private:
  std::shared_ptr<std::atomic<int>> n_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> local_{0};
};

// ibv_alloc_td: a promise that one thread at a time uses what is created on
// its parent domains.
struct Td {
  ibv_td ibv;  // must be first
  std::atomic<int> users{0};  // parent domains on it
};

struct Pd {
  ibv_pd ibv;  // must be first
  uint32_t handle = 0;
  UseCount users;  // MRs, MWs, QPs, SRQs, WQs, AHs, parent domains, CQs (parent domains)
  bool imported = false;  // by ibv_import_pd: ibv_unimport_pd releases it
  // Set iff this is a parent domain (ibv_alloc_parent_domain): it protects
  // with `protection`'s handle, and the buffers of CQs created on it come
  // from `alloc`/`free` when the program gave them (domain.cc).
  Pd* protection = nullptr;
  Td* td = nullptr;
  void* (*alloc)(ibv_pd*, void*, size_t, size_t, uint64_t) = nullptr;
  void (*free)(ibv_pd*, void*, void*, uint64_t) = nullptr;
  void* pd_context = nullptr;
};

struct Dm;

struct Mr {
  ibv_mr ibv;  // must be first
  std::shared_ptr<const objects::Mr> mr;
  // The registered-MR count of the device memory it registers
  // (ibv_reg_dm_mr), shared by the DM's views; NULL for host memory.
  std::shared_ptr<std::atomic<int>> dm_users;
  bool imported = false;  // by ibv_import_mr: ibv_unimport_mr releases it
  // The PD view whose count the region holds (the one it was registered or
  // reregistered on), shared by the region's views: an imported view's own
  // `ibv.pd` is the importer's PD, which never counted it. NULL for a
  // region on device memory (never imported): its ibv.pd counted it.
  std::shared_ptr<Pd*> counted_pd;
};

// ibv_alloc_dm's buffer (dm.cc).
struct Dm {
  ibv_dm ibv;  // must be first
  // Shared by the DM's views (the allocating one and each ibv_import_dm):
  // the memory and the count of MRs registered on it through any view.
  std::shared_ptr<objects::DmBuffer> buffer;
  std::shared_ptr<std::atomic<int>> users = std::make_shared<std::atomic<int>>(0);
  bool imported = false;  // by ibv_import_dm: ibv_unimport_dm releases it
};

struct Mw {
  ibv_mw ibv;  // must be first
  // The rkey it was allocated with: its upper 24 bits name the window to
  // the device for good (ibv.rkey changes with every type 1 bind).
  uint32_t key = 0;
};

struct Cq {
  ibv_cq_ex ibv;  // must be first; ibv_cq_ex starts with ibv_cq's fields
  // Created on a parent domain (IBV_CQ_INIT_ATTR_MASK_PD): its ring comes
  // from `memory`, which must outlive `cq` (declared first, destroyed last).
  Pd* parent_domain = nullptr;
  std::unique_ptr<std::pmr::memory_resource> memory;
  std::unique_ptr<objects::Cq> cq;
  uint64_t wc_flags = 0;
  std::atomic<int> users{0};  // QPs completing into it
  // Extended polling: the CQE between start_poll and next/end_poll, and the
  // lock that makes one start..end sequence exclusive, as rxe's provider does.
  std::mutex poll_mu;
  objects::Cqe current;
  // Guarded by poll_mu: this extended poll took a receive's completion.
  bool took_receive = false;
  uint32_t number = 0;  // in the device's directory (the control plane's name)
};

// An XRC domain handle (ibv_open_xrcd): several handles, of one context or
// of several, may name one domain (objects::XrcdTable).
struct Xrcd {
  ibv_xrcd ibv;  // must be first
  std::shared_ptr<const objects::XrcDomain> domain;
  std::atomic<int> users{0};  // XRC SRQs and target QPs created or opened through it
};

// The ibv_wr_* batch of a QP created with send_ops_flags (qp_ex.cc).
struct WrBatch;
struct RwqIndTable;

// ibv_qp_ex's members after wr_atomic_write, as rdma-core 45 and later
// append them: a program built against newer headers reads them here.
// Debian 12's verbs.h (rdma-core 44) ends ibv_qp_ex before them.
using WrFlushFn = void (*)(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len,
                           uint8_t type, uint8_t level);
inline constexpr ibv_wr_opcode kWrFlush = static_cast<ibv_wr_opcode>(14);  // IBV_WR_FLUSH
inline constexpr uint64_t kQpExWithFlush = uint64_t{1} << 11;             // IBV_QP_EX_WITH_FLUSH

struct Qp {
  ibv_qp_ex ibv;  // must be first; starts with ibv_qp
  WrFlushFn wr_flush = nullptr;  // must follow ibv (see WrFlushFn)
  std::shared_ptr<engine::Qp> qp;
  objects::QpType type = objects::QpType::kRc;
  bool sq_sig_all = false;
  // Serialises modify and query, as the kernel's per-QP lock does.
  std::mutex modify_mu;
  objects::QpAttributes attrs;  // guarded by modify_mu
  uint32_t migrations_seen = 0;  // guarded by modify_mu: engine path swaps applied to attrs
  // Set iff created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: the QP then has the
  // ibv_wr_* API and ibv_qp_to_qp_ex returns it.
  std::shared_ptr<WrBatch> wr_batch;
  // Set iff created with an indirection table (a UD QP receiving through
  // the table's WQs); constant after creation.
  RwqIndTable* rss = nullptr;
  // An XRC target (XRC_RECV) has one handle per ibv_create_qp_ex or
  // ibv_open_qp, each destroyed on its own; the QP lives until the last
  // goes. The creating handle owns modify_mu and attrs for all of them.
  Qp* tgt_owner = nullptr;          // the creating handle; null if not a target
  std::atomic<int> tgt_handles{0};  // on the owner: handles not yet destroyed
  bool tgt_last = false;            // this handle's destroy was the last
  Xrcd* xrcd = nullptr;             // the handle it was created or opened through
  // Flow rules steering to this raw packet QP (flow.cc): a QP with rules
  // cannot be destroyed (EBUSY), as the kernel holds it for them.
  std::atomic<int> flows{0};
};

struct Srq {
  ibv_srq ibv;  // must be first
  std::shared_ptr<engine::Srq> srq;
  std::atomic<int> users{0};  // QPs receiving through it
  // In the device's directory (the control plane's name); also its SRQ
  // number (ibv_get_srq_num), which an XRC sender puts in the XRCETH.
  uint32_t number = 0;
  // An XRC SRQ: the XRCD handle it was created through and its CQ.
  Xrcd* xrcd = nullptr;
  ibv_cq* cq = nullptr;
};

struct Wq {
  ibv_wq ibv;  // must be first
  std::shared_ptr<engine::Wq> wq;
  std::atomic<int> users{0};  // indirection-table entries naming it
};

struct RwqIndTable {
  ibv_rwq_ind_table ibv;  // must be first
  std::shared_ptr<const engine::RwqIndTable> table;
  std::vector<Wq*> entries;
  std::atomic<int> users{0};  // QPs steering through it
};

struct Ah {
  ibv_ah ibv;  // must be first
  ibv_ah_attr attr;
  uint32_t dst_ip = 0;  // network order
};

static_assert(offsetof(Qp, wr_flush) == sizeof(ibv_qp_ex),
              "wr_flush must sit where newer headers put ibv_qp_ex::wr_flush");

inline Context* ToContext(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline Pd* ToPd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline Td* ToTd(ibv_td* t) { return reinterpret_cast<Td*>(t); }
inline Mr* ToMr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
inline Mw* ToMw(ibv_mw* m) { return reinterpret_cast<Mw*>(m); }
inline Dm* ToDm(ibv_dm* d) { return reinterpret_cast<Dm*>(d); }
inline Cq* ToCq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Cq* ToCq(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }
inline Qp* ToQp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Ah* ToAh(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }
inline Srq* ToSrq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }
inline Wq* ToWq(ibv_wq* w) { return reinterpret_cast<Wq*>(w); }
inline Xrcd* ToXrcd(ibv_xrcd* x) { return reinterpret_cast<Xrcd*>(x); }
inline RwqIndTable* ToRwqIndTable(ibv_rwq_ind_table* t) { return reinterpret_cast<RwqIndTable*>(t); }

// The device's receive WQE for a receive WR (post_recv and post_srq_recv).
inline engine::RecvWqe ToRecvWqe(const ibv_recv_wr& wr) {
  engine::RecvWqe w;
  w.wr_id = wr.wr_id;
  for (int i = 0; i < wr.num_sge; ++i) {
    w.sges.push_back({wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey});
    w.length += wr.sg_list[i].length;
  }
  return w;
}

// Validates one work request against its QP and builds the device's WQE
// (qp.cc); shared by ibv_post_send and the ibv_wr_* API. `bind_verb`: the
// WR is ibv_bind_mw's own (the only way a type 1 window is bound).
Result<engine::SendWqe> BuildSendWqe(Qp& qp, const ibv_send_wr& wr, bool bind_verb = false);
// Queues built WQEs in order; stops with ENOMEM at the QP's capacity.
// `queued` says how many went in. EINVAL before RTS.
int QueueSends(Qp& qp, std::vector<engine::SendWqe>& wqes, size_t* queued);

// The extended post API (qp_ex.cc). CheckSendOpsFlags refuses, with
// EOPNOTSUPP and a log line naming them, the send_ops_flags a QP of this type
// cannot have; InstallQpEx fills every ibv_qp_ex function pointer.
Status CheckSendOpsFlags(ibv_qp_type type, uint64_t send_ops_flags);
void InstallQpEx(Qp& qp, uint64_t send_ops_flags);

// The hooks SetEventHooks installed.
const EventHooks& Hooks();

}  // namespace rdmaemu::provider
