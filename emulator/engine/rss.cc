#include "emulator/engine/rss.h"

#include "emulator/base/endian.h"

namespace rdmaemu::engine {

uint32_t ToeplitzHash(std::span<const uint8_t> key, std::span<const uint8_t> input) {
  // For every input bit that is set, XOR in the 32 key bits starting at that
  // bit's position. `window` holds the key bits from the current position on.
  uint32_t result = 0;
  uint64_t window = 0;
  for (size_t i = 0; i < 8 && i < key.size(); ++i) window |= uint64_t{key[i]} << (56 - 8 * i);
  size_t next_key_byte = 8;
  for (size_t byte = 0; byte < input.size(); ++byte) {
    for (int bit = 7; bit >= 0; --bit) {
      if (input[byte] & (1u << bit)) result ^= static_cast<uint32_t>(window >> 32);
      window <<= 1;
    }
    // Eight bits consumed: refill the low byte of the window.
    if (next_key_byte < key.size()) window |= uint64_t{key[next_key_byte]};
    ++next_key_byte;
  }
  return result;
}

uint32_t RxHash(std::span<const uint8_t> key, uint64_t fields, uint32_t src_ip, uint32_t dst_ip,
                uint16_t src_port, uint16_t dst_port) {
  uint8_t input[12];
  size_t n = 0;
  if (fields & kRxHashSrcIpv4) StoreBe32(input + n, src_ip), n += 4;
  if (fields & kRxHashDstIpv4) StoreBe32(input + n, dst_ip), n += 4;
  if (fields & kRxHashSrcPortUdp) StoreBe16(input + n, src_port), n += 2;
  if (fields & kRxHashDstPortUdp) StoreBe16(input + n, dst_port), n += 2;
  if (n == 0) return 0;
  return ToeplitzHash(key, std::span<const uint8_t>(input, n));
}

}  // namespace rdmaemu::engine
