// Device memory: memory on the NIC itself (ConnectX's MEMIC), which a
// program allocates with ibv_alloc_dm, fills and reads with
// ibv_memcpy_to_dm / ibv_memcpy_from_dm, and registers with ibv_reg_dm_mr as
// a zero-based memory region that its QPs and their peers reach without
// crossing the host bus. The emulated device's is host memory the device
// owns: a fixed amount per device (max_dm_size), handed out and taken back as
// a NIC's firmware does, never more than that in use at once.
//
// Thread safety: any thread. A buffer returns its bytes to the device when it
// is destroyed, even after the device itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>

#include "emulator/base/status.h"

namespace rdmaemu::objects {

class DmBuffer;

class DeviceMemory {
 public:
  explicit DeviceMemory(uint64_t capacity);

  uint64_t capacity() const { return capacity_; }
  uint64_t in_use() const { return used_->load(std::memory_order_relaxed); }

  // A zeroed buffer of `length` bytes whose start is aligned to 2^log_align
  // bytes (at least 64, a NIC's allocation unit). EINVAL for a length of 0
  // or above the capacity (libmlx5 refuses more than max_dm_size itself) or
  // an alignment above device::kMaxDmLogAlign; ENOMEM when what is left of
  // the device's memory is too little (as the kernel's allocator).
  Result<std::unique_ptr<DmBuffer>> Allocate(uint64_t length, uint32_t log_align);

 private:
  const uint64_t capacity_;
  std::shared_ptr<std::atomic<uint64_t>> used_;  // shared with the buffers
};

class DmBuffer {
 public:
  ~DmBuffer();
  DmBuffer(const DmBuffer&) = delete;
  DmBuffer& operator=(const DmBuffer&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t length() const { return length_; }

  // ibv_memcpy_to_dm / ibv_memcpy_from_dm. A NIC's device memory is
  // reached in 4-byte words (libmlx5: "DM access address and length must be
  // aligned to 4 bytes"), so an offset or length that is not a multiple of 4
  // is EINVAL; a range beyond the buffer is EFAULT (both as libmlx5).
  Status CopyIn(uint64_t offset, const void* from, uint64_t length);
  Status CopyOut(void* to, uint64_t offset, uint64_t length) const;

 private:
  friend class DeviceMemory;
  DmBuffer(uint8_t* data, uint64_t length, uint64_t charged, std::align_val_t align,
           std::shared_ptr<std::atomic<uint64_t>> used);
  Status CheckRange(uint64_t offset, uint64_t length) const;

  uint8_t* const data_;
  const uint64_t length_;
  const uint64_t charged_;  // what it takes from the device's memory
  const std::align_val_t align_;
  const std::shared_ptr<std::atomic<uint64_t>> used_;
};

}  // namespace rdmaemu::objects
