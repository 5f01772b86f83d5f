// Protection domains and memory regions.
#include <cerrno>
#include <cstdint>

#include "provider/check/check.h"
#include "provider/check/registered.h"
#include "provider/check/sends.h"
#include "provider/provider.h"
#include "verbs/core/library.h"

using namespace rdmaemu;
using namespace rdmaemu::verbs;
using rdmaemu::provider::Kind;
using rdmaemu::provider::LiveHandle;

namespace {

// The kernel takes the MR for writing (ENOENT when it has no such handle)
// and reads the new PD's handle (EINVAL), from the MR's own context.
int CheckRereg(ibv_mr* mr, int flags, ibv_pd* pd) {
  ibv_context* context = LiveHandle(mr, Kind::kMr, "ibv_rereg_mr");
  if (context == nullptr) return ENOENT;
  if ((flags & IBV_REREG_MR_CHANGE_PD) &&
      !provider::HandleOf(pd, Kind::kPd, context, "ibv_rereg_mr", "the new PD")) {
    return EINVAL;
  }
  return 0;
}

}  // namespace

extern "C" {

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (!LiveHandle(context, Kind::kContext, "ibv_alloc_pd")) return FailWith<ibv_pd>(kNoSuchObject);
  auto pd = provider::AllocPd(context);
  if (!pd.ok()) return FailWith<ibv_pd>(pd.status().code());
  return *pd;
}

// EBUSY, in errno too, while MRs, QPs, SRQs, WQs or AHs use the PD.
int ibv_dealloc_pd(ibv_pd* pd) {
  if (!LiveHandle(pd, Kind::kPd, "ibv_dealloc_pd")) return FailInt(kNoSuchObjectToDestroy);
  int rc = provider::DeallocPd(pd);
  return rc == 0 ? 0 : FailInt(rc);
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                         unsigned int access) {
  if (!LiveHandle(pd, Kind::kPd, "ibv_reg_mr")) return FailWith<ibv_mr>(kNoSuchObject);
  auto mr = provider::RegMr(pd, addr, length, iova, access);
  if (!mr.ok()) return FailWith<ibv_mr>(mr.status().code());
  if (check::On()) check::MemoryRegistered(*mr, access);
  return *mr;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  // The man page: 0 on success, or an ibv_rereg_mr_err_code.
  int rc = CheckRereg(mr, flags, pd);
  if (rc == 0) rc = provider::ReregMr(mr, flags, pd, addr, length, access);
  if (rc == 0) {
    if (check::On()) check::MemoryReregistered(mr, flags, static_cast<unsigned>(access));
    return 0;
  }
  errno = rc;
  return IBV_REREG_MR_ERR_INPUT;
}

int ibv_dereg_mr(ibv_mr* mr) {
  if (!LiveHandle(mr, Kind::kMr, "ibv_dereg_mr")) return FailInt(kNoSuchObjectToDestroy);
  if (check::On()) check::Deregistering(mr);
  int rc = provider::DeregMr(mr);
  if (rc != 0) return FailInt(rc);
  if (check::On()) check::MemoryDeregistered(mr);  // only the pointer: the MR is gone
  return 0;
}

}  // extern "C"
