// Link shaping of one port: a rate (pacing, as a token bucket with a small
// burst) and a latency. Pure logic over a clock the caller passes in.
#pragma once

#include <chrono>
#include <cstdint>

#include "emulator/fault/rule.h"

namespace rdmaemu::fault {

using Clock = std::chrono::steady_clock;

// The data rate of a port, in bits per second, from the IBTA width and speed
// codes (as in PortConfig): lanes x the per-lane rate (4x EDR = 100 Gb/s).
// 0 for codes it does not know.
uint64_t PortRateBps(uint8_t width, uint8_t speed);

// Bytes a packet occupies on an Ethernet link besides its UDP payload:
// Ethernet header and FCS, IPv4 and UDP headers.
inline constexpr uint32_t kLinkOverheadBytes = 14 + 4 + 20 + 8;

// How far ahead of its departure time a packet may go out: the bucket's
// depth. Waking the loop for every few microseconds of pacing would cost
// more than it shapes.
inline constexpr Duration kShaperBurst = std::chrono::microseconds(50);

class Shaper {
 public:
  // rate_bps 0: no rate limit. latency: added to every packet.
  void Configure(uint64_t rate_bps, Duration latency);
  bool enabled() const { return rate_bps_ != 0 || latency_.count() != 0; }

  // Schedules a packet of `udp_bytes` offered at `now`: returns when it
  // leaves (reaches the peer's socket): after the packets before it have
  // been serialised at the rate, plus the latency.
  Clock::time_point Schedule(Clock::time_point now, size_t udp_bytes);

 private:
  uint64_t rate_bps_ = 0;
  Duration latency_{0};
  Clock::time_point free_at_{};  // when the link has serialised everything scheduled
};

}  // namespace rdmaemu::fault
