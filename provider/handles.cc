// The process's table of live object pointers (handles.h).
#include "provider/handles.h"

#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "emulator/base/log.h"

namespace rdmaemu::provider {
namespace {

struct Entry {
  Kind kind;
  ibv_context* context;
  bool retired = false;  // being destroyed: only acknowledgements may name it
};

std::mutex g_mu;
// Heap-allocated and never freed, so that lookups during exit (a program's
// atexit handler destroying what it holds) find it still there.
auto& g_live = *new std::unordered_map<const void*, Entry>();  // guarded by g_mu
// What programs left on contexts they closed: kept (and reachable, so no
// leak checker reports the program's leftovers as ours), never live again.
auto& g_orphans = *new std::vector<const void*>();  // guarded by g_mu

const char* Describe(Kind kind, const char* what) { return what != nullptr ? what : KindName(kind); }

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kContext: return "context";
    case Kind::kPd: return "PD";
    case Kind::kMr: return "MR";
    case Kind::kCq: return "CQ";
    case Kind::kCompChannel: return "completion channel";
    case Kind::kQp: return "QP";
    case Kind::kSrq: return "SRQ";
    case Kind::kAh: return "AH";
    case Kind::kWq: return "WQ";
    case Kind::kRwqIndTable: return "indirection table";
  }
  return "object";
}

void AddHandle(const void* object, Kind kind, ibv_context* context) {
  std::lock_guard lock(g_mu);
  g_live[object] = Entry{kind, context};
}

void RemoveHandle(const void* object) {
  std::lock_guard lock(g_mu);
  g_live.erase(object);
}

void RetireHandle(const void* object) {
  std::lock_guard lock(g_mu);
  if (auto it = g_live.find(object); it != g_live.end()) it->second.retired = true;
}

void CloseHandles(ibv_context* context) {
  std::lock_guard lock(g_mu);
  for (auto it = g_live.begin(); it != g_live.end();) {
    if (it->second.context == context && it->first != context) {
      g_orphans.push_back(it->first);
      it = g_live.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

// The entry of `object` if it is a `kind` (retired ones only if `retired_ok`),
// else nullopt with the line that says why.
std::optional<Entry> Find(const void* object, Kind kind, bool retired_ok, const char* verb,
                          const char* what) {
  if (object == nullptr) {
    Log().warn("{}: {} is NULL", verb, Describe(kind, what));
    return std::nullopt;
  }
  Entry entry;
  {
    std::lock_guard lock(g_mu);
    auto it = g_live.find(object);
    if (it == g_live.end()) {
      Log().warn("{}: {} {} is not a live {} of this process: destroyed already, its context "
                 "closed, a copy of one, or never made by the library",
                 verb, Describe(kind, what), object, KindName(kind));
      return std::nullopt;
    }
    entry = it->second;
  }
  if (entry.kind != kind) {
    Log().warn("{}: {} {} is a {}, not a {}", verb, Describe(kind, what), object,
               KindName(entry.kind), KindName(kind));
    return std::nullopt;
  }
  if (entry.retired && !retired_ok) {
    Log().warn("{}: {} {} is being destroyed", verb, Describe(kind, what), object);
    return std::nullopt;
  }
  return entry;
}

}  // namespace

ibv_context* LiveHandle(const void* object, Kind kind, const char* verb, const char* what) {
  auto entry = Find(object, kind, false, verb, what);
  return entry ? entry->context : nullptr;
}

bool AckableHandle(const void* object, Kind kind, const char* verb) {
  return Find(object, kind, true, verb, nullptr).has_value();
}

bool HandleOf(const void* object, Kind kind, ibv_context* context, const char* verb,
              const char* what) {
  ibv_context* owner = LiveHandle(object, kind, verb, what);
  if (owner == nullptr) return false;
  if (owner != context) {
    Log().warn("{}: {} {} belongs to another context (each ibv_open_device is its own context, "
               "whose objects do not mix with another's)",
               verb, Describe(kind, what), object);
    return false;
  }
  return true;
}

}  // namespace rdmaemu::provider
