// One warning per process per call site, for entry points that fail because
// nothing implements them (yet, or ever, like the hardware provider ABI).
#pragma once

#include <atomic>

#include "emulator/base/log.h"

// Logs `fmt` (a spdlog format string, `{}` placeholders) at warn level the
// first time this call site runs; later calls stay quiet.
#define RDMAEMU_WARN_ONCE(...)                                        \
  do {                                                                \
    static std::atomic<bool> rdmaemu_warned_{false};                  \
    if (!rdmaemu_warned_.exchange(true, std::memory_order_relaxed))   \
      ::rdmaemu::Log().warn(__VA_ARGS__);                             \
  } while (0)
