// Thread domains and parent domains (domain.cc): the provider's side of
// ibv_alloc_td(3) and ibv_alloc_parent_domain(3).
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <memory_resource>

#include "provider/objects.h"

namespace rdmaemu::provider {

// alloc_td, dealloc_td and alloc_parent_domain.
void InstallDomainOps(verbs_context* vctx);

// The parent domain of ibv_create_cq_ex's IBV_CQ_INIT_ATTR_MASK_PD: EINVAL,
// logged, unless `pd` is a live parent domain of `context`.
Result<Pd*> CqParentDomain(ibv_context* context, ibv_pd* pd);

// ibv_dealloc_pd of a parent domain: EBUSY while objects use it.
int DeallocParentDomain(Pd& parent_domain);

// Where a buffer of `resource_type` for an object created on
// `parent_domain` comes from: the program's allocator if it gave one
// (falling back to the default where it answers IBV_ALLOCATOR_USE_DEFAULT);
// NULL if it gave none (the default). Allocation failure throws
// std::bad_alloc.
std::unique_ptr<std::pmr::memory_resource> BufferMemory(Pd& parent_domain, uint64_t resource_type);

}  // namespace rdmaemu::provider
