// Tests of the device's own memory: what an allocation may ask, the
// device's budget, and the 4-byte copies in and out.
#include "emulator/objects/device_memory.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/device/attributes.h"

namespace rdmaemu::objects {
namespace {

constexpr uint64_t kCapacity = 4096;

TEST(DeviceMemoryTest, AllocatesZeroedAlignedBuffers) {
  DeviceMemory dm(kCapacity);
  for (uint32_t log_align : {0u, 3u, 6u, 9u, device::kMaxDmLogAlign}) {
    auto b = dm.Allocate(100, log_align);
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ((*b)->length(), 100u);
    const uint64_t align = uint64_t{1} << std::max(log_align, 6u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*b)->data()) % align, 0u) << "log_align " << log_align;
    std::vector<uint8_t> zeros(100, 0);
    EXPECT_EQ(std::memcmp((*b)->data(), zeros.data(), 100), 0);
  }
}

TEST(DeviceMemoryTest, RefusesWhatNoAllocationMayAsk) {
  DeviceMemory dm(kCapacity);
  auto zero = dm.Allocate(0, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), EINVAL);
  auto too_big = dm.Allocate(kCapacity + 1, 0);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), EINVAL) << "more than max_dm_size: libmlx5's EINVAL";
  EXPECT_NE(too_big.status().message().find("max_dm_size"), std::string::npos);
  auto misaligned = dm.Allocate(64, device::kMaxDmLogAlign + 1);
  ASSERT_FALSE(misaligned.ok());
  EXPECT_EQ(misaligned.status().code(), EINVAL);
  EXPECT_EQ(dm.in_use(), 0u);
  EXPECT_TRUE(dm.Allocate(kCapacity, 0).ok()) << "all of it, at once";
}

// The device's memory is shared by its allocations: when too little is
// left, ENOMEM, and a freed buffer gives its bytes back. Allocations take
// whole 64-byte units, as a NIC's.
TEST(DeviceMemoryTest, TheDevicesMemoryRunsOutAndComesBack) {
  DeviceMemory dm(kCapacity);
  std::vector<std::unique_ptr<DmBuffer>> held;
  for (int i = 0; i < 4; ++i) {
    auto b = dm.Allocate(1000, 0);  // 1024 bytes of the device's each
    ASSERT_TRUE(b.ok()) << i << ": " << b.status().message();
    held.push_back(std::move(b).value());
  }
  EXPECT_EQ(dm.in_use(), kCapacity);
  auto more = dm.Allocate(4, 0);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), ENOMEM);
  held.pop_back();
  EXPECT_EQ(dm.in_use(), kCapacity - 1024);
  EXPECT_TRUE(dm.Allocate(1024, 0).ok());
  held.clear();
  EXPECT_EQ(dm.in_use(), 0u);
}

TEST(DeviceMemoryTest, BuffersMayOutliveTheDevice) {
  std::unique_ptr<DmBuffer> kept;
  {
    DeviceMemory dm(kCapacity);
    kept = std::move(dm.Allocate(64, 0)).value();
  }
  kept.reset();  // returns its bytes to a count the device no longer reads
}

TEST(DeviceMemoryTest, CopiesInAndOutIn4ByteWords) {
  DeviceMemory dm(kCapacity);
  auto b = std::move(dm.Allocate(100, 0)).value();
  const char text[] = "device memory!!";  // 16 bytes with the NUL
  ASSERT_TRUE(b->CopyIn(8, text, 16).ok());
  char back[16] = {};
  ASSERT_TRUE(b->CopyOut(back, 8, 16).ok());
  EXPECT_STREQ(back, text);
  EXPECT_TRUE(b->CopyIn(96, text, 4).ok()) << "the last word";
  EXPECT_TRUE(b->CopyIn(100, text, 0).ok()) << "nothing, at the end";

  EXPECT_EQ(b->CopyIn(3, text, 4).code(), EINVAL) << "unaligned offset";
  EXPECT_EQ(b->CopyOut(back, 4, 3).code(), EINVAL) << "unaligned length";
  EXPECT_EQ(b->CopyIn(104, text, 4).code(), EFAULT) << "offset beyond the buffer";
  EXPECT_EQ(b->CopyOut(back, 0, 104).code(), EFAULT) << "length beyond the buffer";
  EXPECT_EQ(b->CopyOut(back, ~uint64_t{3}, 8).code(), EFAULT) << "offset + length wraps";
  Status s = b->CopyIn(3, text, 4);
  EXPECT_NE(s.message().find("multiples of 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace rdmaemu::objects
