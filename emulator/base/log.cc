#include "emulator/base/log.h"

#include <fcntl.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>

namespace rdmaemu {
namespace {

constexpr const char* kPattern = "rdmaemu[%P] %^%l%$: %v";

// The logger writes to one dist_sink, whose sinks can be added and removed
// while other threads log (the logger's own sink list cannot): stderr, at
// RDMAEMU_LOG's level, and a tee file while one runs.
struct Sinks {
  std::shared_ptr<spdlog::sinks::dist_sink_mt> dist;
  std::shared_ptr<spdlog::sinks::sink> stderr_sink;
  spdlog::level::level_enum env_level = spdlog::level::warn;
  std::mutex tee_mu;
  std::shared_ptr<spdlog::sinks::sink> tee;  // guarded by tee_mu
  std::string tee_path;                      // guarded by tee_mu
};

Sinks& TheSinks() {
  static Sinks* const sinks = new Sinks;  // never destroyed, as the logger
  return *sinks;
}

spdlog::level::level_enum LevelFromEnv() {
  const char* v = std::getenv("RDMAEMU_LOG");
  if (v == nullptr || *v == '\0') return spdlog::level::warn;
  auto level = spdlog::level::from_str(v);
  // from_str answers "off" for names it does not know; say so once.
  if (level == spdlog::level::off && std::string_view(v) != "off") {
    std::fprintf(stderr, "rdmaemu: RDMAEMU_LOG=%s is not a level (off|error|warn|info|debug|trace); using warn\n", v);
    return spdlog::level::warn;
  }
  return level;
}

}  // namespace

spdlog::logger& Log() {
  // Never registered globally: the application may use spdlog itself.
  // Never destroyed: a program may exit with QPs still working, and the
  // engine thread then logs (a retry running out, say) while exit() runs
  // the static destructors; a destroyed logger was a use-after-free there
  // (ThreadSanitizer caught it under Debian's ibv_srq_pingpong).
  static spdlog::logger* const logger = [] {
    Sinks& s = TheSinks();
    s.env_level = LevelFromEnv();
    s.stderr_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    s.stderr_sink->set_level(s.env_level);
    s.dist = std::make_shared<spdlog::sinks::dist_sink_mt>();
    s.dist->add_sink(s.stderr_sink);
    auto* l = new spdlog::logger("rdmaemu", s.dist);
    l->set_pattern(kPattern);
    l->set_level(s.env_level);
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

Status StartLogTee(const std::string& path, spdlog::level::level_enum level) {
  spdlog::logger& log = Log();
  Sinks& s = TheSinks();
  std::lock_guard lock(s.tee_mu);
  if (s.tee) return Status::Error(EBUSY, "the log already goes to '" + s.tee_path + "' too");
  // Created 0600 before spdlog opens it: the log may name addresses and keys.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return Status::Error(err, "cannot open '" + path + "': " + std::strerror(err));
  }
  ::close(fd);
  std::shared_ptr<spdlog::sinks::sink> tee;
  try {
    tee = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
  } catch (const spdlog::spdlog_ex& e) {
    return Status::Error(EIO, e.what());
  }
  tee->set_pattern(kPattern);
  tee->set_level(level);
  s.dist->add_sink(tee);
  s.tee = std::move(tee);
  s.tee_path = path;
  // The logger passes the more verbose of the two; each sink keeps its own.
  log.set_level(std::min(s.env_level, level));
  log.info("the log goes to '{}' too, from level {}", path, spdlog::level::to_string_view(level));
  return Status::Ok();
}

Status StopLogTee() {
  spdlog::logger& log = Log();
  Sinks& s = TheSinks();
  std::lock_guard lock(s.tee_mu);
  if (!s.tee) return Status::Error(ENOENT, "the log goes nowhere but stderr");
  log.set_level(s.env_level);
  s.dist->remove_sink(s.tee);
  s.tee->flush();
  s.tee.reset();
  s.tee_path.clear();
  return Status::Ok();
}

std::string LogTeePath() {
  Sinks& s = TheSinks();
  std::lock_guard lock(s.tee_mu);
  return s.tee_path;
}

bool RateLimit::Allow(uint64_t* suppressed) {
  using namespace std::chrono;
  const int64_t now = duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
  int64_t start = window_start_ms_.load(std::memory_order_relaxed);
  if (now - start >= 1000 &&
      window_start_ms_.compare_exchange_strong(start, now, std::memory_order_relaxed)) {
    in_window_.store(0, std::memory_order_relaxed);
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) < per_second_) {
    *suppressed = dropped_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  dropped_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace rdmaemu
