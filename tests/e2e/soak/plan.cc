#include "tests/e2e/soak/plan.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace soak {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kReadSalt = 0x5EADBEEFCAFEF00Dull;
constexpr uint64_t kAtomicSalt = 0xA70A1CA70A1Cull;

uint64_t PayloadKey(uint64_t seed, uint32_t index) { return Mix(seed ^ Mix(index + 0x1234567ull)); }
uint64_t ReadKey(uint64_t seed) { return Mix(seed ^ kReadSalt); }
uint64_t StreamWord(uint64_t key, uint64_t word) { return Mix(key + word * kGolden); }
uint8_t ByteOf(uint64_t w, size_t k) { return static_cast<uint8_t>(w >> (8 * k)); }

// Bytes [from, from+len) of the stream `key`, shifted so that stream byte
// `from` lands at out[0].
void FillStream(uint64_t key, uint64_t from, uint8_t* out, size_t len) {
  size_t done = 0;
  while (done < len) {
    const uint64_t pos = from + done;
    const uint64_t w = StreamWord(key, pos / 8);
    const size_t k = pos % 8;
    const size_t n = std::min<size_t>(8 - k, len - done);
    for (size_t j = 0; j < n; ++j) out[done + j] = ByteOf(w, k + j);
    done += n;
  }
}

// The size distribution: many small messages, many of about one MTU, and
// a quarter that take several packets (up to max_size).
uint32_t PickSize(Rng& rng, const Params& p) {
  const uint64_t r = rng.Below(100);
  if (r < 40) return static_cast<uint32_t>(rng.Below(std::min<uint32_t>(256, p.max_size) + 1));
  if (r < 75 || p.max_size <= p.mtu) {
    return static_cast<uint32_t>(rng.Below(std::min(p.mtu, p.max_size) + 1));
  }
  return p.mtu + 1 + static_cast<uint32_t>(rng.Below(p.max_size - p.mtu));
}

Kind PickKind(Rng& rng) {
  const uint64_t r = rng.Below(100);
  if (r < 20) return Kind::kSend;
  if (r < 35) return Kind::kSendImm;
  if (r < 52) return Kind::kWrite;
  if (r < 65) return Kind::kWriteImm;
  if (r < 85) return Kind::kRead;
  if (r < 93) return Kind::kFetchAdd;
  return Kind::kCompareSwap;
}

}  // namespace

uint64_t Mix(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Rng::Next() {
  state_ += kGolden;
  uint64_t x = state_;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kSend: return "SEND";
    case Kind::kSendImm: return "SEND_WITH_IMM";
    case Kind::kWrite: return "RDMA_WRITE";
    case Kind::kWriteImm: return "RDMA_WRITE_WITH_IMM";
    case Kind::kRead: return "RDMA_READ";
    case Kind::kFetchAdd: return "FETCH_ADD";
    case Kind::kCompareSwap: return "CMP_SWP";
  }
  return "?";
}

uint64_t Plan::AtomicInitial(uint32_t slot) const { return Mix(p_.seed ^ kAtomicSalt ^ slot); }

Plan::Plan(const Params& p) : p_(p) {
  Rng rng(Mix(p.seed));
  std::vector<uint64_t> model(p.atomics);
  for (uint32_t s = 0; s < p.atomics; ++s) model[s] = AtomicInitial(s);
  messages_.resize(p.messages);
  for (uint32_t i = 0; i < p.messages; ++i) {
    Message& m = messages_[i];
    m.index = i;
    m.kind = LastOfBatch(i) ? Kind::kSendImm : PickKind(rng);
    if (IsAtomic(m.kind)) {
      m.size = 8;
      m.atomic_slot = static_cast<uint32_t>(rng.Below(p.atomics));
      uint64_t& word = model[m.atomic_slot];
      m.expected_old = word;
      if (m.kind == Kind::kFetchAdd) {
        m.compare_add = rng.Next();
        word += m.compare_add;
      } else {
        // Half the compares match (the swap happens), half do not.
        const bool match = rng.Below(2) == 0;
        m.compare_add = match ? word : word ^ (rng.Next() | 1);
        m.swap = rng.Next();
        if (match) word = m.swap;
      }
      total_bytes_ += 8;
      continue;
    }
    m.size = PickSize(rng, p);
    if (m.kind == Kind::kRead) {
      m.size = std::min(m.size, p.read_bytes);
      m.remote_offset = rng.Below(p.read_bytes - m.size + 1);
    } else if (IsWrite(m.kind)) {
      m.remote_offset = (uint64_t{BatchOf(i) % 2} * p.batch + i % p.batch) * p.max_size;
    }
    if (m.size >= 3) m.sges = static_cast<uint8_t>(1 + rng.Below(3));
    // Small SENDs and WRITEs go inline half the time.
    if (m.kind != Kind::kRead && m.size <= 64) m.inline_data = rng.Below(2) == 0;
    total_bytes_ += m.size;
  }
  atomic_final_ = std::move(model);
}

uint32_t UdSize(const Params& p, uint32_t index) {
  return static_cast<uint32_t>(Mix(p.seed ^ 0x0D5E7D ^ (uint64_t{index} * kGolden)) % (uint64_t{p.max_size} + 1));
}

void FillPayload(uint64_t seed, uint32_t index, uint8_t* out, size_t len) {
  for (size_t k = 0; k < std::min<size_t>(8, len); ++k) out[k] = ByteOf(index, k);
  if (len > 8) FillStream(PayloadKey(seed, index), 8, out + 8, len - 8);
}

uint8_t PayloadByte(uint64_t seed, uint32_t index, size_t offset) {
  if (offset < 8) return ByteOf(index, offset);
  return ByteOf(StreamWord(PayloadKey(seed, index), offset / 8), offset % 8);
}

void FillReadRegion(uint64_t seed, uint8_t* out, size_t len) { FillStream(ReadKey(seed), 0, out, len); }

uint8_t ReadRegionByte(uint64_t seed, size_t offset) {
  return ByteOf(StreamWord(ReadKey(seed), offset / 8), offset % 8);
}

bool CheckPayload(uint64_t seed, uint32_t index, uint64_t region_offset, const uint8_t* got,
                  size_t len, std::string* why) {
  // Build the expectation in chunks and compare with memcmp; find the
  // exact byte only on a mismatch.
  uint8_t want[4096];
  for (size_t done = 0; done < len; done += sizeof want) {
    const size_t n = std::min(sizeof want, len - done);
    if (index == kReadRegion) {
      FillStream(ReadKey(seed), region_offset + done, want, n);
    } else if (done == 0) {
      FillPayload(seed, index, want, n);
    } else {
      FillStream(PayloadKey(seed, index), done, want, n);
    }
    if (std::memcmp(want, got + done, n) == 0) continue;
    for (size_t k = 0; k < n; ++k) {
      if (want[k] != got[done + k]) {
        *why = fmt::format("offset {}: expected {:#04x}, got {:#04x}", done + k, want[k], got[done + k]);
        return false;
      }
    }
  }
  return true;
}

bool CheckPoison(const uint8_t* p, size_t len, std::string* why) {
  static const auto* poison = [] {
    auto* b = new uint8_t[4096];
    std::memset(b, kPoison, 4096);
    return b;
  }();
  for (size_t done = 0; done < len; done += 4096) {
    const size_t n = std::min<size_t>(4096, len - done);
    if (std::memcmp(p + done, poison, n) == 0) continue;
    for (size_t k = 0; k < n; ++k) {
      if (p[done + k] != kPoison) {
        *why = fmt::format("offset {}: expected untouched memory ({:#04x}), got {:#04x}", done + k,
                           kPoison, p[done + k]);
        return false;
      }
    }
  }
  return true;
}

}  // namespace soak
