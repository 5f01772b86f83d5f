// The soak test's plan: every message both sides agree on, derived from a
// seed alone, so the receiver knows what each message must hold without
// being told, and any byte out of place is caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace soak {

// splitmix64: a tiny, well-mixed generator; the same seed gives the same
// stream on both sides.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n); n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};
uint64_t Mix(uint64_t x);

enum class Kind : uint8_t { kSend, kSendImm, kWrite, kWriteImm, kRead, kFetchAdd, kCompareSwap };
const char* KindName(Kind k);
inline bool ConsumesRecv(Kind k) {
  return k == Kind::kSend || k == Kind::kSendImm || k == Kind::kWriteImm;
}
inline bool IsWrite(Kind k) { return k == Kind::kWrite || k == Kind::kWriteImm; }
inline bool IsAtomic(Kind k) { return k == Kind::kFetchAdd || k == Kind::kCompareSwap; }
inline bool HasImm(Kind k) { return k == Kind::kSendImm || k == Kind::kWriteImm; }

// What both sides agree on before the first message (the client sends it).
struct Params {
  uint64_t seed = 1;
  uint32_t messages = 100000;
  uint32_t mtu = 1024;       // the path MTU both QPs use
  uint32_t max_size = 4096;  // largest message (atomics are 8 bytes)
  uint32_t batch = 256;      // messages per batch (the receiver's credit unit)
  uint32_t depth = 32;       // send WRs outstanding at once
  uint32_t atomics = 8;      // 64-bit words the atomics work on
  uint32_t read_bytes = 1 << 20;  // size of the region READs read from
};

struct Message {
  uint32_t index = 0;
  Kind kind = Kind::kSend;
  uint8_t sges = 1;       // local SGEs the payload is split across (1..3)
  bool inline_data = false;
  uint32_t size = 0;
  uint64_t remote_offset = 0;  // READ: offset in the read region; WRITE: in the write area
  uint32_t atomic_slot = 0;
  uint64_t compare_add = 0;    // FETCH_ADD: the addend; CMP_SWP: the compare value
  uint64_t swap = 0;
  uint64_t expected_old = 0;   // what an atomic must return (the model's value before it)
};

class Plan {
 public:
  explicit Plan(const Params& p);
  const Params& params() const { return p_; }
  const Message& operator[](uint32_t i) const { return messages_[i]; }
  uint32_t size() const { return static_cast<uint32_t>(messages_.size()); }
  // The atomic words' values before any message and after all of them.
  uint64_t AtomicInitial(uint32_t slot) const;
  const std::vector<uint64_t>& AtomicFinal() const { return atomic_final_; }
  // Batches: the last message of each is a SEND with immediate, after which
  // the receiver checks the batch's writes and grants a credit.
  uint32_t BatchOf(uint32_t index) const { return index / p_.batch; }
  bool LastOfBatch(uint32_t index) const {
    return (index + 1) % p_.batch == 0 || index + 1 == p_.messages;
  }
  uint32_t Batches() const { return (p_.messages + p_.batch - 1) / p_.batch; }
  // The write area holds two batches, one slot of max_size per message.
  uint64_t WriteAreaBytes() const { return uint64_t{2} * p_.batch * p_.max_size; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  Params p_;
  std::vector<Message> messages_;
  std::vector<uint64_t> atomic_final_;
  uint64_t total_bytes_ = 0;
};

// The size of UD message `index`: uniform in [0, max_size].
uint32_t UdSize(const Params& p, uint32_t index);

// Message payloads: the first 8 bytes are the message index (little
// endian), the rest a stream keyed by (seed, index).
void FillPayload(uint64_t seed, uint32_t index, uint8_t* out, size_t len);
uint8_t PayloadByte(uint64_t seed, uint32_t index, size_t offset);
// The read region: a stream keyed by the seed alone, byte-addressed.
void FillReadRegion(uint64_t seed, uint8_t* out, size_t len);
uint8_t ReadRegionByte(uint64_t seed, size_t offset);

// Compares `got` with the payload of message `index` (or the read region
// from `region_offset` when index is kReadRegion); on the first difference
// writes "offset N: expected 0xEE, got 0xGG" into *why and returns false.
inline constexpr uint32_t kReadRegion = UINT32_MAX;
bool CheckPayload(uint64_t seed, uint32_t index, uint64_t region_offset, const uint8_t* got,
                  size_t len, std::string* why);

// Unwritten memory holds this byte, so a write that lands short, long or
// twice shows.
inline constexpr uint8_t kPoison = 0xA5;
// False (and the first offset in *why) unless [p, p+len) is all poison.
bool CheckPoison(const uint8_t* p, size_t len, std::string* why);

}  // namespace soak
