// The process's table of live object pointers (handles.h).
#include "provider/handles.h"

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "emulator/base/log.h"
#include "provider/check/check.h"
#include "provider/objects.h"

namespace rdmaemu::provider {
namespace {

struct Entry {
  Kind kind;
  ibv_context* context;
  bool retired = false;  // being destroyed: only acknowledgements may name it
  std::shared_ptr<const check::Stack> created;  // with the checker on
  bool library = false;  // librdmacm's own, kept for the process's life: no leak
};

// With the checker on: what a destroyed object was, for a verb that names it
// later (a bounded record, as the quarantine holding its memory is).
struct Destroyed {
  Kind kind;
  std::string name;
  std::shared_ptr<const check::Stack> created;
  check::Stack destroyed;
  bool context_closed = false;  // gone with its context, not destroyed itself
};
constexpr size_t kDestroyedRecords = 4096;

std::mutex g_mu;
// Heap-allocated and never freed, so that lookups during exit (a program's
// atexit handler destroying what it holds) find it still there.
auto& g_live = *new std::unordered_map<const void*, Entry>();  // guarded by g_mu
// What programs left on contexts they closed: kept (and reachable, so no
// leak checker reports the program's leftovers as ours), never live again.
auto& g_orphans = *new std::vector<const void*>();  // guarded by g_mu
auto& g_destroyed = *new std::unordered_map<const void*, Destroyed>();  // guarded by g_mu
auto& g_destroyed_order = *new std::deque<const void*>();                 // guarded by g_mu

const char* Describe(Kind kind, const char* what) { return what != nullptr ? what : KindName(kind); }

// The name the device's log lines give the object; the object must be live.
std::string NameOf(const void* object, Kind kind) {
  switch (kind) {
    case Kind::kQp: return fmt::format("qp#{}", static_cast<const ibv_qp*>(object)->qp_num);
    case Kind::kCq:
      return fmt::format("cq#{}", ToCq(static_cast<ibv_cq*>(const_cast<void*>(object)))->number);
    case Kind::kSrq:
      return fmt::format("srq#{}", ToSrq(static_cast<ibv_srq*>(const_cast<void*>(object)))->number);
    case Kind::kMr: return fmt::format("mr lkey {:#x}", static_cast<const ibv_mr*>(object)->lkey);
    case Kind::kMw: return fmt::format("mw rkey {:#x}", static_cast<const ibv_mw*>(object)->rkey);
    case Kind::kDm: return fmt::format("dm#{}", static_cast<const ibv_dm*>(object)->handle);
    case Kind::kWq: return fmt::format("wq#{}", static_cast<const ibv_wq*>(object)->wq_num);
    case Kind::kContext:
      return fmt::format("context of {}",
                         static_cast<const ibv_context*>(object)->device->name);
    default: return fmt::format("{} {}", KindName(kind), object);
  }
}

// Remembers `object` as destroyed now; g_mu held.
void RecordDestroyed(const void* object, const Entry& entry, bool context_closed) {
  if (g_destroyed.size() >= kDestroyedRecords && !g_destroyed_order.empty()) {
    g_destroyed.erase(g_destroyed_order.front());
    g_destroyed_order.pop_front();
  }
  g_destroyed[object] = Destroyed{entry.kind, NameOf(object, entry.kind), entry.created,
                                  check::CaptureStack(), context_closed};
  g_destroyed_order.push_back(object);
}

void LeakScan();

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
    case Kind::kMw: return "MW";
    case Kind::kDm: return "DM";
    case Kind::kTd: return "thread domain";
    case Kind::kXrcd: return "XRCD";
    case Kind::kFlow: return "flow";
  }
  return "object";
}

void AddHandle(const void* object, Kind kind, ibv_context* context) {
  if (check::On()) {
    check::AtExit(LeakScan);
    auto created = std::make_shared<const check::Stack>(check::CaptureStack());
    std::lock_guard lock(g_mu);
    g_destroyed.erase(object);  // its memory left the quarantine and was reused
    g_live[object] = Entry{kind, context, false, std::move(created)};
    return;
  }
  std::lock_guard lock(g_mu);
  g_live[object] = Entry{kind, context};
}

void RemoveHandle(const void* object) {
  std::lock_guard lock(g_mu);
  auto it = g_live.find(object);
  if (it == g_live.end()) return;
  if (check::On()) RecordDestroyed(object, it->second, false);
  g_live.erase(it);
}

void RetireHandle(const void* object) {
  std::lock_guard lock(g_mu);
  if (auto it = g_live.find(object); it != g_live.end()) it->second.retired = true;
}

void CloseHandles(ibv_context* context) {
  std::lock_guard lock(g_mu);
  for (auto it = g_live.begin(); it != g_live.end();) {
    if (it->second.context == context && it->first != context) {
      if (check::On()) RecordDestroyed(it->first, it->second, true);
      g_orphans.push_back(it->first);
      it = g_live.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

// The use-after-destroy report for a verb naming `object`, not live; g_mu
// held (the report takes its own lock, never this one).
void ReportUnknown(const void* object, Kind kind, const char* verb, const char* what) {
  auto it = g_destroyed.find(object);
  if (it == g_destroyed.end()) {
    check::Report(check::Kind::kUseAfterDestroy,
                  fmt::format("{} was given {} {}, which the library never created (a copy of an "
                              "object, a made-up pointer, or one destroyed long ago); the call "
                              "fails with an errno",
                              verb, Describe(kind, what), object),
                  check::CaptureStack());
    return;
  }
  const Destroyed& d = it->second;
  std::vector<check::Note> notes;
  notes.push_back({fmt::format("{} was {} here", d.name,
                               d.context_closed ? "destroyed with its context" : "destroyed"),
                   d.destroyed});
  if (d.created) notes.push_back({fmt::format("{} was created here", d.name), *d.created});
  check::Report(check::Kind::kUseAfterDestroy,
                fmt::format("{} was given {} {}, which was {}; the call fails with an errno "
                            "instead of following it",
                            verb, d.name, object,
                            d.context_closed ? "destroyed when its context was closed"
                                             : "destroyed already"),
                check::CaptureStack(), notes);
}

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
      if (check::On()) ReportUnknown(object, kind, verb, what);
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

std::string HandleName(const void* object, Kind kind) { return NameOf(object, kind); }

bool Retired(const void* object) {
  std::lock_guard lock(g_mu);
  auto it = g_live.find(object);
  return it != g_live.end() && it->second.retired;
}

std::vector<const void*> LiveHandles(Kind kind) {
  std::vector<const void*> out;
  std::lock_guard lock(g_mu);
  for (const auto& [object, entry] : g_live) {
    if (entry.kind == kind && !entry.retired) out.push_back(object);
  }
  return out;
}

namespace {

// At exit: one leak report per kind, naming the objects and showing where
// the first few were created.
void LeakScan() {
  constexpr size_t kShown = 3;
  std::map<int, std::vector<std::pair<const void*, Entry>>> by_kind;
  {
    std::lock_guard lock(g_mu);
    for (const auto& [object, entry] : g_live) {
      if (!entry.retired && !entry.library) {
        by_kind[static_cast<int>(entry.kind)].emplace_back(object, entry);
      }
    }
  }
  for (auto& [k, objects] : by_kind) {
    Kind kind = static_cast<Kind>(k);
    std::string names;
    std::vector<check::Note> notes;
    for (size_t i = 0; i < objects.size(); ++i) {
      std::string name = NameOf(objects[i].first, kind);
      if (i < 8) names += fmt::format("{}{}", i == 0 ? "" : ", ", name);
      if (i < kShown && objects[i].second.created) {
        notes.push_back({fmt::format("{} was created here", name), *objects[i].second.created});
      }
    }
    if (objects.size() > 8) names += ", ...";
    check::Stack first = notes.empty() ? check::Stack{} : notes.front().stack;
    if (!notes.empty()) notes.erase(notes.begin());
    check::Report(check::Kind::kLeak,
                  fmt::format("{} {}{} still alive at exit, never destroyed: {} (first created "
                              "here; each ibv_create_*/ibv_alloc_*/ibv_reg_*/ibv_open_device needs "
                              "its destroy)",
                              objects.size(), KindName(kind), objects.size() == 1 ? "" : "s", names),
                  first, notes);
  }
}

}  // namespace

void MarkLibraryObject(const void* object) {
  std::lock_guard lock(g_mu);
  if (auto it = g_live.find(object); it != g_live.end()) it->second.library = true;
}

bool AckableHandle(const void* object, Kind kind, const char* verb) {
  return Find(object, kind, true, verb, nullptr).has_value();
}

bool HandleOf(const void* object, Kind kind, ibv_context* context, const char* verb,
              const char* what) {
  ibv_context* owner = LiveHandle(object, kind, verb, what);
  if (owner == nullptr) return false;
  // Contexts imported from one another share their objects, as the kernel
  // shares the file's handles.
  if (owner != context && ToContext(owner)->file != ToContext(context)->file) {
    Log().warn("{}: {} {} belongs to another context (each ibv_open_device is its own context, "
               "whose objects do not mix with another's)",
               verb, Describe(kind, what), object);
    return false;
  }
  return true;
}

}  // namespace rdmaemu::provider
