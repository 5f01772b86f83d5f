// Registered memory by address (registered.h).
#include "provider/check/registered.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "provider/check/check.h"
#include "provider/check/interpose/hook.h"
#include "provider/check/stack.h"

namespace rdmaemu::check {
namespace {

struct Region {
  uintptr_t start;
  uintptr_t end;  // one past the last byte
  const ibv_context* context;
  uint32_t lkey;
  unsigned access;
  std::shared_ptr<const Stack> registered;
  bool reported = false;  // one report per MR, however often its pages are freed
};

std::mutex g_mu;
// Heap-allocated and never freed: frees arrive until the very end of exit.
auto& g_regions = *new std::unordered_map<const ibv_mr*, Region>();  // g_mu
auto& g_by_start = *new std::multimap<uintptr_t, const ibv_mr*>();    // g_mu
size_t g_longest = 0;  // no region is longer: bounds the search; g_mu
std::atomic<unsigned> g_live{0};

// Set while this thread works on the tables: the frees its own map updates
// make come back through the interposer and must not take g_mu again.
thread_local bool t_busy = false;

struct Busy {
  Busy() { t_busy = true; }
  ~Busy() { t_busy = false; }
};

const FreeHook g_hook{&g_live, MemoryReleased};
std::atomic<bool> g_attached{false};

// A forked child holds no MR: its copy of the pages is its own to free.
void LockForFork() { g_mu.lock(); }
void UnlockForFork() { g_mu.unlock(); }
void ForgetInChild() {
  Busy busy;  // the maps' frees come back through the interposer
  g_regions.clear();
  g_by_start.clear();
  g_live.store(0, std::memory_order_relaxed);
  g_mu.unlock();
}

void AttachOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(LockForFork, UnlockForFork, ForgetInChild);
    auto attach = reinterpret_cast<AttachFn>(dlsym(RTLD_DEFAULT, kAttachSymbol));
    if (attach == nullptr) {
      Log().info("checker: {} is not preloaded, so free/realloc/munmap of registered memory is "
                 "not checked (rdmaemu run --check preloads it)",
                 kInterposerName);
      return;
    }
    attach(&g_hook);
    g_attached.store(true);
  });
}

// The library is being unloaded (dlclose): the interposer must not call
// into code that is going away.
__attribute__((destructor)) void Detach() {
  if (!g_attached.load()) return;
  if (auto attach = reinterpret_cast<AttachFn>(dlsym(RTLD_DEFAULT, kAttachSymbol))) attach(nullptr);
}

void EraseLocked(const ibv_mr* mr) {
  auto it = g_regions.find(mr);
  if (it == g_regions.end()) return;
  auto [first, last] = g_by_start.equal_range(it->second.start);
  for (auto s = first; s != last; ++s) {
    if (s->second == mr) {
      g_by_start.erase(s);
      break;
    }
  }
  g_regions.erase(it);
  g_live.store(static_cast<unsigned>(g_regions.size()), std::memory_order_relaxed);
}

void InsertLocked(const ibv_mr* mr, Region region) {
  EraseLocked(mr);
  if (region.end <= region.start || (region.access & IBV_ACCESS_ON_DEMAND)) return;
  g_longest = std::max<size_t>(g_longest, region.end - region.start);
  g_by_start.emplace(region.start, mr);
  g_regions.emplace(mr, std::move(region));
  g_live.store(static_cast<unsigned>(g_regions.size()), std::memory_order_relaxed);
}

Region Describe(const ibv_mr* mr, unsigned access, std::shared_ptr<const Stack> stack) {
  auto start = reinterpret_cast<uintptr_t>(mr->addr);
  return Region{start, start + mr->length, mr->context, mr->lkey, access, std::move(stack)};
}

// "free of the heap block at 0x... (4104 bytes)": a heap block is named by
// its pointer and spans what its allocator made of it, a mapping by its range.
std::string What(std::string_view verb, uintptr_t start, size_t length) {
  if (verb == "munmap") return fmt::format("munmap of {} bytes at {:#x}", length, start);
  return fmt::format("{} of the heap block at {:#x} ({} usable bytes)", verb, start, length);
}

}  // namespace

void MemoryRegistered(const ibv_mr* mr, unsigned access) {
  auto stack = std::make_shared<const Stack>(CaptureStack());
  {
    Busy busy;
    std::lock_guard lock(g_mu);
    InsertLocked(mr, Describe(mr, access, std::move(stack)));
  }
  AttachOnce();
}

void MemoryReregistered(const ibv_mr* mr, int flags, unsigned access) {
  auto stack = std::make_shared<const Stack>(CaptureStack());
  Busy busy;
  std::lock_guard lock(g_mu);
  auto it = g_regions.find(mr);
  if (it == g_regions.end() && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) return;  // ODP, and stays so
  if (!(flags & IBV_REREG_MR_CHANGE_ACCESS)) access = it->second.access;
  InsertLocked(mr, Describe(mr, access, std::move(stack)));
}

void MemoryDeregistered(const ibv_mr* mr) {
  Busy busy;
  std::lock_guard lock(g_mu);
  EraseLocked(mr);
}

void ContextMemoryReleased(const ibv_context* context) {
  Busy busy;
  std::lock_guard lock(g_mu);
  for (auto it = g_regions.begin(); it != g_regions.end();) {
    auto next = std::next(it);
    if (it->second.context == context) EraseLocked(it->first);
    it = next;
  }
}

void MemoryReleased(const void* addr, size_t length, const char* verb) {
  if (t_busy || InReport() || length == 0 || g_live.load(std::memory_order_relaxed) == 0) return;
  Busy busy;  // what this function and its report allocate and free
  const auto start = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t end = start + length;
  Region hit{};
  int covering = 0;
  {
    std::lock_guard lock(g_mu);
    // A region overlapping [start, end) starts before end and, being at most
    // g_longest long, no earlier than start - g_longest.
    auto s = g_by_start.lower_bound(start > g_longest ? start - g_longest : 0);
    for (; s != g_by_start.end() && s->first < end; ++s) {
      Region& r = g_regions.at(s->second);
      if (r.end <= start) continue;
      ++covering;
      if (!hit.registered && !r.reported) {
        r.reported = true;
        hit = r;
      }
    }
  }
  if (!hit.registered) return;  // none, or its report was made already
  std::string others =
      covering > 1 ? fmt::format(" (and {} more MR{})", covering - 1, covering == 2 ? "" : "s") : "";
  Report(Kind::kFreedRegisteredMemory,
         fmt::format("{} while mr lkey {:#x} ({} bytes at {:#x}) still registers it{}: a NIC "
                     "goes on reading and writing registered memory by DMA whatever the "
                     "allocator hands it to next, so a later owner of these bytes gets the "
                     "peer's writes and the peer reads theirs; ibv_dereg_mr the MR before "
                     "releasing its memory",
                     What(verb, start, length), hit.lkey, hit.end - hit.start, hit.start, others),
         CaptureStack(), {{fmt::format("mr lkey {:#x} was registered here", hit.lkey), *hit.registered}});
}

}  // namespace rdmaemu::check
