#include "emulator/fault/shaper.h"

#include <algorithm>

namespace rdmaemu::fault {

uint64_t PortRateBps(uint8_t width, uint8_t speed) {
  uint64_t lanes = 0;
  switch (width) {
    case 1: lanes = 1; break;
    case 16: lanes = 2; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    default: return 0;
  }
  uint64_t lane_mbps = 0;
  switch (speed) {
    case 1: lane_mbps = 2500; break;     // SDR
    case 2: lane_mbps = 5000; break;     // DDR
    case 4: lane_mbps = 10000; break;    // QDR
    case 8: lane_mbps = 10000; break;    // FDR10
    case 16: lane_mbps = 14000; break;   // FDR
    case 32: lane_mbps = 25000; break;   // EDR
    case 64: lane_mbps = 50000; break;   // HDR
    case 128: lane_mbps = 100000; break; // NDR
    default: return 0;
  }
  return lanes * lane_mbps * 1000000;
}

void Shaper::Configure(uint64_t rate_bps, Duration latency) {
  rate_bps_ = rate_bps;
  latency_ = latency;
}

Clock::time_point Shaper::Schedule(Clock::time_point now, size_t udp_bytes) {
  Clock::time_point start = now;
  if (rate_bps_ != 0) {
    // A link idle for a while has no credit beyond the burst.
    start = std::max(now, free_at_);
    const double bits = static_cast<double>(udp_bytes + kLinkOverheadBytes) * 8.0;
    const auto serialise = Duration(static_cast<int64_t>(bits * 1e9 / static_cast<double>(rate_bps_)));
    free_at_ = start + serialise;
  }
  return start + latency_;
}

}  // namespace rdmaemu::fault
