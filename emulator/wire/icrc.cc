#include "emulator/wire/icrc.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <string>

#include "emulator/base/endian.h"
#include "emulator/wire/opcode.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rdmaemu::wire {
namespace {

constexpr uint32_t kPolynomial = 0xedb88320;  // IEEE 802.3, bit-reflected

// Slicing-by-8 tables: kTables[0] is the classic byte-at-a-time table;
// kTables[k][b] is the CRC contribution of byte b followed by k zero bytes,
// so 8 input bytes fold into the register with 8 independent lookups.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

consteval CrcTables MakeCrcTables() {
  CrcTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r & 1) ? (r >> 1) ^ kPolynomial : r >> 1;
    t[0][b] = r;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

constexpr CrcTables kTables = MakeCrcTables();

// Runs the CRC register over bytes; `reg` is the raw (not inverted) register.
constexpr uint32_t UpdateBytewise(uint32_t reg, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) reg = kTables[0][(reg ^ p[i]) & 0xff] ^ (reg >> 8);
  return reg;
}

uint32_t UpdateTable(uint32_t reg, const uint8_t* p, size_t n) {
  while (n >= 8) {
    const uint32_t lo = LoadLe32(p) ^ reg;
    const uint32_t hi = LoadLe32(p + 4);
    reg = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
          kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  return UpdateBytewise(reg, p, n);
}

#if defined(__x86_64__)
// Carry-less multiplication folding (Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction", 2009; the constants are the
// bit-reflected x^k mod P(x) of that paper for CRC-32, as in Linux's
// crc32-pclmul). Four 128-bit lanes absorb 64 bytes a step; each step
// multiplies a lane's halves by x^(512+32) and x^(512-32) mod P (reflected)
// and adds the next data, which keeps the lane congruent to the message.
// The lanes then fold into one (FinishFold takes it from there).
constexpr int64_t kFold512Lo = 0x154442bd4;  // fold 4 lanes by 64 bytes
constexpr int64_t kFold512Hi = 0x1c6e41596;
constexpr int64_t kFold128Lo = 0x1751997d0;  // fold 1 lane by 16 bytes
constexpr int64_t kFold128Hi = 0x0ccaa009e;

__attribute__((target("pclmul"))) inline __m128i Fold(__m128i lane, __m128i k, __m128i next) {
  const __m128i lo = _mm_clmulepi64_si128(lane, k, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(lane, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

__attribute__((target("pclmul"))) inline __m128i Load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The last reduction of the Intel paper (and Linux's crc32-pclmul): a
// 128-bit lane congruent to the message, folded to 64 bits (x^64 and x^32
// mod P) and reduced to the 32-bit register by Barrett (mu =
// floor(x^64 / P), and P itself, both bit-reflected). Where the tables did
// this, their 8 KiB left the cache to each 4 KiB payload, and the few bytes
// of each packet's headers cost as much as its payload.
// The constants are that paper's (Linux's R5, and its u and P'): the
// 96 → 64 fold, then mu and P for Barrett, all bit-reflected.
constexpr int64_t kFold64 = 0x163cd6124;
constexpr int64_t kBarrettMu = 0x1f7011641;
constexpr int64_t kBarrettP = 0x1db710641;

__attribute__((target("pclmul,sse4.1"))) uint32_t Reduce128(__m128i x) {
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  // 128 → 96 bits: the low half, multiplied by kFold128Hi, into the high.
  x = _mm_xor_si128(_mm_clmulepi64_si128(x, _mm_set_epi64x(kFold128Hi, kFold128Lo), 0x10),
                    _mm_srli_si128(x, 8));
  // 96 → 64 bits.
  x = _mm_xor_si128(_mm_srli_si128(x, 4),
                    _mm_clmulepi64_si128(_mm_and_si128(x, mask32), _mm_set_epi64x(0, kFold64), 0x00));
  // Barrett: q = (low 32 bits * mu) mod x^32, then the register is the
  // middle 32 bits of x + q * P.
  const __m128i poly = _mm_set_epi64x(kBarrettMu, kBarrettP);
  __m128i q = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x, mask32), poly, 0x10), mask32);
  x = _mm_xor_si128(x, _mm_clmulepi64_si128(q, poly, 0x00));
  return static_cast<uint32_t>(_mm_extract_epi32(x, 1));
}

uint32_t UpdateShortClmul(uint32_t reg, const uint8_t* p, size_t n);

// Both carry-less paths end here, with one 128-bit lane congruent to the
// message so far and n < 128 bytes left: the rest folds in 16 bytes a step,
// the lane reduces to the register, and the last few bytes follow.
__attribute__((target("pclmul,sse4.1"))) uint32_t FinishFold(__m128i x, const uint8_t* p, size_t n) {
  const __m128i k128 = _mm_set_epi64x(kFold128Hi, kFold128Lo);
  while (n >= 16) {
    x = Fold(x, k128, Load128(p));
    p += 16;
    n -= 16;
  }
  const uint32_t reg = Reduce128(x);
  return n >= 4 ? UpdateShortClmul(reg, p, n) : UpdateBytewise(reg, p, n);
}

// Needs n >= 64.
__attribute__((target("pclmul"))) uint32_t UpdateClmul(uint32_t reg, const uint8_t* p, size_t n) {
  const __m128i k512 = _mm_set_epi64x(kFold512Hi, kFold512Lo);
  const __m128i k128 = _mm_set_epi64x(kFold128Hi, kFold128Lo);
  // The register enters as the first 32 message bits, XORed in.
  __m128i x0 = _mm_xor_si128(Load128(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  __m128i x1 = Load128(p + 16);
  __m128i x2 = Load128(p + 32);
  __m128i x3 = Load128(p + 48);
  p += 64;
  n -= 64;
  while (n >= 64) {
    x0 = Fold(x0, k512, Load128(p));
    x1 = Fold(x1, k512, Load128(p + 16));
    x2 = Fold(x2, k512, Load128(p + 32));
    x3 = Fold(x3, k512, Load128(p + 48));
    p += 64;
    n -= 64;
  }
  __m128i x = Fold(Fold(Fold(x0, k128, x1), k128, x2), k128, x3);
  return FinishFold(x, p, n);
}

// 4 <= n < 64 bytes without the tables. The register enters as the first 32
// message bits XORed in (so with n >= 4 the rest starts from a zero
// register), and zero bytes in front of a message leave a zero register
// zero: so the bytes, right-aligned in a zeroed 64-byte block, give the
// same register as themselves.
uint32_t UpdateShortClmul(uint32_t reg, const uint8_t* p, size_t n) {
  assert(n >= 4 && n < 64);
  alignas(16) uint8_t block[64] = {};
  uint8_t* at = block + sizeof(block) - n;
  std::memcpy(at, p, n);
  StoreLe32(at, LoadLe32(at) ^ reg);
  return UpdateClmul(0, block, sizeof(block));
}

// The same with 256-bit lanes (VPCLMULQDQ on AVX2): four lanes absorb 128
// bytes a step, each half of a lane folded by x^(1024+32) and x^(1024-32);
// the lanes then fold into one by 32 bytes a step, and its two halves by
// 16 bytes. Needs n >= 128.
// The constants are x^(D+32) and x^(D-32) mod P, bit-reflected and shifted
// left by one, as the 512- and 128-bit ones above (which the same formula
// gives): D = 1024 for the lanes, 256 to fold them together.
constexpr int64_t kFold1024Lo = 0x1e88ef372;
constexpr int64_t kFold1024Hi = 0x14a7fe880;
constexpr int64_t kFold256Lo = 0x0f1da05aa;
constexpr int64_t kFold256Hi = 0x15a546366;

__attribute__((target("avx2,pclmul,vpclmulqdq"))) inline __m256i Fold256(__m256i lane, __m256i k, __m256i next) {
  const __m256i lo = _mm256_clmulepi64_epi128(lane, k, 0x00);
  const __m256i hi = _mm256_clmulepi64_epi128(lane, k, 0x11);
  return _mm256_xor_si256(_mm256_xor_si256(lo, hi), next);
}

__attribute__((target("avx2,pclmul,vpclmulqdq"))) inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

__attribute__((target("avx2,pclmul,vpclmulqdq"))) uint32_t UpdateVclmul(uint32_t reg, const uint8_t* p,
                                                                         size_t n) {
  const __m256i k1024 = _mm256_set_epi64x(kFold1024Hi, kFold1024Lo, kFold1024Hi, kFold1024Lo);
  const __m256i k256 = _mm256_set_epi64x(kFold256Hi, kFold256Lo, kFold256Hi, kFold256Lo);
  __m256i x0 = _mm256_xor_si256(Load256(p), _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(reg))));
  __m256i x1 = Load256(p + 32);
  __m256i x2 = Load256(p + 64);
  __m256i x3 = Load256(p + 96);
  p += 128;
  n -= 128;
  while (n >= 128) {
    x0 = Fold256(x0, k1024, Load256(p));
    x1 = Fold256(x1, k1024, Load256(p + 32));
    x2 = Fold256(x2, k1024, Load256(p + 64));
    x3 = Fold256(x3, k1024, Load256(p + 96));
    p += 128;
    n -= 128;
  }
  const __m256i y = Fold256(Fold256(Fold256(x0, k256, x1), k256, x2), k256, x3);
  const __m128i k128 = _mm_set_epi64x(kFold128Hi, kFold128Lo);
  __m128i x = Fold(_mm256_castsi256_si128(y), k128, _mm256_extracti128_si256(y, 1));
  // Clear the upper halves of the 256-bit registers before any SSE code
  // runs: the compiler does not insert VZEROUPPER in a function that gets
  // AVX from a target attribute, and legacy SSE instructions after dirty
  // upper halves pay a state transition. Without it every caller's next SSE
  // instruction stalled: the ICRC of a 4 KiB packet took 360 ns, where the
  // CRC of its bytes took 175.
  _mm256_zeroupper();
  return FinishFold(x, p, n);
}

// The same with 512-bit lanes (VPCLMULQDQ on AVX-512): four lanes absorb
// 256 bytes a step (D = 2048), fold into one by 64 bytes a step (D = 512,
// the constants of the 128-bit path's four lanes), and that lane's halves
// by 32 bytes (D = 256) and its quarters by 16; what is left of 256 bytes
// first folds into the one lane by 64. Needs n >= 256. On a CPU
// that executes 512-bit instructions whole, twice the 256-bit path's bytes
// per cycle.
constexpr int64_t kFold2048Lo = 0x11542778a;
constexpr int64_t kFold2048Hi = 0x1322d1430;

__attribute__((target("avx512f,avx512vl,pclmul,vpclmulqdq"))) inline __m512i Fold512(__m512i lane, __m512i k,
                                                                                      __m512i next) {
  const __m512i lo = _mm512_clmulepi64_epi128(lane, k, 0x00);
  const __m512i hi = _mm512_clmulepi64_epi128(lane, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, next, 0x96);  // lo ^ hi ^ next
}

__attribute__((target("avx512f,avx512vl,pclmul,vpclmulqdq"))) uint32_t UpdateVclmul512(uint32_t reg,
                                                                                        const uint8_t* p,
                                                                                        size_t n) {
  const __m512i k2048 = _mm512_set_epi64(kFold2048Hi, kFold2048Lo, kFold2048Hi, kFold2048Lo, kFold2048Hi,
                                         kFold2048Lo, kFold2048Hi, kFold2048Lo);
  const __m512i k512 = _mm512_set_epi64(kFold512Hi, kFold512Lo, kFold512Hi, kFold512Lo, kFold512Hi,
                                        kFold512Lo, kFold512Hi, kFold512Lo);
  // (GCC 12's zero-extending casts and plain extracts read an undefined
  // register, which -Werror=uninitialized refuses: inserts and masked
  // extracts instead.)
  const __m128i first = _mm_cvtsi32_si128(static_cast<int>(reg));
  __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_inserti32x4(_mm512_setzero_si512(), first, 0));
  __m512i x1 = _mm512_loadu_si512(p + 64);
  __m512i x2 = _mm512_loadu_si512(p + 128);
  __m512i x3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  while (n >= 256) {
    x0 = Fold512(x0, k2048, _mm512_loadu_si512(p));
    x1 = Fold512(x1, k2048, _mm512_loadu_si512(p + 64));
    x2 = Fold512(x2, k2048, _mm512_loadu_si512(p + 128));
    x3 = Fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  __m512i y = Fold512(Fold512(Fold512(x0, k512, x1), k512, x2), k512, x3);
  // What is left of 256 bytes, one lane at a time: FinishFold would take
  // it 16 bytes a step, each step waiting for the one before.
  while (n >= 64) {
    y = Fold512(y, k512, _mm512_loadu_si512(p));
    p += 64;
    n -= 64;
  }
  const __m256i k256 = _mm256_set_epi64x(kFold256Hi, kFold256Lo, kFold256Hi, kFold256Lo);
  const __m256i z =
      Fold256(_mm512_maskz_extracti64x4_epi64(0xff, y, 0), k256, _mm512_maskz_extracti64x4_epi64(0xff, y, 1));
  const __m128i k128 = _mm_set_epi64x(kFold128Hi, kFold128Lo);
  __m128i x = Fold(_mm256_castsi256_si128(z), k128, _mm256_extracti128_si256(z, 1));
  // As in UpdateVclmul: no dirty upper halves (of the 512-bit registers
  // too) for the SSE code that follows.
  _mm256_zeroupper();
  return FinishFold(x, p, n);
}

bool CpuHasVclmul512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2");
}
const bool kHasVclmul512 = CpuHasVclmul512();

bool CpuHasVclmul() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx2");
}
const bool kHasVclmul = CpuHasVclmul();

bool CpuHasClmul() {
  __builtin_cpu_init();
  // (Reduce128 also needs SSE4.1, which every CPU with PCLMULQDQ has.)
  return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

// False until initialized, which only means the table path: always correct.
const bool kHasClmul = CpuHasClmul();
#endif

uint32_t Update(uint32_t reg, const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (n >= 256 && kHasVclmul512) return UpdateVclmul512(reg, p, n);
  if (n >= 128 && kHasVclmul) return UpdateVclmul(reg, p, n);
  if (n >= 64 && kHasClmul) return UpdateClmul(reg, p, n);
  if (n >= 4 && kHasClmul) return UpdateShortClmul(reg, p, n);
#endif
  return UpdateTable(reg, p, n);
}

uint32_t Update(uint32_t reg, std::span<const uint8_t> data) {
  return Update(reg, data.data(), data.size());
}

// The register after the 8 bytes of 0xFF that stand in for the LRH.
constexpr uint32_t kRegisterAfterLrh = [] {
  constexpr uint8_t kOnes[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  return UpdateBytewise(0xffffffff, kOnes, sizeof(kOnes));
}();
static_assert(kRegisterAfterLrh == 0xdebb20e3, "rxe's seed for the ICRC");

// Offsets of the fields the ICRC replaces with ones.
constexpr size_t kIpv4Tos = 1;
constexpr size_t kIpv4Ttl = 8;
constexpr size_t kIpv4Checksum = 10;
constexpr size_t kIpv6HopLimit = 7;
constexpr size_t kUdpChecksum = 6;
constexpr size_t kBthResv8a = 4;  // FECN, BECN, resv6

constexpr size_t kMaxIpUdpBytes = kIpv6HeaderBytes + kUdpHeaderBytes;

// Masks the variant fields of IP+UDP headers in place. `ip_bytes` is 20 or 40.
void MaskVariantFields(uint8_t* h, size_t ip_bytes) {
  if (ip_bytes == kIpv4HeaderBytes) {
    h[kIpv4Tos] = 0xff;
    h[kIpv4Ttl] = 0xff;
    StoreBe16(h + kIpv4Checksum, 0xffff);
  } else {
    h[0] |= 0x0f;               // low nibble of the traffic class
    h[1] = h[2] = h[3] = 0xff;  // rest of the traffic class, flow label
    h[kIpv6HopLimit] = 0xff;
  }
  StoreBe16(h + ip_bytes + kUdpChecksum, 0xffff);
}

// The ICRC over already-masked IP+UDP headers and the IB packet gathered
// from pieces; the first holds at least the BTH's first 5 bytes.
uint32_t IcrcOverMasked(std::span<const uint8_t> masked_ip_udp,
                        std::span<const std::span<const uint8_t>> ib) {
  assert(!ib.empty() && ib[0].size() > kBthResv8a && masked_ip_udp.size() <= kMaxIpUdpBytes);
  // The headers and the start of the IB packet in one block, BTH byte 4
  // masked there: one pass of the carry-less path rather than several of a
  // few bytes each.
  // Up to 64 bytes of it, so many that the block is a multiple of 16
  // bytes: none is left over for the short path, which costs a whole
  // 64-byte pass and a second reduction.
  constexpr size_t kHeadIb = 64;
  uint8_t head[kMaxIpUdpBytes + kHeadIb];
  const size_t ip_udp = masked_ip_udp.size();
  const size_t first = std::min(ib[0].size(), kHeadIb - (ip_udp + kHeadIb) % 16);
  std::memcpy(head, masked_ip_udp.data(), ip_udp);
  std::memcpy(head + ip_udp, ib[0].data(), first);
  head[ip_udp + kBthResv8a] = 0xff;
  uint32_t reg = Update(kRegisterAfterLrh, head, ip_udp + first);
  reg = Update(reg, ib[0].subspan(first));
  for (const auto& piece : ib.subspan(1)) reg = Update(reg, piece);
  return ~reg;
}

uint32_t IcrcOverMasked(std::span<const uint8_t> masked_ip_udp, std::span<const uint8_t> ib) {
  assert(ib.size() >= kBthBytes);
  return IcrcOverMasked(masked_ip_udp, std::span<const std::span<const uint8_t>>(&ib, 1));
}

uint16_t UdpLength(size_t ib_bytes) {
  return static_cast<uint16_t>(kUdpHeaderBytes + ib_bytes + kIcrcBytes);
}

void StoreUdpHeader(uint8_t* udp, uint16_t src_port, uint16_t dst_port, size_t ib_bytes) {
  StoreBe16(udp, src_port);
  StoreBe16(udp + 2, dst_port);
  StoreBe16(udp + 4, UdpLength(ib_bytes));
  StoreBe16(udp + 6, 0);
}

}  // namespace

uint32_t Crc32(uint32_t crc, std::span<const uint8_t> data) { return ~Update(~crc, data); }

uint32_t Crc32Portable(uint32_t crc, std::span<const uint8_t> data) {
  return ~UpdateTable(~crc, data.data(), data.size());
}

std::optional<uint32_t> Crc32Clmul(uint32_t crc, std::span<const uint8_t> data) {
#if defined(__x86_64__)
  if (!kHasClmul) return std::nullopt;
  if (data.size() < 64) return Crc32Portable(crc, data);
  return ~UpdateClmul(~crc, data.data(), data.size());
#else
  return std::nullopt;
#endif
}

std::optional<uint32_t> Crc32Vclmul512(uint32_t crc, std::span<const uint8_t> data) {
#if defined(__x86_64__)
  if (!kHasVclmul512) return std::nullopt;
  if (data.size() < 256) return Crc32Portable(crc, data);
  return ~UpdateVclmul512(~crc, data.data(), data.size());
#else
  return std::nullopt;
#endif
}

std::optional<uint32_t> Crc32Vclmul(uint32_t crc, std::span<const uint8_t> data) {
#if defined(__x86_64__)
  if (!kHasVclmul) return std::nullopt;
  if (data.size() < 128) return Crc32Portable(crc, data);
  return ~UpdateVclmul(~crc, data.data(), data.size());
#else
  return std::nullopt;
#endif
}

namespace {

// The masked IPv4 and UDP headers of an IB packet of `ib_bytes` (without
// the ICRC).
std::array<uint8_t, kIpv4HeaderBytes + kUdpHeaderBytes> MaskedHeaders(const IcrcAddressing& addr,
                                                                      size_t ib_bytes) {
  std::array<uint8_t, kIpv4HeaderBytes + kUdpHeaderBytes> a{};
  uint8_t* h = a.data();
  h[0] = 0x45;  // version 4, IHL 5 words
  StoreBe16(h + 2, static_cast<uint16_t>(kIpv4HeaderBytes + UdpLength(ib_bytes)));
  StoreBe16(h + 4, 0);       // identification: Linux sends 0 on unconnected DF sockets
  StoreBe16(h + 6, 0x4000);  // flags: don't fragment; fragment offset 0
  h[9] = 17;                 // protocol UDP
  StoreBe32(h + 12, addr.src_ip);
  StoreBe32(h + 16, addr.dst_ip);
  StoreUdpHeader(h + kIpv4HeaderBytes, addr.src_port, addr.dst_port, ib_bytes);
  MaskVariantFields(h, kIpv4HeaderBytes);
  return a;
}

}  // namespace

uint32_t ComputeIcrc(const IcrcAddressing& addr, std::span<const uint8_t> ib) {
  return IcrcOverMasked(MaskedHeaders(addr, ib.size()), ib);
}

uint32_t ComputeIcrc(const IcrcAddressing& addr, std::span<const std::span<const uint8_t>> ib) {
  size_t bytes = 0;
  for (const auto& piece : ib) bytes += piece.size();
  return IcrcOverMasked(MaskedHeaders(addr, bytes), ib);
}

uint32_t ComputeIcrc(const IcrcAddressing6& addr, std::span<const uint8_t> ib) {
  uint8_t h[kIpv6HeaderBytes + kUdpHeaderBytes] = {};
  h[0] = 0x60;                             // version 6
  StoreBe16(h + 4, UdpLength(ib.size()));  // payload length
  h[6] = 17;                               // next header UDP
  for (size_t i = 0; i < 16; ++i) {
    h[8 + i] = addr.src_ip[i];
    h[24 + i] = addr.dst_ip[i];
  }
  StoreUdpHeader(h + kIpv6HeaderBytes, addr.src_port, addr.dst_port, ib.size());
  MaskVariantFields(h, kIpv6HeaderBytes);
  return IcrcOverMasked(h, ib);
}

Result<uint32_t> ComputeIcrcWithHeaders(std::span<const uint8_t> ip_udp,
                                        std::span<const uint8_t> ib) {
  if (ib.size() < kBthBytes) {
    return InvalidArgument("ICRC: IB packet of " + std::to_string(ib.size()) +
                           " bytes is shorter than a BTH");
  }
  if (ip_udp.empty()) return InvalidArgument("ICRC: no IP header");
  const uint8_t version = ip_udp[0] >> 4;
  size_t ip_bytes = 0;
  if (version == 4 && ip_udp[0] == 0x45) {
    ip_bytes = kIpv4HeaderBytes;
  } else if (version == 6) {
    ip_bytes = kIpv6HeaderBytes;
  } else {
    return InvalidArgument("ICRC: first IP byte " + std::to_string(ip_udp[0]) +
                           " is neither IPv4 without options (0x45) nor IPv6");
  }
  if (ip_udp.size() != ip_bytes + kUdpHeaderBytes) {
    return InvalidArgument("ICRC: expected " + std::to_string(ip_bytes + kUdpHeaderBytes) +
                           " bytes of IP+UDP header, got " + std::to_string(ip_udp.size()));
  }
  uint8_t h[kMaxIpUdpBytes];
  for (size_t i = 0; i < ip_udp.size(); ++i) h[i] = ip_udp[i];
  MaskVariantFields(h, ip_bytes);
  return IcrcOverMasked(std::span<const uint8_t>(h, ip_udp.size()), ib);
}

namespace {

template <typename Addressing>
void WriteIcrcImpl(const Addressing& addr, std::span<uint8_t> packet) {
  assert(packet.size() >= kBthBytes + kIcrcBytes);
  const size_t body = packet.size() - kIcrcBytes;
  StoreLe32(packet.data() + body, ComputeIcrc(addr, packet.first(body)));
}

template <typename Addressing>
Status CheckIcrcImpl(const Addressing& addr, std::span<const uint8_t> packet) {
  if (packet.size() < kBthBytes + kIcrcBytes) {
    return InvalidArgument("ICRC: packet of " + std::to_string(packet.size()) +
                           " bytes has no room for a BTH and an ICRC");
  }
  const size_t body = packet.size() - kIcrcBytes;
  const uint32_t stored = LoadLe32(packet.data() + body);
  const uint32_t computed = ComputeIcrc(addr, packet.first(body));
  if (stored == computed) return Status::Ok();
  char msg[96];
  std::snprintf(msg, sizeof(msg), "ICRC mismatch: packet carries 0x%08x, computed 0x%08x", stored,
                computed);
  return Status::Error(EBADMSG, msg);
}

}  // namespace

void WriteIcrc(const IcrcAddressing& addr, std::span<uint8_t> packet) {
  WriteIcrcImpl(addr, packet);
}
void WriteIcrc(const IcrcAddressing6& addr, std::span<uint8_t> packet) {
  WriteIcrcImpl(addr, packet);
}
Status CheckIcrc(const IcrcAddressing& addr, std::span<const uint8_t> packet) {
  return CheckIcrcImpl(addr, packet);
}
Status CheckIcrc(const IcrcAddressing6& addr, std::span<const uint8_t> packet) {
  return CheckIcrcImpl(addr, packet);
}

}  // namespace rdmaemu::wire
