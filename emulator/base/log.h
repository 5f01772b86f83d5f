// Logging: one spdlog logger for the whole emulator.
//
// RDMAEMU_LOG (off|error|warn|info|debug|trace) sets the level; the default is
// warn, so a program that uses the device correctly prints nothing, and one
// that misuses it gets a line saying what it did wrong.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "emulator/base/status.h"

namespace rdmaemu {

spdlog::logger& Log();

// A second destination for the log while the process runs (`rdmaemu
// trace`): every line at `level` or above also goes to the file `path`
// (appended, created 0600), whatever RDMAEMU_LOG says, while stderr keeps
// printing exactly what RDMAEMU_LOG asks for. One at a time: EBUSY while
// one runs; the file's errno if it cannot be opened. Any thread.
Status StartLogTee(const std::string& path, spdlog::level::level_enum level);
// Ends it and puts the level back; ENOENT if none runs.
Status StopLogTee();
// The file of the running tee, empty if none.
std::string LogTeePath();

// Lets at most `per_second` lines through each second; counts the rest so the
// next line that passes can say how many were suppressed. Anything a remote
// peer can trigger logs through one of these, so a bad peer cannot flood us.
class RateLimit {
 public:
  explicit RateLimit(uint32_t per_second) : per_second_(per_second) {}
  // Returns true if a line may be logged now; `suppressed` gets the number of
  // lines dropped since the last one that passed.
  bool Allow(uint64_t* suppressed);

 private:
  const uint32_t per_second_;
  std::atomic<int64_t> window_start_ms_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace rdmaemu

// Logs at `level` through a function-local RateLimit (10 lines a second per
// site), for lines a remote peer can cause at any level.
#define RDMAEMU_LOG_LIMITED(level, ...)                                           \
  do {                                                                            \
    if (::rdmaemu::Log().should_log(level)) {                                     \
      static ::rdmaemu::RateLimit rdmaemu_rl_(10);                                \
      uint64_t rdmaemu_suppressed_ = 0;                                           \
      if (rdmaemu_rl_.Allow(&rdmaemu_suppressed_)) {                              \
        if (rdmaemu_suppressed_)                                                  \
          ::rdmaemu::Log().log(level, "({} similar lines suppressed)", rdmaemu_suppressed_); \
        ::rdmaemu::Log().log(level, __VA_ARGS__);                                 \
      }                                                                           \
    }                                                                             \
  } while (0)

// Logs a warning through a function-local RateLimit (10 lines a second per site).
#define RDMAEMU_WARN_LIMITED(...)                                          \
  do {                                                                     \
    static ::rdmaemu::RateLimit rdmaemu_rl_(10);                           \
    uint64_t rdmaemu_suppressed_ = 0;                                      \
    if (rdmaemu_rl_.Allow(&rdmaemu_suppressed_)) {                         \
      if (rdmaemu_suppressed_)                                             \
        ::rdmaemu::Log().warn("({} similar lines suppressed)", rdmaemu_suppressed_); \
      ::rdmaemu::Log().warn(__VA_ARGS__);                                  \
    }                                                                      \
  } while (0)
