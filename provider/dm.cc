// Device memory: ibv_alloc_dm, ibv_free_dm, ibv_memcpy_to_dm,
// ibv_memcpy_from_dm and ibv_reg_dm_mr. All are verbs.h inline functions
// that call the context's op slots (or the DM's own copy functions)
// directly, so each looks up the objects it is given here.
//
// The memory is the device's own (objects/device_memory.h); a region over it
// is zero-based, as the kernel makes every DM region: its addresses, in an
// SGE or as a peer's remote address, are offsets from the registered start,
// and ibv_mr's addr is NULL (rdma-core's ibv_cmd_reg_dm_mr). The checks and
// their errnos are the kernel's (uverbs) and libmlx5's, the one provider
// with device memory.
#include <atomic>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "provider/check/check.h"
#include "provider/check/quarantine.h"
#include "provider/check/sends.h"
#include "provider/cmd_file.h"
#include "provider/handles.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

std::atomic<uint32_t> g_next_dm_handle{1};

// What a region over device memory may allow: libmlx5's (and the
// kernel's) MEMIC regions take these and nothing else; a window cannot be
// bound to one, nor can it be on-demand or huge-page memory.
constexpr unsigned kDmMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                 IBV_ACCESS_ZERO_BASED;

int CopyToDm(ibv_dm* ibv, uint64_t offset, const void* from, size_t length) {
  if (LiveHandle(ibv, Kind::kDm, "ibv_memcpy_to_dm") == nullptr) return EINVAL;
  Status s = ToDm(ibv)->buffer->CopyIn(offset, from, length);
  if (!s.ok()) Log().warn("ibv_memcpy_to_dm(dm#{}): {}", ibv->handle, s.message());
  return s.code();
}

int CopyFromDm(void* to, ibv_dm* ibv, uint64_t offset, size_t length) {
  if (LiveHandle(ibv, Kind::kDm, "ibv_memcpy_from_dm") == nullptr) return EINVAL;
  Status s = ToDm(ibv)->buffer->CopyOut(to, offset, length);
  if (!s.ok()) Log().warn("ibv_memcpy_from_dm(dm#{}): {}", ibv->handle, s.message());
  return s.code();
}

ibv_dm* AllocDm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  if (LiveHandle(context, Kind::kContext, "ibv_alloc_dm") == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (Status dead = DeadDevice(context, "ibv_alloc_dm"); !dead.ok()) {
    errno = dead.code();
    return nullptr;
  }
  if (attr == nullptr) {
    Log().warn("ibv_alloc_dm: attr is NULL");
    errno = EINVAL;
    return nullptr;
  }
  if (attr->comp_mask != 0) {
    Log().warn("ibv_alloc_dm: comp_mask {:#x} has bits no device knows (there are none yet)",
               attr->comp_mask);
    errno = EINVAL;
    return nullptr;
  }
  auto buffer = ToContext(context)->device->dm().Allocate(attr->length, attr->log_align_req);
  if (!buffer.ok()) {
    Log().warn("ibv_alloc_dm(length={}, log_align_req={}): {}", attr->length, attr->log_align_req,
               buffer.status().message());
    errno = buffer.status().code();
    return nullptr;
  }
  auto* dm = new Dm{};
  dm->buffer = std::move(buffer).value();
  dm->ibv.context = context;
  dm->ibv.memcpy_to_dm = CopyToDm;
  dm->ibv.memcpy_from_dm = CopyFromDm;
  dm->ibv.comp_mask = IBV_DM_MASK_HANDLE;
  dm->ibv.handle = g_next_dm_handle.fetch_add(1);
  AddHandle(&dm->ibv, Kind::kDm, context);
  ToContext(context)->file->dms.Add(dm->ibv.handle, dm);
  return &dm->ibv;
}

// The kernel refuses to free a DM that MRs still register (uverbs_free_dm:
// EBUSY while its use count is not 0), and so does this.
int FreeDm(ibv_dm* ibv) {
  if (LiveHandle(ibv, Kind::kDm, "ibv_free_dm") == nullptr) return ENOENT;
  Dm* dm = ToDm(ibv);
  if (int users = dm->users->load(); users != 0) {
    Log().warn("ibv_free_dm(dm#{}): {} memory region(s) still register it; ibv_dereg_mr them first",
               ibv->handle, users);
    return EBUSY;
  }
  // The object goes, through whichever view, as the kernel frees the
  // object behind the handle: its other views are retired (every verb but
  // ibv_unimport_dm refuses them; the memory stays theirs until then).
  for (Dm* view : ToContext(ibv->context)->file->dms.TakeAll(ibv->handle)) {
    if (view != dm) RetireHandle(&view->ibv);
  }
  RemoveHandle(ibv);
  check::Dispose(dm);  // its memory goes back to the device
  return 0;
}

Result<ibv_mr*> RegDmMrChecked(ibv_pd* pd, ibv_dm* ibv_dm, uint64_t offset, size_t length,
                               unsigned access) {
  ibv_context* context = LiveHandle(pd, Kind::kPd, "ibv_reg_dm_mr");
  if (context == nullptr) return InvalidArgument("no such PD");
  if (!HandleOf(ibv_dm, Kind::kDm, context, "ibv_reg_dm_mr", "the DM")) {
    return InvalidArgument("no such DM in the PD's context");
  }
  if (Status dead = DeadDevice(context, "ibv_reg_dm_mr"); !dead.ok()) return dead;
  // The optional-range bits are hints a device may ignore (as in ibv_reg_mr).
  access &= ~unsigned{IBV_ACCESS_OPTIONAL_RANGE};
  if (!(access & IBV_ACCESS_ZERO_BASED)) {
    return InvalidArgument("access lacks IBV_ACCESS_ZERO_BASED: a region over device memory is "
                           "always zero-based (its addresses are offsets into the DM)");
  }
  if (unsigned other = access & ~kDmMrAccess; other != 0) {
    return InvalidArgument(fmt::format("access flags {:#x} cannot apply to device memory (local "
                                       "write, remote write/read/atomic and zero-based can)", other));
  }
  Dm* dm = ToDm(ibv_dm);
  const uint64_t size = dm->buffer->length();
  if (offset > size || length > size - offset) {
    return InvalidArgument(fmt::format("[{}, {}+{}) is outside the {}-byte DM", offset, offset,
                                       length, size));
  }
  auto mr = ToContext(context)->device->mrs().RegisterDeviceMemory(
      ToPd(pd)->handle, dm->buffer->data() + offset, length, access);
  if (!mr.ok()) return mr.status();
  auto* out = new Mr{};
  out->mr = *mr;
  out->dm_users = dm->users;
  ++*dm->users;
  ++ToPd(pd)->users;
  out->ibv.context = context;
  out->ibv.pd = pd;
  out->ibv.addr = nullptr;
  out->ibv.length = length;
  out->ibv.handle = (*mr)->lkey;
  out->ibv.lkey = (*mr)->lkey;
  out->ibv.rkey = (*mr)->rkey;
  AddHandle(&out->ibv, Kind::kMr, context);
  if (check::On()) check::DeviceMemoryKey(out->ibv.lkey, true);
  return &out->ibv;
}

ibv_mr* RegDmMr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned access) {
  auto mr = RegDmMrChecked(pd, dm, offset, length, access);
  if (!mr.ok()) {
    Log().warn("ibv_reg_dm_mr(offset={}, length={}, access={:#x}): {}", offset, length, access,
               mr.status().message());
    errno = mr.status().code();
    return nullptr;
  }
  return *mr;
}

}  // namespace

Result<ibv_dm*> ImportDm(ibv_context* context, uint32_t dm_handle) {
  if (Status dead = DeadDevice(context, "ibv_import_dm"); !dead.ok()) return dead;
  auto* view = new Dm{};
  const bool found = ToContext(context)->file->dms.With(dm_handle, [&](Dm& dm) {
    view->buffer = dm.buffer;
    view->users = dm.users;
  });
  if (!found) {
    Log().warn("ibv_import_dm: the context's file holds no DM with handle {} (never allocated, "
               "freed, or allocated on a context opened separately: only contexts imported from "
               "one another share handles)", dm_handle);
    delete view;
    return NotFound("no such DM handle");
  }
  view->imported = true;
  view->ibv.context = context;
  view->ibv.memcpy_to_dm = CopyToDm;
  view->ibv.memcpy_from_dm = CopyFromDm;
  view->ibv.comp_mask = IBV_DM_MASK_HANDLE;
  view->ibv.handle = dm_handle;
  AddHandle(&view->ibv, Kind::kDm, context);
  ToContext(context)->file->dms.Add(dm_handle, view);
  return &view->ibv;
}

void UnimportDm(ibv_dm* ibv) {
  Dm* dm = ToDm(ibv);
  if (!dm->imported && !Retired(ibv)) {
    Log().warn("ibv_unimport_dm: dm#{} was allocated here, not imported; free it with ibv_free_dm",
               ibv->handle);
    return;
  }
  ToContext(ibv->context)->file->dms.Remove(ibv->handle, dm);
  RemoveHandle(ibv);
  check::Dispose(dm);
}

void InstallDmOps(verbs_context* vctx) {
  vctx->alloc_dm = AllocDm;
  vctx->free_dm = FreeDm;
  vctx->reg_dm_mr = RegDmMr;
}

}  // namespace rdmaemu::provider
