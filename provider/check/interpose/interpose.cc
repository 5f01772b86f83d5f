// librdmaemu_interpose.so: free, realloc and munmap for a program run under
// `rdmaemu run --check`, which preloads it. Each asks the checker in
// libibverbs.so.1 (hook.h) whether the memory going back is still inside a
// registered MR, then does what the next definition (libc's, or a preloaded
// allocator's) does. It links nothing but libc and libdl: it is loaded into
// every process the program starts, most of which never touch verbs.
#include <dlfcn.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

#include "provider/check/interpose/hook.h"

namespace {

using rdmaemu::check::FreeHook;

using FreeFn = void (*)(void*);
using ReallocFn = void* (*)(void*, size_t);
using MunmapFn = int (*)(void*, size_t);
using UsableSizeFn = size_t (*)(void*);

struct Next {
  FreeFn free;
  ReallocFn realloc;
  MunmapFn munmap;
  UsableSizeFn usable_size;
};

Next g_next;
enum State { kUnresolved, kResolving, kResolved };
std::atomic<int> g_state{kUnresolved};
std::atomic<const FreeHook*> g_hook{nullptr};

// Set while this thread resolves the next definitions or runs the hook: the
// frees those make themselves (dlsym's, the checker's lookups and reports)
// go straight through. Initial-exec: a preloaded library's TLS is static, and
// reaching it must not allocate.
__attribute__((tls_model("initial-exec"))) thread_local bool t_inside = false;

// The next definitions, or NULL while this very thread is looking them up
// (dlsym may free what it allocated): the caller then does without.
const Next* NextFunctions() {
  if (g_state.load(std::memory_order_acquire) == kResolved) return &g_next;
  int expected = kUnresolved;
  if (!g_state.compare_exchange_strong(expected, kResolving, std::memory_order_acq_rel)) {
    if (t_inside) return nullptr;
    while (g_state.load(std::memory_order_acquire) != kResolved) sched_yield();
    return &g_next;
  }
  t_inside = true;
  g_next.free = reinterpret_cast<FreeFn>(dlsym(RTLD_NEXT, "free"));
  g_next.realloc = reinterpret_cast<ReallocFn>(dlsym(RTLD_NEXT, "realloc"));
  g_next.munmap = reinterpret_cast<MunmapFn>(dlsym(RTLD_NEXT, "munmap"));
  g_next.usable_size = reinterpret_cast<UsableSizeFn>(dlsym(RTLD_NEXT, "malloc_usable_size"));
  t_inside = false;
  g_state.store(kResolved, std::memory_order_release);
  return &g_next;
}

// Resolved before main, while the process has one thread.
__attribute__((constructor)) void ResolveEarly() { NextFunctions(); }

// The hook, if the checker is attached and any MR is registered; else NULL,
// after one load each (the cost every free pays).
const FreeHook* Watching() {
  if (t_inside) return nullptr;
  const FreeHook* hook = g_hook.load(std::memory_order_acquire);
  if (hook == nullptr || hook->live->load(std::memory_order_relaxed) == 0) return nullptr;
  return hook;
}

void Ask(const FreeHook* hook, const void* addr, size_t length, const char* verb) {
  t_inside = true;
  hook->released(addr, length, verb);
  t_inside = false;
}

// The bytes a heap block really spans, as its allocator sees it.
size_t BlockSize(const Next* next, void* p) {
  return next != nullptr && next->usable_size != nullptr ? next->usable_size(p) : 1;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void rdmaemu_interpose_attach(const FreeHook* hook) {
  g_hook.store(hook, std::memory_order_release);
}

__attribute__((visibility("default"))) void free(void* p) {
  const Next* next = NextFunctions();
  if (p == nullptr) return;
  if (const FreeHook* hook = Watching()) Ask(hook, p, BlockSize(next, p), "free");
  // Without the next free (only while dlsym runs for it) the block is
  // leaked: handing it to any other allocator could corrupt it.
  if (next != nullptr && next->free != nullptr) next->free(p);
}

__attribute__((visibility("default"))) void* realloc(void* p, size_t size) {
  const Next* next = NextFunctions();
  if (next == nullptr || next->realloc == nullptr) {
    errno = ENOMEM;  // realloc's own failure: the block stays as it was
    return nullptr;
  }
  // Even a realloc that may stay in place says the program lets the block
  // move: an MR over it would then cover whatever malloc puts there.
  if (p != nullptr) {
    if (const FreeHook* hook = Watching()) Ask(hook, p, BlockSize(next, p), "realloc");
  }
  return next->realloc(p, size);
}

__attribute__((visibility("default"))) int munmap(void* addr, size_t length) {
  const Next* next = NextFunctions();
  if (const FreeHook* hook = Watching()) {
    // The kernel unmaps whole pages: an MR in the last one's tail goes too.
    const size_t page = static_cast<size_t>(getpagesize());
    Ask(hook, addr, (length + page - 1) / page * page, "munmap");
  }
  if (next == nullptr || next->munmap == nullptr) {
    return static_cast<int>(syscall(SYS_munmap, addr, length));
  }
  return next->munmap(addr, length);
}

}  // extern "C"
