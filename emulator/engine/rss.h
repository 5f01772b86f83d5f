// Receive-side scaling: which WQ of an indirection table an incoming
// message goes to.
//
// The hash is Toeplitz (the RSS hash of Microsoft's specification, which
// IBV_RX_HASH_FUNC_TOEPLITZ names) over the selected fields of the packet,
// concatenated in the specification's order: source IPv4 address,
// destination IPv4 address, source UDP port, destination UDP port, each in
// network byte order; a field not selected is left out. The table entry is
// the hash's low bits (hash & (entries - 1)), as RSS hardware indexes its
// table. With no field selected the hash is 0: every message goes to
// entry 0.
#pragma once

#include <cstdint>
#include <span>

namespace rdmaemu::engine {

// IBV_RX_HASH_* bits (verbs.h's enum ibv_rx_hash_fields) the emulated
// device hashes on: RoCE v2 packets are IPv4 UDP.
inline constexpr uint64_t kRxHashSrcIpv4 = 1u << 0;
inline constexpr uint64_t kRxHashDstIpv4 = 1u << 1;
inline constexpr uint64_t kRxHashSrcPortUdp = 1u << 6;
inline constexpr uint64_t kRxHashDstPortUdp = 1u << 7;
inline constexpr uint64_t kRxHashSupportedFields =
    kRxHashSrcIpv4 | kRxHashDstIpv4 | kRxHashSrcPortUdp | kRxHashDstPortUdp;
// The Toeplitz key length the device takes (as mlx5 devices do).
inline constexpr size_t kRxHashKeyBytes = 40;

// The Toeplitz hash of `input` with `key` (key.size() >= input.size() + 4).
uint32_t ToeplitzHash(std::span<const uint8_t> key, std::span<const uint8_t> input);

// The hash of a packet's selected fields. Addresses and ports in host order.
uint32_t RxHash(std::span<const uint8_t> key, uint64_t fields, uint32_t src_ip, uint32_t dst_ip,
                uint16_t src_port, uint16_t dst_port);

}  // namespace rdmaemu::engine
