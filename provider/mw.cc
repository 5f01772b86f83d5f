// Memory windows: ibv_alloc_mw, ibv_dealloc_mw and ibv_bind_mw. These are
// verbs.h inline functions that call the context's op slots directly, so
// each looks up the objects it is given here, as the library does for the
// exported verbs.
//
// ibv_bind_mw binds a type 1 window by posting a bind WR on the QP, as
// rdma-core's mlx5 and rxe providers do: the bind is executed by the device
// in order with the QP's other work and completes with IBV_WC_BIND_MW (or
// IBV_WC_MW_BIND_ERR); the window's rkey is bumped (ibv_inc_rkey) once the
// WR is posted, as those providers do.
#include "emulator/base/log.h"
#include "provider/check/check.h"
#include "provider/check/quarantine.h"
#include "provider/check/sends.h"
#include "provider/handles.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type) {
  ibv_context* context = LiveHandle(pd, Kind::kPd, "ibv_alloc_mw");
  if (context == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (Status dead = DeadDevice(context, "ibv_alloc_mw"); !dead.ok()) {
    errno = dead.code();
    return nullptr;
  }
  auto rkey = ToContext(context)->device->mws().Allocate(ToPd(pd)->handle, static_cast<int>(type));
  if (!rkey.ok()) {
    Log().warn("ibv_alloc_mw: {}", rkey.status().message());
    errno = rkey.status().code();
    return nullptr;
  }
  auto* mw = new Mw{};
  mw->key = *rkey;
  mw->ibv.context = context;
  mw->ibv.pd = pd;
  mw->ibv.rkey = *rkey;
  mw->ibv.handle = *rkey;
  mw->ibv.type = type;
  ++ToPd(pd)->users;
  AddHandle(&mw->ibv, Kind::kMw, context);
  return &mw->ibv;
}

// A bound window may be deallocated (it stops answering at once); only a
// region with bound windows refuses to go.
int DeallocMw(ibv_mw* ibv) {
  if (LiveHandle(ibv, Kind::kMw, "ibv_dealloc_mw") == nullptr) return ENOENT;
  if (check::On()) check::DeallocatingMw(ibv);
  Mw* mw = ToMw(ibv);
  Status s = ToContext(ibv->context)->device->mws().Deallocate(mw->key);
  if (!s.ok()) {
    Log().warn("ibv_dealloc_mw: {}", s.message());
    return s.code();
  }
  --ToPd(ibv->pd)->users;
  RemoveHandle(ibv);
  check::Dispose(mw);
  return 0;
}

int BindMw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  ibv_context* context = LiveHandle(qp, Kind::kQp, "ibv_bind_mw");
  if (context == nullptr || !HandleOf(mw, Kind::kMw, context, "ibv_bind_mw", "the window")) {
    return EINVAL;
  }
  const ibv_mw_bind_info& info = bind->bind_info;
  // What mlx5's and rxe's ibv_bind_mw refuse before posting anything.
  if (info.mw_access_flags & IBV_ACCESS_ZERO_BASED) {
    Log().warn("ibv_bind_mw: a type 1 window cannot be zero-based (IBV_ACCESS_ZERO_BASED); "
               "zero-based windows are type 2, bound with IBV_WR_BIND_MW");
    return EINVAL;
  }
  ibv_send_wr wr{};
  wr.wr_id = bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = info;
  Qp& q = *ToQp(qp);
  auto built = BuildSendWqe(q, wr, /*bind_verb=*/true);
  if (!built.ok()) return built.status().code();
  std::vector<engine::SendWqe> wqes;
  wqes.push_back(std::move(built).value());
  size_t queued = 0;
  if (int rc = QueueSends(q, wqes, &queued); rc != 0) return rc;
  // The program sees the new key at once, as on mlx5 and rxe; if the bind
  // fails (its completion says so) the device's window keeps its old key
  // and undoing the program's copy is the program's business.
  mw->rkey = wr.bind_mw.rkey;
  return 0;
}

}  // namespace

void InstallMwOps(verbs_context* vctx) {
  vctx->context.ops.alloc_mw = AllocMw;
  vctx->context.ops.dealloc_mw = DeallocMw;
  vctx->context.ops.bind_mw = BindMw;
}

}  // namespace rdmaemu::provider
