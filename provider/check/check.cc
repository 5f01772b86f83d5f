// The checker's mode, its reports (stderr through a spdlog logger of their
// own, JSON lines to RDMAEMU_CHECK_REPORT) and what it does at exit.
#include "provider/check/check.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "emulator/base/log.h"

namespace rdmaemu::check {
namespace internal {
bool g_on = false;
}  // namespace internal

namespace {

Mode g_mode = Mode::kOff;
int g_report_fd = -1;
std::array<std::atomic<int>, kKinds> g_counts{};
std::mutex g_mu;  // one report at a time, whole
thread_local bool t_in_report = false;
// Heap-allocated and never freed: reports and exit scans run during exit.
auto& g_scans = *new std::vector<void (*)()>();  // guarded by g_mu

// The reports' own logger: the bare text, whatever RDMAEMU_LOG's level or
// format, so that the first line is exactly "rdmaemu-check: KIND: WHAT".
spdlog::logger& Out() {
  static auto* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* l = new spdlog::logger("rdmaemu-check", sink);
    l->set_pattern("%v");
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonFrames(const std::vector<Frame>& frames) {
  std::string out = "[";
  for (size_t i = 0; i < frames.size(); ++i) {
    const Frame& f = frames[i];
    out += fmt::format("{}{{\"function\":{},\"file\":{},\"line\":{},\"module\":{},\"offset\":{}}}",
                       i == 0 ? "" : ",", JsonString(f.function), JsonString(f.file), f.line,
                       JsonString(f.module), f.offset);
  }
  return out + "]";
}

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

int Total() {
  int total = 0;
  for (const auto& c : g_counts) total += c.load();
  return total;
}

void OnExit() {
  std::vector<void (*)()> scans;
  {
    std::lock_guard lock(g_mu);
    scans = g_scans;
  }
  for (auto scan : scans) scan();
  int total = Total();
  if (total == 0) return;  // a correct program prints nothing
  std::string counts;
  for (int k = 0; k < kKinds; ++k) {
    if (int n = g_counts[k].load(); n != 0) {
      counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", n, KindName(static_cast<Kind>(k)));
    }
  }
  Out().info("rdmaemu-check: summary: {} report{} ({})", total, total == 1 ? "" : "s", counts);
  if (g_mode == Mode::kError) {
    Out().info("rdmaemu-check: exiting with status {} (RDMAEMU_CHECK=error)", kErrorExitStatus);
    std::fflush(nullptr);
    ::_exit(kErrorExitStatus);
  }
}

void Start(Mode mode, const char* report_path) {
  g_mode = mode;
  internal::g_on = mode != Mode::kOff;
  if (g_report_fd >= 0) ::close(g_report_fd);
  g_report_fd = -1;
  if (!internal::g_on) return;
  if (report_path != nullptr && *report_path != '\0') {
    g_report_fd = ::open(report_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_report_fd < 0) {
      Log().error("RDMAEMU_CHECK_REPORT={}: cannot open: {}; reports go to stderr only",
                  report_path, std::strerror(errno));
    }
  }
}

// Read once, when the library loads, so that no hook ever reads the
// environment again (and a program's setenv later changes nothing).
__attribute__((constructor)) void LoadFromEnvironment() {
  const char* v = std::getenv("RDMAEMU_CHECK");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "off") == 0) return;
  Mode mode = Mode::kWarn;
  if (std::strcmp(v, "error") == 0) {
    mode = Mode::kError;
  } else if (std::strcmp(v, "warn") != 0) {
    Log().error("RDMAEMU_CHECK={} is not a mode (off, warn, error); checking in warn mode", v);
  }
  Start(mode, std::getenv("RDMAEMU_CHECK_REPORT"));
  std::atexit(OnExit);
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kSendBufferChanged: return "send-buffer-changed";
    case Kind::kFreedRegisteredMemory: return "freed-registered-memory";
    case Kind::kDeregInFlight: return "dereg-in-flight";
    case Kind::kUnarmedWait: return "unarmed-wait";
    case Kind::kAckMismatch: return "ack-mismatch";
    case Kind::kUseAfterDestroy: return "use-after-destroy";
    case Kind::kLeak: return "leak";
    case Kind::kCqTooSmall: return "cq-too-small";
    case Kind::kUnsignaledSqFull: return "unsignaled-sq-full";
  }
  return "unknown";
}

Mode CurrentMode() { return g_mode; }

bool InReport() { return t_in_report; }

void Report(Kind kind, std::string_view what, const Stack& where, const std::vector<Note>& notes) {
  if (!On() || t_in_report) return;
  t_in_report = true;
  std::lock_guard lock(g_mu);
  ++g_counts[static_cast<int>(kind)];
  auto frames = Symbolize(where);
  std::string text = fmt::format("rdmaemu-check: {}: {}\n{}", KindName(kind), what, FormatFrames(frames));
  std::string json = fmt::format("{{\"kind\":{},\"what\":{},\"stack\":{},\"notes\":[",
                                 JsonString(KindName(kind)), JsonString(what), JsonFrames(frames));
  for (size_t i = 0; i < notes.size(); ++i) {
    auto note_frames = Symbolize(notes[i].stack);
    text += fmt::format("  {}:\n{}", notes[i].title, FormatFrames(note_frames));
    json += fmt::format("{}{{\"title\":{},\"stack\":{}}}", i == 0 ? "" : ",",
                        JsonString(notes[i].title), JsonFrames(note_frames));
  }
  json += "]}\n";
  if (!text.empty() && text.back() == '\n') text.pop_back();
  Out().info("{}", text);
  if (g_report_fd >= 0) WriteAll(g_report_fd, json);
  t_in_report = false;
}

int Count(Kind kind) { return g_counts[static_cast<int>(kind)].load(); }

void AtExit(void (*scan)()) {
  std::lock_guard lock(g_mu);
  for (auto s : g_scans) {
    if (s == scan) return;
  }
  g_scans.push_back(scan);
}

void Configure(Mode mode, const char* report_path) { Start(mode, report_path); }

}  // namespace rdmaemu::check
