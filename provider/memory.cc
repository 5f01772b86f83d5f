// Protection domains and memory regions.
#include <atomic>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
#include "provider/cmd_file.h"
#include "provider/domain.h"
#include "provider/handles.h"
#include "provider/check/check.h"
#include "provider/check/quarantine.h"
#include "provider/check/sends.h"
#include "provider/object_slot.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

std::atomic<uint32_t> g_next_pd_handle{1};

constexpr unsigned kIbvKnownAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
    IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING |
    objects::kFlushGlobal | objects::kFlushPersistent;

// libibverbs' access bits are the IBTA ones, and so the device's.
static_assert(uint32_t{IBV_ACCESS_LOCAL_WRITE} == objects::kLocalWrite);
static_assert(uint32_t{IBV_ACCESS_REMOTE_WRITE} == objects::kRemoteWrite);
static_assert(uint32_t{IBV_ACCESS_REMOTE_READ} == objects::kRemoteRead);
static_assert(uint32_t{IBV_ACCESS_REMOTE_ATOMIC} == objects::kRemoteAtomic);
static_assert(uint32_t{IBV_ACCESS_MW_BIND} == objects::kMwBind);
static_assert(uint32_t{IBV_ACCESS_ZERO_BASED} == objects::kZeroBased);
static_assert(uint32_t{IBV_ACCESS_ON_DEMAND} == objects::kOnDemand);
static_assert(uint32_t{IBV_ACCESS_HUGETLB} == objects::kHugetlb);
static_assert(uint32_t{IBV_ACCESS_RELAXED_ORDERING} == objects::kRelaxedOrdering);

// The optional-range bits (IBV_ACCESS_OPTIONAL_RANGE) are hints a device may
// ignore; relaxed ordering is one of them and means nothing here.
unsigned StripOptional(unsigned access) { return access & ~IBV_ACCESS_OPTIONAL_RANGE; }

Context* ContextOf(ibv_pd* pd) { return ToContext(pd->context); }

// The PD view whose count `mr` holds (objects.h).
Pd* CountedPd(const Mr& mr) { return mr.counted_pd ? *mr.counted_pd : ToPd(mr.ibv.pd); }

}  // namespace

Result<ibv_pd*> AllocPd(ibv_context* context) {
  if (Status dead = DeadDevice(context, "ibv_alloc_pd"); !dead.ok()) return dead;
  ObjectSlot slot(*ToContext(context)->device, ObjectSlot::Limited::kPd, "ibv_alloc_pd");
  if (!slot.ok()) return NoMemory("max_pd");
  slot.Keep();
  auto* pd = new Pd{};
  pd->ibv.context = context;
  pd->handle = g_next_pd_handle.fetch_add(1);
  pd->ibv.handle = pd->handle;
  AddHandle(&pd->ibv, Kind::kPd, context);
  ToContext(context)->file->pds.Add(pd->handle, pd);
  return &pd->ibv;
}

int DeallocPd(ibv_pd* ibv) {
  if (ToPd(ibv)->protection != nullptr) return DeallocParentDomain(*ToPd(ibv));
  if (int users = ToPd(ibv)->users.load(); users != 0) {
    Log().warn("ibv_dealloc_pd: {} memory region(s) or window(s), QP(s), SRQ(s), WQ(s), address "
               "handle(s) or parent domain(s) still use the PD; destroy them first", users);
    return EBUSY;
  }
  // Its other views (ibv_import_pd) name a destroyed PD: only their
  // unimport accepts them from now on (ibv_import_pd(3)).
  RemoveHandle(ibv);
  for (Pd* view : ToContext(ibv->context)->file->pds.TakeAll(ToPd(ibv)->handle)) {
    if (view != ToPd(ibv)) RetireHandle(&view->ibv);
  }
  ToContext(ibv->context)->device->ReturnObject(device::Device::Limited::kPd);
  check::Dispose(ToPd(ibv));
  return 0;
}

Result<ibv_mr*> RegMr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  if (Status dead = DeadDevice(pd->context, "ibv_reg_mr"); !dead.ok()) return dead;
  unsigned unknown = StripOptional(access) & ~kIbvKnownAccess;
  if (unknown) {
    Log().warn("ibv_reg_mr: unknown access flags {:#x}", unknown);
    return InvalidArgument("unknown access flags");
  }
  auto& table = ContextOf(pd)->device->mrs();
  auto mr = table.Register(ToPd(pd)->handle, addr, length, iova,
                           access & kIbvKnownAccess & ~IBV_ACCESS_RELAXED_ORDERING);
  if (!mr.ok()) {
    Log().warn("ibv_reg_mr(addr={}, length={}, access={:#x}): {}", addr, length, access,
               mr.status().message());
    return mr.status();
  }
  auto* out = new Mr{};
  ++ToPd(pd)->users;
  out->counted_pd = std::make_shared<Pd*>(ToPd(pd));
  out->mr = *mr;
  out->ibv.context = pd->context;
  out->ibv.pd = pd;
  out->ibv.addr = addr;
  out->ibv.length = length;
  out->ibv.handle = (*mr)->lkey;
  out->ibv.lkey = (*mr)->lkey;
  out->ibv.rkey = (*mr)->rkey;
  AddHandle(&out->ibv, Kind::kMr, pd->context);
  ContextOf(pd)->file->mrs.Add(out->ibv.handle, out);
  return &out->ibv;
}

int ReregMr(ibv_mr* ibv, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  if (Status dead = DeadDevice(ibv->context, "ibv_rereg_mr"); !dead.ok()) return dead.code();
  Mr* mr = ToMr(ibv);
  if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
                IBV_REREG_MR_CHANGE_ACCESS)) {
    Log().warn("ibv_rereg_mr: unknown flags {:#x}", flags);
    return EINVAL;
  }
  if (flags == 0) return EINVAL;
  if (mr->dm_users != nullptr) {
    // As the kernel (ib_uverbs_rereg_mr): a region over device memory has
    // no translation to change.
    Log().warn("ibv_rereg_mr(mr lkey {:#x}): the region is over device memory (ibv_reg_dm_mr) and "
               "cannot be reregistered; deregister it and register again", mr->mr->lkey);
    return EINVAL;
  }
  ibv_pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd : ibv->pd;
  if (new_pd == nullptr) return EINVAL;
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : ibv->addr;
  size_t new_len = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : ibv->length;
  unsigned new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS)
                            ? static_cast<unsigned>(access)
                            : mr->mr->access;
  unsigned unknown = StripOptional(new_access) & ~kIbvKnownAccess;
  if (unknown) return EINVAL;
  uint64_t iova = (flags & IBV_REREG_MR_CHANGE_TRANSLATION)
                      ? reinterpret_cast<uintptr_t>(addr)
                      : mr->mr->iova;
  // The windows bound to the region would keep its old translation: a
  // region with bound windows stays as it is.
  auto& windows = ContextOf(ibv->pd)->device->mws();
  if (Status busy = windows.BeginDeregister(mr->mr->lkey); !busy.ok()) {
    Log().warn("ibv_rereg_mr(mr lkey {:#x}): {}", mr->mr->lkey, busy.message());
    return busy.code();
  }
  auto& table = ContextOf(ibv->pd)->device->mrs();
  auto fresh = table.Reregister(mr->mr->lkey, ToPd(new_pd)->handle, new_addr, new_len, iova,
                                new_access & kIbvKnownAccess & ~IBV_ACCESS_RELAXED_ORDERING);
  windows.EndDeregister(mr->mr->lkey);
  if (!fresh.ok()) {
    Log().warn("ibv_rereg_mr: {}", fresh.status().message());
    return fresh.status().code();
  }
  mr->mr = *fresh;
  if (ToPd(new_pd) != CountedPd(*mr)) {
    ++ToPd(new_pd)->users;
    --CountedPd(*mr)->users;
    if (mr->counted_pd) *mr->counted_pd = ToPd(new_pd);
  }
  ibv->pd = new_pd;
  ibv->addr = new_addr;
  ibv->length = new_len;
  ibv->handle = ibv->lkey = (*fresh)->lkey;
  ibv->rkey = (*fresh)->rkey;
  return 0;
}

int DeregMr(ibv_mr* ibv) {
  Mr* mr = ToMr(ibv);
  // Windows bound to the region would outlive it: the deregistration fails
  // while any is bound, as the IBA spec has it (rxe refuses it too).
  auto& windows = ContextOf(ibv->pd)->device->mws();
  const uint32_t lkey = mr->mr->lkey;
  if (Status busy = windows.BeginDeregister(lkey); !busy.ok()) {
    Log().warn("ibv_dereg_mr(mr lkey {:#x}): {}", lkey, busy.message());
    return busy.code();
  }
  Status s = ContextOf(ibv->pd)->device->mrs().Deregister(lkey);
  windows.EndDeregister(lkey);
  if (!s.ok()) {
    Log().warn("ibv_dereg_mr: {}", s.message());
    return s.code();
  }
  --CountedPd(*mr)->users;
  if (mr->dm_users != nullptr) {
    --*mr->dm_users;
    if (check::On()) check::DeviceMemoryKey(lkey, false);
  }
  // Its other views (ibv_import_mr): as for a PD's.
  RemoveHandle(ibv);
  for (Mr* view : ToContext(ibv->context)->file->mrs.TakeAll(ibv->handle)) {
    if (view != mr) RetireHandle(&view->ibv);
  }
  check::Dispose(mr);
  return 0;
}

namespace {

// ibv_advise_mr(3): prefetching pages of on-demand regions. Without
// IBV_ADVISE_MR_FLAG_FLUSH the advice is a hint (a NIC acts on it in the
// background and reports nothing); with it the pages are faulted in before
// the call returns, and one that cannot be is reported (EFAULT). The
// arguments are checked either way, as the kernel checks them.
int AdviseMr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) {
    Log().warn("ibv_advise_mr: advice {} is not PREFETCH, PREFETCH_WRITE or PREFETCH_NO_FAULT",
               static_cast<int>(advice));
    return EOPNOTSUPP;
  }
  if (flags & ~uint32_t{IBV_ADVISE_MR_FLAG_FLUSH}) {
    Log().warn("ibv_advise_mr: unknown flags {:#x} (IBV_ADVISE_MR_FLAG_FLUSH is the only one)", flags);
    return EOPNOTSUPP;
  }
  if (sg_list == nullptr || num_sge == 0) {
    Log().warn("ibv_advise_mr: no SGEs to prefetch (num_sge {})", num_sge);
    return EINVAL;
  }
  const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
  auto& mrs = ToContext(pd->context)->device->mrs();
  for (uint32_t i = 0; i < num_sge; ++i) {
    const ibv_sge& sge = sg_list[i];
    auto mr = mrs.FindByLkey(sge.lkey);
    const char* refused = mr == nullptr                      ? "names no memory region"
                          : mr->pd != ToPd(pd)->handle       ? "names a region of another PD"
                          : !mr->on_demand()                 ? "names a region that is not on demand "
                                                               "(IBV_ACCESS_ON_DEMAND): its pages are "
                                                               "pinned already"
                          : !mr->Contains(sge.addr, sge.length) ? "is outside its region"
                          : write && !(mr->access & objects::kLocalWrite)
                              ? "asks to prefetch for writing a region without IBV_ACCESS_LOCAL_WRITE"
                              : nullptr;
    if (refused != nullptr) {
      Log().warn("ibv_advise_mr: SGE {} [{:#x}, +{}) lkey {:#x} {}", i, sge.addr, sge.length, sge.lkey,
                 refused);
      return EINVAL;
    }
    // NO_FAULT maps only pages already present: nothing to do here, where
    // a present page is as good as mapped into the device.
    if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) continue;
    Status s = mr->FaultIn(sge.addr, sge.length, write);
    if (!s.ok() && (flags & IBV_ADVISE_MR_FLAG_FLUSH)) {
      Log().warn("ibv_advise_mr: SGE {} [{:#x}, +{}) lkey {:#x}: {}", i, sge.addr, sge.length, sge.lkey,
                 s.message());
      return EFAULT;
    }
  }
  return 0;
}

}  // namespace

void InstallMemoryOps(verbs_context* vctx) { vctx->advise_mr = AdviseMr; }

}  // namespace rdmaemu::provider
