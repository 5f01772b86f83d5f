// The RC requester's congestion window: how many request PSNs may be in
// flight beyond the newest acknowledged one.
//
// Why: the engine is a process on a shared CPU, and its peer's engine can
// fall far behind (a loaded machine, a sanitizer's tenfold slowdown). Go-back-
// N without a window resent the whole window of every QP at each transport
// timeout, adding to the load that caused it, until both sides ran out of
// retries: congestion collapse (ibv_srq_pingpong's 16 QPs at 64 KiB under
// TSan). A timeout now shrinks the window to one packet and acknowledged PSNs
// open it again, as TCP's slow start and congestion avoidance do (RFC 5681
// 3.1). Random loss that a NAK repairs does not shrink it: only a timeout
// says the peer is not keeping up. A requester that never times out keeps
// the full window, so an unloaded link runs exactly as without one.
#pragma once

#include <algorithm>
#include <cstdint>

namespace rdmaemu::engine {

class CongestionWindow {
 public:
  // The most PSNs ever in flight: also the limit for a QP without timeouts.
  static constexpr uint32_t kMax = 512;

  uint32_t size() const { return size_; }
  uint32_t threshold() const { return threshold_; }

  // `acked` PSNs were newly acknowledged: below the threshold each opens the
  // window by one (doubling it per round trip), above it a whole window's
  // worth opens it by one.
  void OnAck(uint32_t acked) {
    while (acked > 0 && size_ < kMax) {
      --acked;
      if (size_ < threshold_) {
        ++size_;
      } else if (++credit_ >= size_) {
        credit_ = 0;
        ++size_;
      }
    }
  }

  // The transport timer expired with `in_flight` PSNs unacknowledged.
  void OnTimeout(uint32_t in_flight) {
    threshold_ = std::max<uint32_t>(2, std::min(in_flight, size_) / 2);
    size_ = 1;
    credit_ = 0;
  }

  // Back to a new QP's window (RESET).
  void Reset() { *this = CongestionWindow(); }

 private:
  uint32_t size_ = kMax;
  uint32_t threshold_ = kMax;
  uint32_t credit_ = 0;  // PSNs acknowledged toward the next +1 above the threshold
};

}  // namespace rdmaemu::engine
