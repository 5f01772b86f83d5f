#include "emulator/base/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>

namespace rdmaemu {
namespace {

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
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* l = new spdlog::logger("rdmaemu", sink);
    l->set_pattern("rdmaemu[%P] %^%l%$: %v");
    l->set_level(LevelFromEnv());
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *logger;
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
