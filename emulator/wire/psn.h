// 24-bit packet sequence number arithmetic (IBA 9.7.1).
//
// PSNs count modulo 2^24. Two PSNs compare by their signed distance, which
// is meaningful while they are less than half the space (2^23) apart: IBA
// keeps the outstanding window far below that.
#pragma once

#include <cstdint>

namespace rdmaemu::wire {

inline constexpr uint32_t kPsnMask = 0x00ffffff;
inline constexpr uint32_t kPsnModulus = 0x01000000;  // 2^24
inline constexpr int32_t kPsnHalf = 0x00800000;      // 2^23

constexpr uint32_t PsnMask(uint32_t psn) { return psn & kPsnMask; }

// psn + n, wrapping at 2^24. A negative n steps backwards.
constexpr uint32_t PsnAdd(uint32_t psn, int64_t n) {
  return static_cast<uint32_t>((static_cast<int64_t>(psn) + n) & kPsnMask);
}

constexpr uint32_t PsnNext(uint32_t psn) { return PsnAdd(psn, 1); }

// Signed distance from b to a, in (-2^23, 2^23]: PsnDiff(b + k, b) == k for
// every k in that range. Exactly 2^23 apart is ambiguous; it counts as "a is
// after b" from both sides.
constexpr int32_t PsnDiff(uint32_t a, uint32_t b) {
  const int32_t d = static_cast<int32_t>((a - b) & kPsnMask);
  return d > kPsnHalf ? d - static_cast<int32_t>(kPsnModulus) : d;
}

// a comes strictly before b.
constexpr bool PsnBefore(uint32_t a, uint32_t b) { return PsnDiff(a, b) < 0; }
// a comes strictly after b.
constexpr bool PsnAfter(uint32_t a, uint32_t b) { return PsnDiff(a, b) > 0; }

static_assert(PsnDiff(0, kPsnMask) == 1);
static_assert(PsnDiff(kPsnMask, 0) == -1);
static_assert(PsnAdd(kPsnMask, 1) == 0);
static_assert(PsnAdd(0, -1) == kPsnMask);

}  // namespace rdmaemu::wire
