// What the emulated device reports about itself: limits and fixed identity.
//
// One list, used by the provider to answer query_device and by the objects
// to enforce the same limits, so the two can never disagree.
#pragma once

#include <cstdint>

namespace rdmaemu::device {

// Our own vendor id (never Mellanox's 0x02c9: perftest would take mlx5-only
// paths). 0xFFFFFF is what Linux's soft-RoCE reports too.
inline constexpr uint32_t kVendorId = 0xFFFFFF;
inline constexpr uint32_t kVendorPartId = 0x5245;  // "RE"
inline constexpr uint32_t kHwVersion = 1;
inline constexpr const char* kFirmwareVersion = "rdmaemu 0.1";

inline constexpr int kMaxQp = 0x10000;
inline constexpr int kMaxQpWr = 0x4000;
inline constexpr int kMaxSge = 32;
inline constexpr int kMaxSgeRd = 32;
inline constexpr int kMaxCq = 16384;
inline constexpr int kMaxCqe = (1 << 17) - 1;
inline constexpr int kMaxMr = 0x40000;
inline constexpr int kMaxPd = 0x7ffc;
inline constexpr int kMaxQpRdAtom = 128;
inline constexpr int kMaxResRdAtom = 0x20000;
inline constexpr int kMaxMw = 0x10000;
inline constexpr int kMaxAh = 0x10000;
inline constexpr int kMaxSrq = 960;
inline constexpr int kMaxSrqWr = 0x4000;
inline constexpr int kMaxSrqSge = 27;
// Tag matching (ibv_tm_caps), sized as a ConnectX-5 reports it: a 64-byte
// rendezvous header (TMH, RVH and 32 bytes of the application's), 127 tags
// per SRQ, one SGE per tagged buffer. List operations complete as they are
// posted, so max_ops bounds only how many one SRQ may ask for at creation.
inline constexpr int kMaxRndvHdrSize = 64;
inline constexpr int kMaxNumTags = 127;
inline constexpr int kMaxTmOps = 0x8000;
inline constexpr int kMaxTmSge = 1;
// Each group a device joins is a socket of its own (bound to the group's
// address), so groups cost file descriptors: a few hundred, not thousands.
inline constexpr int kMaxMcastGrp = 256;
inline constexpr int kMaxMcastQpAttach = 56;
inline constexpr int kMaxInlineData = 256;
// Flow steering rules (ibv_create_flow) on a device, all ports together.
inline constexpr int kMaxFlowRules = 4096;
// device_cap_flags_ex bits above the classic 32 (the kernel's
// IB_UVERBS_DEVICE_FLUSH_GLOBAL and IB_UVERBS_DEVICE_ATOMIC_WRITE).
inline constexpr uint64_t kCapFlushGlobal = uint64_t{1} << 38;
inline constexpr uint64_t kCapAtomicWrite = uint64_t{1} << 40;
// The P_Key table of an InfiniBand port; a RoCE port has one entry, 0xFFFF.
inline constexpr uint16_t kMaxPkeys = 16;
// Work queues share the QP number space; receive indirection tables hold
// up to 2^kLogMaxRwqIndTableSize WQs.
inline constexpr int kMaxWq = kMaxQp;
inline constexpr int kMaxRwqIndTables = 1024;
inline constexpr uint32_t kLogMaxRwqIndTableSize = 8;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr uint8_t kLocalCaAckDelay = 15;
inline constexpr uint64_t kMaxMrSize = ~uint64_t{0};
inline constexpr uint64_t kPageSizeCap = 0xfffff000;
inline constexpr uint32_t kMaxMsgSize = 1u << 31;
inline constexpr int kGidTableLength = 16;
// Device memory (ibv_alloc_dm): what the device has in all, which is also the
// largest one allocation may be (max_dm_size, as on a ConnectX with 256 KiB of
// MEMIC), and the largest start alignment an allocation may ask for.
inline constexpr uint64_t kMaxDmSize = 256 * 1024;
inline constexpr uint32_t kMaxDmLogAlign = 12;
inline constexpr int kNumCompVectors = 1;

}  // namespace rdmaemu::device
