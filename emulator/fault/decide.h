// The decision logic: does an effect fire on this packet?
//
// Determinism is the point. Two runs of the same program with the same seed
// must see the same faults even though their threads interleave differently,
// so no decision draws from a random sequence consumed in arrival order.
// Each is a pure function of (seed, rule, effect, direction, the packet's
// identity: destination QPN, PSN, opcode, and how many times this same
// packet has been seen before). A retransmitted packet is a new occurrence
// and gets a fresh, equally reproducible, decision.
//
// Count triggers (#3) are the exception by nature: they count the packets a
// rule has matched, in the order the device handles them.
#pragma once

#include <array>
#include <cstdint>

#include "emulator/fault/rule.h"

namespace rdmaemu::fault {

// What identifies a packet for the decisions.
struct PacketId {
  Direction dir = kTx;
  uint32_t dst_qpn = 0;
  uint32_t psn = 0;
  uint8_t opcode = 0;
  uint32_t occurrence = 0;  // 0 the first time this packet is seen, 1 the next, ...
};

// 64 well-mixed bits for effect `effect` of rule `rule` on packet `id`.
uint64_t DecisionHash(uint64_t seed, uint32_t rule, uint32_t effect, const PacketId& id);

// A uniform double in [0, 1) from a hash.
inline double Uniform(uint64_t hash) { return static_cast<double>(hash >> 11) * 0x1.0p-53; }

// Whether a trigger fires, given the decision hash and the 1-based number of
// the packet among those its rule matched.
bool Fires(const Trigger& trigger, uint64_t hash, uint64_t match_number);

// The delay for a kDelay effect: delay +- jitter, uniform, from the hash.
Duration DelayOf(const Effect& effect, uint64_t hash);

// Counts how often each packet identity has been seen, so retransmissions
// and duplicates are told apart. A direct-mapped table: a slot remembers one
// packet; another packet that lands on the same slot evicts it (and the
// evicted one starts counting from 0 again). Consecutive PSNs of one QP land
// on different slots, so collisions need thousands of packets in flight.
class OccurrenceTable {
 public:
  // Returns how many times this packet was seen before, and counts this time.
  uint32_t Next(Direction dir, uint32_t dst_qpn, uint32_t psn, uint8_t opcode);
  void Clear();

 private:
  static constexpr size_t kSlots = 1 << 16;
  struct Slot {
    uint64_t key = 0;  // 0 = empty
    uint32_t seen = 0;
  };
  std::array<Slot, kSlots> slots_{};
};

}  // namespace rdmaemu::fault
