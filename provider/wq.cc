// Work queues (IBV_WQT_RQ) and receive indirection tables: creation with
// checks, the WQ state machine on modify (checked, then applied), and
// posting receives.
#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
#include "provider/handles.h"
#include "provider/check/quarantine.h"
#include "provider/objects.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

using engine::WqState;

static_assert(static_cast<int>(WqState::kRdy) == IBV_WQS_RDY);
static_assert(static_cast<int>(WqState::kErr) == IBV_WQS_ERR);

const char* ToString(WqState s) {
  switch (s) {
    case WqState::kReset: return "RESET";
    case WqState::kRdy: return "RDY";
    case WqState::kErr: return "ERR";
  }
  return "?";
}

// The WQ transitions the device accepts, [from][to] (RESET, RDY, ERR):
// RESET -> RDY starts receiving; RDY -> RDY changes nothing but is allowed
// (mlx5 modifies flags that way); any state may go back to RESET, which
// discards posted WQEs without completions; RDY -> ERR flushes them with
// WR_FLUSH_ERR; ERR -> ERR is a no-op. RESET -> ERR and ERR -> RDY are
// refused: a WQ leaves ERR only through RESET.
constexpr bool kWqTransitions[3][3] = {
    /* RESET */ {true, true, false},
    /* RDY   */ {true, true, true},
    /* ERR   */ {true, false, true},
};

bool ValidState(int s) { return s >= IBV_WQS_RESET && s <= IBV_WQS_ERR; }

int PostWqRecv(ibv_wq* ibv, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  engine::Wq& wq = *ToWq(ibv)->wq;
  std::vector<objects::Cqe> flushed;
  int rc = 0;
  {
    std::lock_guard lock(wq.mu);
    for (; wr != nullptr; wr = wr->next) {
      if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > wq.max_sge) {
        RDMAEMU_WARN_LIMITED("ibv_post_wq_recv: wq#{} wr_id {}: num_sge {} exceeds the WQ's max_sge {}",
                             wq.wqn, wr->wr_id, wr->num_sge, wq.max_sge);
        rc = EINVAL;
        break;
      }
      if (wq.rq.size() >= wq.max_wr) {
        RDMAEMU_WARN_LIMITED("ibv_post_wq_recv: wq#{} wr_id {}: the WQ already holds max_wr {} receives",
                             wq.wqn, wr->wr_id, wq.max_wr);
        rc = ENOMEM;
        break;
      }
      wq.rq.push_back(ToRecvWqe(*wr));
    }
    // A WQ in ERR accepts work and completes it at once with a flush error,
    // as a QP in ERR does.
    if (wq.state == WqState::kErr) engine::FlushWqLocked(wq, flushed);
  }
  for (const auto& c : flushed) {
    if (!wq.cq->Push(c)) RDMAEMU_WARN_LIMITED("wq#{}: CQ overrun while flushing", wq.wqn);
  }
  if (rc != 0) *bad_wr = wr;
  return rc;
}

}  // namespace

Result<ibv_wq*> CreateWq(ibv_context* context, ibv_wq_init_attr* attr) {
  Context* ctx = ToContext(context);
  auto fail = [](int code, std::string why) -> Status {
    Log().warn("ibv_create_wq: {}", why);
    return Status::Error(code, std::move(why));
  };
  if (attr->wq_type != IBV_WQT_RQ) {
    return fail(EINVAL, fmt::format("wq_type {} is not a WQ type (only IBV_WQT_RQ exists)",
                                    static_cast<int>(attr->wq_type)));
  }
  if (attr->comp_mask & ~uint32_t{IBV_WQ_INIT_ATTR_FLAGS}) {
    return fail(EINVAL, fmt::format("comp_mask {:#x} has unknown bits",
                                    attr->comp_mask & ~uint32_t{IBV_WQ_INIT_ATTR_FLAGS}));
  }
  if ((attr->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && attr->create_flags != 0) {
    return fail(EOPNOTSUPP, fmt::format("create_flags {:#x}: the device supports none of CVLAN "
                                        "stripping, scatter FCS, delay drop and end padding "
                                        "(Ethernet raw-packet features)",
                                        attr->create_flags));
  }
  if (!HandleOf(attr->pd, Kind::kPd, context, "ibv_create_wq", "pd") ||
      !HandleOf(attr->cq, Kind::kCq, context, "ibv_create_wq", "cq")) {
    return InvalidArgument("a WQ needs a PD and a CQ of its context");
  }
  if (attr->max_wr < 1 || attr->max_wr > static_cast<uint32_t>(device::kMaxQpWr) ||
      attr->max_sge > static_cast<uint32_t>(device::kMaxSge)) {
    return fail(EINVAL, fmt::format("max_wr {} / max_sge {} outside the device's 1..{} / 0..{}",
                                    attr->max_wr, attr->max_sge, device::kMaxQpWr, device::kMaxSge));
  }
  auto wqn = ctx->engine->AllocateWqn();
  if (!wqn.ok()) return wqn.status();
  auto* wq = new Wq{};
  ibv_wq& w = wq->ibv;
  wq->wq = std::make_shared<engine::Wq>(*wqn, ToPd(attr->pd)->handle, ToCq(attr->cq)->cq.get(),
                                        attr->max_wr, attr->max_sge, reinterpret_cast<uint64_t>(&w));
  w.context = context;
  w.wq_context = attr->wq_context;
  w.pd = attr->pd;
  w.cq = attr->cq;
  w.wq_num = *wqn;
  w.handle = *wqn;
  w.state = IBV_WQS_RESET;
  w.wq_type = IBV_WQT_RQ;
  w.post_recv = PostWqRecv;
  w.comp_mask = 0;
  ++ToPd(attr->pd)->users;
  ++ToCq(attr->cq)->users;
  ctx->engine->AddWq(wq->wq);
  // `rdmaemu list` shows it by WQN (what the program sees as wq_num) with
  // its state; `rdmaemu event wq_fatal --wq WQN` names it.
  engine::Wq* ewq = wq->wq.get();
  auto listed = ctx->device->directory().Add(
      objects::ObjectKind::kWq, reinterpret_cast<uint64_t>(&w),
      [ewq] {
        std::lock_guard lock(ewq->mu);
        return std::string(ToString(ewq->state));
      },
      *wqn);
  if (!listed.ok()) Log().error("ibv_create_wq wq#{}: {}", *wqn, listed.status().message());
  AddHandle(&w, Kind::kWq, context);
  Log().debug("{} wq#{}: created (max_wr {}, max_sge {})", ctx->device->name(), *wqn, attr->max_wr,
              attr->max_sge);
  return &w;
}

int ModifyWq(ibv_wq* ibv, ibv_wq_attr* attr) {
  constexpr uint32_t kKnown = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS;
  engine::Wq& wq = *ToWq(ibv)->wq;
  const uint32_t mask = attr->attr_mask;
  if (mask & ~kKnown) {
    Log().warn("ibv_modify_wq wq#{}: attr_mask {:#x} has unknown bits", wq.wqn, mask & ~kKnown);
    return EINVAL;
  }
  if ((mask & IBV_WQ_ATTR_FLAGS) && attr->flags_mask != 0) {
    Log().warn("ibv_modify_wq wq#{}: flags_mask {:#x}: the device supports no WQ flags", wq.wqn,
               attr->flags_mask);
    return EOPNOTSUPP;
  }
  if (((mask & IBV_WQ_ATTR_STATE) && !ValidState(attr->wq_state)) ||
      ((mask & IBV_WQ_ATTR_CURR_STATE) && !ValidState(attr->curr_wq_state))) {
    Log().warn("ibv_modify_wq wq#{}: a state must be IBV_WQS_RESET, IBV_WQS_RDY or IBV_WQS_ERR",
               wq.wqn);
    return EINVAL;
  }
  std::vector<objects::Cqe> flushed;
  WqState from, to;
  {
    std::lock_guard lock(wq.mu);
    // Check everything, then apply.
    from = wq.state;
    if ((mask & IBV_WQ_ATTR_CURR_STATE) && static_cast<WqState>(attr->curr_wq_state) != from) {
      Log().warn("ibv_modify_wq wq#{}: curr_wq_state says {} but the WQ is in {}", wq.wqn,
                 ToString(static_cast<WqState>(attr->curr_wq_state)), ToString(from));
      return EINVAL;
    }
    to = (mask & IBV_WQ_ATTR_STATE) ? static_cast<WqState>(attr->wq_state) : from;
    if (!kWqTransitions[static_cast<int>(from)][static_cast<int>(to)]) {
      Log().warn("ibv_modify_wq wq#{}: {} -> {} is not a WQ transition (RESET -> RDY -> ERR, "
                 "and back to RESET from any state)",
                 wq.wqn, ToString(from), ToString(to));
      return EINVAL;
    }
    wq.state = to;
    if (to == WqState::kReset) wq.rq.clear();
    if (to == WqState::kErr) engine::FlushWqLocked(wq, flushed);
  }
  for (const auto& c : flushed) {
    if (!wq.cq->Push(c)) RDMAEMU_WARN_LIMITED("wq#{}: CQ overrun while flushing", wq.wqn);
  }
  ibv->state = static_cast<ibv_wq_state>(to);
  if (from != to) Log().debug("wq#{}: {} -> {}", wq.wqn, ToString(from), ToString(to));
  return 0;
}

int DetachWq(ibv_wq* ibv) {
  Wq* wq = ToWq(ibv);
  if (int users = wq->users.load(); users != 0) {
    Log().warn("ibv_destroy_wq wq#{}: {} indirection-table entr{} still name this WQ; destroy the "
               "table(s) first",
               ibv->wq_num, users, users == 1 ? "y" : "ies");
    return EBUSY;
  }
  // No control-plane event names it after this (see DetachCq).
  ToContext(ibv->context)->device->directory().Remove(objects::ObjectKind::kWq, ibv->wq_num);
  ToContext(ibv->context)->engine->RemoveWq(ibv->wq_num);
  RetireHandle(ibv);
  return 0;
}

void FreeWq(ibv_wq* ibv) {
  RemoveHandle(ibv);
  --ToPd(ibv->pd)->users;
  --ToCq(ibv->cq)->users;
  pthread_mutex_destroy(&ibv->mutex);
  pthread_cond_destroy(&ibv->cond);
  check::Dispose(ToWq(ibv));
}

Result<ibv_rwq_ind_table*> CreateRwqIndTable(ibv_context* context,
                                            ibv_rwq_ind_table_init_attr* attr) {
  Context* ctx = ToContext(context);
  auto fail = [](std::string why) -> Status {
    Log().warn("ibv_create_rwq_ind_table: {}", why);
    return InvalidArgument(std::move(why));
  };
  if (attr->comp_mask != 0) return fail(fmt::format("comp_mask {:#x} must be 0", attr->comp_mask));
  if (attr->log_ind_tbl_size > device::kLogMaxRwqIndTableSize) {
    return fail(fmt::format("log_ind_tbl_size {} exceeds the device's {} ({} entries)",
                            attr->log_ind_tbl_size, device::kLogMaxRwqIndTableSize,
                            1u << device::kLogMaxRwqIndTableSize));
  }
  if (attr->ind_tbl == nullptr) return fail("ind_tbl is NULL");
  const size_t size = size_t{1} << attr->log_ind_tbl_size;
  for (size_t i = 0; i < size; ++i) {
    const std::string what = fmt::format("entry {} of {}", i, size);
    if (!HandleOf(attr->ind_tbl[i], Kind::kWq, context, "ibv_create_rwq_ind_table", what.c_str())) {
      return InvalidArgument("an entry is not a WQ of this context");
    }
  }
  if (ctx->rwq_ind_tables.fetch_add(1) >= device::kMaxRwqIndTables) {
    --ctx->rwq_ind_tables;
    Log().warn("ibv_create_rwq_ind_table: the context already has the device's maximum of {} tables",
               device::kMaxRwqIndTables);
    return NoMemory("too many indirection tables");
  }
  static std::atomic<int> next_number{1};
  auto* t = new RwqIndTable{};
  auto table = std::make_shared<engine::RwqIndTable>();
  for (size_t i = 0; i < size; ++i) {
    Wq* w = ToWq(attr->ind_tbl[i]);
    ++w->users;
    t->entries.push_back(w);
    table->entries.push_back(w->wq);
  }
  t->table = std::move(table);
  t->ibv.context = context;
  t->ibv.ind_tbl_handle = t->ibv.ind_tbl_num = next_number.fetch_add(1);
  t->ibv.comp_mask = 0;
  AddHandle(&t->ibv, Kind::kRwqIndTable, context);
  return &t->ibv;
}

int DestroyRwqIndTable(ibv_rwq_ind_table* ibv) {
  RwqIndTable* t = ToRwqIndTable(ibv);
  if (int users = t->users.load(); users != 0) {
    Log().warn("ibv_destroy_rwq_ind_table: {} QP(s) still steer through this table; destroy them "
               "first",
               users);
    return EBUSY;
  }
  RemoveHandle(ibv);
  for (Wq* w : t->entries) --w->users;
  --ToContext(ibv->context)->rwq_ind_tables;
  check::Dispose(t);
  return 0;
}

}  // namespace rdmaemu::provider
