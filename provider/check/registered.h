// The memory the program has registered, for freed-registered-memory: a
// free, realloc or munmap (seen by the preloaded interposer, interpose/) of
// memory that an MR still covers. A NIC keeps the pages pinned and goes on
// reading and writing them by DMA, whatever the allocator hands them to
// next. On-demand-paging MRs are left out: freeing under them is allowed.
// Called only when check::On(); any thread.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>

namespace rdmaemu::check {

// After ibv_reg_mr* registered `mr` with `access`. The first one attaches
// the interposer, if the process has it.
void MemoryRegistered(const ibv_mr* mr, unsigned access);
// After ibv_rereg_mr succeeded with `flags`: the range (mr->addr, length)
// or the access may have changed.
void MemoryReregistered(const ibv_mr* mr, int flags, unsigned access);
// After ibv_dereg_mr of `mr` succeeded.
void MemoryDeregistered(const ibv_mr* mr);
// Before ibv_close_device: its MRs go with the context.
void ContextMemoryReleased(const ibv_context* context);

// [addr, addr + length) is about to be released by `verb` ("free",
// "realloc", "munmap"): reported if an MR covers any of it, once per MR.
// The interposer's hook; tests call it directly.
void MemoryReleased(const void* addr, size_t length, const char* verb);

}  // namespace rdmaemu::check
