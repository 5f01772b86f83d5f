#include "emulator/fault/decide.h"

#include <algorithm>

namespace rdmaemu::fault {
namespace {

// SplitMix64's finaliser: every input bit affects every output bit.
constexpr uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t DecisionHash(uint64_t seed, uint32_t rule, uint32_t effect, const PacketId& id) {
  uint64_t h = Mix(seed + 0x9e3779b97f4a7c15ull);
  h = Mix(h ^ ((uint64_t{rule} << 32) | effect));
  h = Mix(h ^ ((uint64_t{id.dir} << 56) | (uint64_t{id.opcode} << 48) | id.dst_qpn));
  h = Mix(h ^ ((uint64_t{id.psn} << 32) | id.occurrence));
  return h;
}

bool Fires(const Trigger& trigger, uint64_t hash, uint64_t match_number) {
  switch (trigger.kind) {
    case Trigger::Kind::kAlways: return true;
    case Trigger::Kind::kProbability: return Uniform(hash) < trigger.probability;
    case Trigger::Kind::kCount: return match_number >= trigger.first && match_number <= trigger.last;
  }
  return false;
}

Duration DelayOf(const Effect& effect, uint64_t hash) {
  if (effect.jitter.count() == 0) return effect.delay;
  // Another mix so the jitter is independent of whether the trigger fired.
  const double u = Uniform(Mix(hash ^ 0x6a09e667f3bcc909ull)) * 2.0 - 1.0;  // [-1, 1)
  const auto j = static_cast<int64_t>(u * static_cast<double>(effect.jitter.count()));
  return Duration(std::max<int64_t>(0, effect.delay.count() + j));
}

uint32_t OccurrenceTable::Next(Direction dir, uint32_t dst_qpn, uint32_t psn, uint8_t opcode) {
  // Never 0, so 0 marks an empty slot.
  const uint64_t key = (uint64_t{1} << 63) | (uint64_t{dir} << 56) | (uint64_t{opcode} << 48) |
                       (uint64_t{dst_qpn & 0xffffff} << 24) | (psn & 0xffffff);
  // The PSN's low bits pick neighbouring slots for neighbouring PSNs; the
  // rest of the key spreads QPs, opcodes and directions over the table.
  const size_t index =
      (psn + static_cast<size_t>(Mix(key & ~uint64_t{0xffffff}) >> 40)) & (kSlots - 1);
  Slot& slot = slots_[index];
  if (slot.key != key) {
    slot.key = key;
    slot.seen = 0;
  }
  return slot.seen++;
}

void OccurrenceTable::Clear() { slots_.fill(Slot{}); }

}  // namespace rdmaemu::fault
