// XRC domains: ibv_open_xrcd and ibv_close_xrcd (XRC SRQs are in srq.cc,
// XRC QPs in qp.cc).
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

#include "emulator/base/log.h"
#include "provider/check/quarantine.h"
#include "provider/handles.h"
#include "provider/objects.h"
#include "provider/provider.h"

namespace rdmaemu::provider {

Result<ibv_xrcd*> OpenXrcd(ibv_context* context, const ibv_xrcd_init_attr& attr) {
  if (Status dead = DeadDevice(context, "ibv_open_xrcd"); !dead.ok()) return dead;
  constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  if (attr.comp_mask & ~kKnown) {
    Log().warn("ibv_open_xrcd: comp_mask {:#x} has bits this library does not know",
               attr.comp_mask & ~kKnown);
    return NotSupported("comp_mask");
  }
  if ((attr.comp_mask & kKnown) != kKnown) {
    Log().warn("ibv_open_xrcd: comp_mask must have IBV_XRCD_INIT_ATTR_FD and "
               "IBV_XRCD_INIT_ATTR_OFLAGS (fd -1 for a domain of its own)");
    return InvalidArgument("comp_mask");
  }
  if (attr.oflags & ~(O_CREAT | O_EXCL)) {
    Log().warn("ibv_open_xrcd: oflags {:#x}: only O_CREAT and O_EXCL mean something here",
               attr.oflags);
    return InvalidArgument("oflags");
  }
  std::optional<objects::XrcdTable::FileKey> file;
  if (attr.fd != -1) {
    struct stat st {};
    if (::fstat(attr.fd, &st) != 0) {
      Log().warn("ibv_open_xrcd: fd {} is not an open file descriptor", attr.fd);
      return Status::Error(EBADF, "fd");
    }
    file = objects::XrcdTable::FileKey{st.st_dev, st.st_ino};
  }
  Context* ctx = ToContext(context);
  auto domain = ctx->device->xrcds().Open(file, attr.oflags & O_CREAT, attr.oflags & O_EXCL);
  if (!domain.ok()) {
    Log().warn("ibv_open_xrcd: fd {}: {}", attr.fd, domain.status().message());
    return domain.status();
  }
  auto* x = new Xrcd{};
  x->ibv.context = context;
  x->domain = std::move(domain).value();
  AddHandle(&x->ibv, Kind::kXrcd, context);
  Log().debug("{}: XRC domain {} opened{}", ctx->device->name(), x->domain->number,
              file ? " (shared through its file)" : "");
  return &x->ibv;
}

int CloseXrcd(ibv_xrcd* ibv) {
  Xrcd* x = ToXrcd(ibv);
  if (int users = x->users.load(); users != 0) {
    // As the kernel's uverbs: the objects made through this handle hold it.
    Log().warn("ibv_close_xrcd: {} XRC SRQ(s) or target QP(s) created through this XRCD still "
               "exist; destroy them first",
               users);
    return EBUSY;
  }
  RemoveHandle(ibv);
  check::Dispose(x);
  return 0;
}

}  // namespace rdmaemu::provider
