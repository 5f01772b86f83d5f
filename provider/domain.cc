// Thread domains and parent domains.
//
// A thread domain is the program's promise that one thread at a time uses
// what is created on it; a NIC's driver spends it on a doorbell of the
// domain's own. The emulated device keeps its locks whatever the promise
// (they cost nothing uncontended), so a TD changes no behaviour here; it is
// checked and counted like any object.
//
// A parent domain stands in for its PD everywhere a PD is accepted (it
// protects with the PD's handle) and adds the program's allocators: the
// buffers the provider makes for objects created on it come from them.
#include "provider/domain.h"

#include <cerrno>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "emulator/base/log.h"
#include "provider/check/quarantine.h"
#include "provider/handles.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

constexpr uint32_t kParentDomainCompMask =
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;

ibv_td* AllocTd(ibv_context* context, ibv_td_init_attr* attr) {
  if (LiveHandle(context, Kind::kContext, "ibv_alloc_td") == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (Status dead = DeadDevice(context, "ibv_alloc_td"); !dead.ok()) {
    errno = dead.code();
    return nullptr;
  }
  if (attr == nullptr || attr->comp_mask != 0) {
    Log().warn("ibv_alloc_td: {}", attr == nullptr ? "init_attr is NULL"
                                                   : fmt::format("comp_mask {:#x}: ibv_td_init_attr "
                                                                 "has no optional fields",
                                                                 attr->comp_mask));
    errno = EINVAL;
    return nullptr;
  }
  auto* td = new Td{};
  td->ibv.context = context;
  AddHandle(&td->ibv, Kind::kTd, context);
  return &td->ibv;
}

int DeallocTd(ibv_td* ibv) {
  if (LiveHandle(ibv, Kind::kTd, "ibv_dealloc_td") == nullptr) return ENOENT;
  if (int users = ToTd(ibv)->users.load(); users != 0) {
    Log().warn("ibv_dealloc_td: {} parent domain(s) still use the thread domain; deallocate them "
               "first", users);
    return EBUSY;
  }
  RemoveHandle(ibv);
  check::Dispose(ToTd(ibv));
  return 0;
}

// Why `attr` cannot make a parent domain on `context`, or "" if it can.
std::string Refusal(ibv_context* context, const ibv_parent_domain_init_attr& attr) {
  if (attr.comp_mask & ~kParentDomainCompMask) {
    return fmt::format("comp_mask {:#x} has bits this device does not know (it knows ALLOCATORS "
                       "and PD_CONTEXT)", attr.comp_mask & ~kParentDomainCompMask);
  }
  if (attr.pd == nullptr) return "attr.pd is NULL: a parent domain needs the PD it protects with";
  if (!HandleOf(attr.pd, Kind::kPd, context, "ibv_alloc_parent_domain", "attr.pd")) {
    return "attr.pd is not a live PD of this context";
  }
  if (ToPd(attr.pd)->protection != nullptr) {
    return "attr.pd is itself a parent domain; give the PD it was made on";
  }
  if (attr.td != nullptr &&
      !HandleOf(attr.td, Kind::kTd, context, "ibv_alloc_parent_domain", "attr.td")) {
    return "attr.td is not a live thread domain of this context";
  }
  if ((attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) &&
      (attr.alloc == nullptr || attr.free == nullptr)) {
    return "IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS with a NULL alloc or free";
  }
  return "";
}

ibv_pd* AllocParentDomain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  if (LiveHandle(context, Kind::kContext, "ibv_alloc_parent_domain") == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (Status dead = DeadDevice(context, "ibv_alloc_parent_domain"); !dead.ok()) {
    errno = dead.code();
    return nullptr;
  }
  const std::string refusal =
      attr == nullptr ? std::string("attr is NULL") : Refusal(context, *attr);
  if (!refusal.empty()) {
    Log().warn("ibv_alloc_parent_domain: {}", refusal);
    errno = EINVAL;
    return nullptr;
  }
  auto* pd = new Pd{};
  pd->protection = ToPd(attr->pd);
  pd->handle = pd->protection->handle;
  pd->ibv.context = context;
  pd->ibv.handle = attr->pd->handle;
  if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
    pd->alloc = attr->alloc;
    pd->free = attr->free;
  }
  if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) pd->pd_context = attr->pd_context;
  if (attr->td != nullptr) {
    pd->td = ToTd(attr->td);
    ++pd->td->users;
  }
  ++pd->protection->users;
  AddHandle(&pd->ibv, Kind::kPd, context);
  return &pd->ibv;
}

// The program's allocator, with the default where it has none or asks for it.
class ParentDomainMemory : public std::pmr::memory_resource {
 public:
  ParentDomainMemory(Pd& pd, uint64_t type) : pd_(pd), type_(type) {}

 private:
  std::pmr::memory_resource& Default() const { return *std::pmr::new_delete_resource(); }

  void* do_allocate(size_t bytes, size_t alignment) override {
    void* p = pd_.alloc(&pd_.ibv, pd_.pd_context, bytes, alignment, type_);
    if (p == IBV_ALLOCATOR_USE_DEFAULT) {
      p = Default().allocate(bytes, alignment);
      std::lock_guard lock(mu_);
      defaults_.insert(p);
      return p;
    }
    if (p == nullptr) {
      Log().warn("the parent domain's alloc callback returned NULL for {} bytes (resource type "
                 "{:#x}): the create fails with ENOMEM", bytes, type_);
      throw std::bad_alloc();
    }
    if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
      Log().warn("the parent domain's alloc callback returned {} for {} bytes aligned to {}: it "
                 "is not aligned; the buffer is given back to its free callback and the create "
                 "fails with ENOMEM", p, bytes, alignment);
      pd_.free(&pd_.ibv, pd_.pd_context, p, type_);
      throw std::bad_alloc();
    }
    return p;
  }

  void do_deallocate(void* p, size_t bytes, size_t alignment) override {
    {
      std::lock_guard lock(mu_);
      if (defaults_.erase(p) != 0) {
        Default().deallocate(p, bytes, alignment);
        return;
      }
    }
    pd_.free(&pd_.ibv, pd_.pd_context, p, type_);
  }

  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  Pd& pd_;
  const uint64_t type_;
  std::mutex mu_;
  std::unordered_set<void*> defaults_;  // guarded by mu_: what the default allocated
};

}  // namespace

void InstallDomainOps(verbs_context* vctx) {
  vctx->alloc_td = AllocTd;
  vctx->dealloc_td = DeallocTd;
  vctx->alloc_parent_domain = AllocParentDomain;
}

Result<Pd*> CqParentDomain(ibv_context* context, ibv_pd* pd) {
  if (pd == nullptr) {
    Log().warn("ibv_create_cq_ex: IBV_CQ_INIT_ATTR_MASK_PD with parent_domain NULL");
    return InvalidArgument("no parent domain");
  }
  if (!HandleOf(pd, Kind::kPd, context, "ibv_create_cq_ex", "parent_domain")) {
    return InvalidArgument("not a PD of this context");
  }
  if (ToPd(pd)->protection == nullptr) {
    Log().warn("ibv_create_cq_ex: parent_domain {} is a plain PD; a CQ takes a parent domain "
               "(ibv_alloc_parent_domain) or none", static_cast<void*>(pd));
    return InvalidArgument("not a parent domain");
  }
  return ToPd(pd);
}

int DeallocParentDomain(Pd& pd) {
  if (int users = pd.users.load(); users != 0) {
    Log().warn("ibv_dealloc_pd: {} object(s) created on the parent domain (MRs, QPs, CQs, SRQs, "
               "AHs, ...) still use it; destroy them first", users);
    return EBUSY;
  }
  --pd.protection->users;
  if (pd.td != nullptr) --pd.td->users;
  RemoveHandle(&pd.ibv);
  check::Dispose(&pd);
  return 0;
}

std::unique_ptr<std::pmr::memory_resource> BufferMemory(Pd& parent_domain, uint64_t resource_type) {
  if (parent_domain.alloc == nullptr) return nullptr;
  return std::make_unique<ParentDomainMemory>(parent_domain, resource_type);
}

}  // namespace rdmaemu::provider
