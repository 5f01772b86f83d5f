// Protection domains and memory regions.
#include <cerrno>
#include <cstdint>

#include "provider/provider.h"
#include "verbs/core/library.h"

using namespace rdmaemu;
using namespace rdmaemu::verbs;

extern "C" {

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  auto pd = provider::AllocPd(context);
  if (!pd.ok()) return FailWith<ibv_pd>(pd.status().code());
  return *pd;
}

int ibv_dealloc_pd(ibv_pd* pd) { return provider::DeallocPd(pd); }

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                         unsigned int access) {
  auto mr = provider::RegMr(pd, addr, length, iova, access);
  if (!mr.ok()) return FailWith<ibv_mr>(mr.status().code());
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
  int rc = provider::ReregMr(mr, flags, pd, addr, length, access);
  if (rc == 0) return 0;
  errno = rc;
  return IBV_REREG_MR_ERR_INPUT;
}

int ibv_dereg_mr(ibv_mr* mr) { return provider::DeregMr(mr); }

}  // extern "C"
