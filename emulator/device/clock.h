// The device's clocks, which completion timestamps are read from.
//
// A NIC stamps a completion with its free-running core clock (ticks of
// hca_core_clock kHz, wrapping at completion_timestamp_mask) and, when it has
// one, with its real-time clock (nanoseconds of wall time). The emulated
// device's core clock is CLOCK_MONOTONIC in nanoseconds: a 1 GHz clock that
// never steps back and, in 64 bits, never wraps; its real-time clock is
// CLOCK_REALTIME. ibv_query_rt_values_ex reads the same core clock, so a
// program may compare a raw clock value with a completion's timestamp.
#pragma once

#include <time.h>

#include <cstdint>

namespace rdmaemu::device {

inline constexpr uint64_t kCoreClockKhz = 1000000;  // hca_core_clock: 1 tick = 1 ns
inline constexpr uint64_t kCompletionTimestampMask = ~uint64_t{0};

inline uint64_t ReadClockNs(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

// Ticks of the core clock now.
inline uint64_t CoreClockNow() { return ReadClockNs(CLOCK_MONOTONIC); }
// Nanoseconds since the epoch now.
inline uint64_t WallclockNowNs() { return ReadClockNs(CLOCK_REALTIME); }

}  // namespace rdmaemu::device
