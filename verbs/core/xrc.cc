// XRC: the verbs_context slots verbs.h's inline wrappers call
// (ibv_open_xrcd, ibv_close_xrcd, ibv_create_srq_ex, ibv_get_srq_num,
// ibv_open_qp). Each looks its objects up first, as the kernel does.
#include <cerrno>

#include "provider/provider.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {
namespace {

using provider::Kind;
using provider::LiveHandle;

ibv_xrcd* OpenXrcd(ibv_context* context, ibv_xrcd_init_attr* attr) {
  if (attr == nullptr) return FailWith<ibv_xrcd>(EINVAL);
  auto xrcd = provider::OpenXrcd(context, *attr);
  if (!xrcd.ok()) return FailWith<ibv_xrcd>(xrcd.status().code());
  return *xrcd;
}

int CloseXrcd(ibv_xrcd* xrcd) {
  if (!LiveHandle(xrcd, Kind::kXrcd, "ibv_close_xrcd")) return FailInt(kNoSuchObjectToDestroy);
  if (int rc = provider::CloseXrcd(xrcd); rc != 0) return FailInt(rc);
  return 0;
}

ibv_srq* CreateSrqEx(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  auto srq = provider::CreateSrqEx(context, attr);
  if (!srq.ok()) return FailWith<ibv_srq>(srq.status().code());
  return *srq;
}

int GetSrqNum(ibv_srq* srq, uint32_t* srq_num) {
  if (!LiveHandle(srq, Kind::kSrq, "ibv_get_srq_num")) return FailInt(kNoSuchObject);
  return provider::GetSrqNum(srq, srq_num);
}

ibv_qp* OpenQp(ibv_context* context, ibv_qp_open_attr* attr) {
  if (attr == nullptr) return FailWith<ibv_qp>(EINVAL);
  auto qp = provider::OpenQp(context, *attr);
  if (!qp.ok()) return FailWith<ibv_qp>(qp.status().code());
  return *qp;
}

}  // namespace

void InstallXrcSlots(verbs_context* vctx) {
  vctx->open_xrcd = OpenXrcd;
  vctx->close_xrcd = CloseXrcd;
  vctx->create_srq_ex = CreateSrqEx;
  vctx->get_srq_num = GetSrqNum;
  vctx->open_qp = OpenQp;
}

}  // namespace rdmaemu::verbs
