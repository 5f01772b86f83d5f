// ibv_import_pd / ibv_import_mr and their unimports: new views of a PD or
// MR that a context's file already holds (cmd_file.h). A view is only the
// program's struct: importing creates no object and unimporting destroys
// none, as in rdma-core's providers, where both are userspace-only.
#include "emulator/base/log.h"
#include "provider/check/quarantine.h"
#include "provider/cmd_file.h"
#include "provider/handles.h"
#include "provider/objects.h"
#include "provider/provider.h"

namespace rdmaemu::provider {

Result<ibv_pd*> ImportPd(ibv_context* context, uint32_t pd_handle) {
  if (Status dead = DeadDevice(context, "ibv_import_pd"); !dead.ok()) return dead;
  auto* view = new Pd{};
  const bool found = ToContext(context)->file->pds.With(pd_handle, [&](Pd& pd) {
    view->handle = pd.handle;
    view->users.ShareWith(pd.users);
  });
  if (!found) {
    Log().warn("ibv_import_pd: the context's file holds no PD with handle {} (never allocated, "
               "deallocated, or allocated on a context opened separately: only contexts imported "
               "from one another share handles)", pd_handle);
    delete view;
    return NotFound("no such PD handle");
  }
  view->imported = true;
  view->ibv.context = context;
  view->ibv.handle = view->handle;
  AddHandle(&view->ibv, Kind::kPd, context);
  ToContext(context)->file->pds.Add(view->handle, view);
  return &view->ibv;
}

Result<ibv_mr*> ImportMr(ibv_pd* pd, uint32_t mr_handle) {
  if (Status dead = DeadDevice(pd->context, "ibv_import_mr"); !dead.ok()) return dead;
  auto* view = new Mr{};
  bool same_pd = true;
  const bool found = ToContext(pd->context)->file->mrs.With(mr_handle, [&](Mr& mr) {
    // A region registered on a parent domain belongs to the domain's PD.
    Pd* owner = *mr.counted_pd;
    if (owner->protection != nullptr && owner != ToPd(pd)) owner = owner->protection;
    same_pd = owner->users.Shares(ToPd(pd)->users);
    view->mr = mr.mr;
    view->counted_pd = mr.counted_pd;
    view->ibv.length = mr.ibv.length;
    view->ibv.lkey = mr.ibv.lkey;
    view->ibv.rkey = mr.ibv.rkey;
  });
  if (!found || !same_pd) {
    if (!found) {
      Log().warn("ibv_import_mr: the context's file holds no MR with handle {:#x} (never "
                 "registered, deregistered, or registered on a context opened separately)",
                 mr_handle);
    } else {
      Log().warn("ibv_import_mr: MR {:#x} was registered on another PD than the one given (pass "
                 "its PD, or that PD imported with ibv_import_pd)", mr_handle);
    }
    delete view;
    return found ? InvalidArgument("MR of another PD") : NotFound("no such MR handle");
  }
  // The address is the registering process's, which an importer may not
  // share: rdma-core reports it as NULL.
  view->imported = true;
  view->ibv.context = pd->context;
  view->ibv.pd = pd;
  view->ibv.addr = nullptr;
  view->ibv.handle = mr_handle;
  AddHandle(&view->ibv, Kind::kMr, pd->context);
  ToContext(pd->context)->file->mrs.Add(mr_handle, view);
  return &view->ibv;
}

void UnimportPd(ibv_pd* ibv) {
  Pd* pd = ToPd(ibv);
  if (pd->protection != nullptr) {
    Log().warn("ibv_unimport_pd: {} is a parent domain, which is never imported; deallocate it "
               "with ibv_dealloc_pd", static_cast<void*>(ibv));
    return;
  }
  if (int users = pd->users.local(); users != 0) {
    Log().warn("ibv_unimport_pd: {} object(s) created through this ibv_pd still point at it; "
               "destroy or unimport them first (the PD is kept)", users);
    return;
  }
  ToContext(ibv->context)->file->pds.Remove(pd->handle, pd);
  RemoveHandle(ibv);
  check::Dispose(pd);
}

void UnimportMr(ibv_mr* ibv) {
  ToContext(ibv->context)->file->mrs.Remove(ibv->handle, ToMr(ibv));
  RemoveHandle(ibv);
  check::Dispose(ToMr(ibv));
}

}  // namespace rdmaemu::provider
