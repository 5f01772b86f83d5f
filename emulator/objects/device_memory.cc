#include "emulator/objects/device_memory.h"

#include <algorithm>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "emulator/device/attributes.h"

namespace rdmaemu::objects {
namespace {

// A NIC hands out its memory in units of 64 bytes (ConnectX's MEMIC), each
// allocation a whole number of them, aligned at least to one.
constexpr uint64_t kUnit = 64;
constexpr uint32_t kUnitLog = 6;

}  // namespace

DeviceMemory::DeviceMemory(uint64_t capacity)
    : capacity_(capacity), used_(std::make_shared<std::atomic<uint64_t>>(0)) {}

Result<std::unique_ptr<DmBuffer>> DeviceMemory::Allocate(uint64_t length, uint32_t log_align) {
  if (length == 0) return InvalidArgument("a device memory buffer of 0 bytes");
  if (length > capacity_) {
    return InvalidArgument(fmt::format("{} bytes is more than the device's memory, max_dm_size {} "
                                       "bytes (ibv_query_device_ex)", length, capacity_));
  }
  if (log_align > device::kMaxDmLogAlign) {
    return InvalidArgument(fmt::format("log_align_req {} is above {}: device memory aligns a buffer "
                                       "to at most 2^{} bytes", log_align, device::kMaxDmLogAlign,
                                       device::kMaxDmLogAlign));
  }
  const uint64_t charged = (length + kUnit - 1) / kUnit * kUnit;
  uint64_t used = used_->load(std::memory_order_relaxed);
  do {
    if (charged > capacity_ - used) {
      return NoMemory(fmt::format("{} bytes of device memory asked for, {} of the device's {} are "
                                  "left (free a DM first)", length, capacity_ - used, capacity_));
    }
  } while (!used_->compare_exchange_weak(used, used + charged, std::memory_order_relaxed));
  const std::align_val_t align{uint64_t{1} << std::max(log_align, kUnitLog)};
  auto* data = static_cast<uint8_t*>(::operator new(charged, align, std::nothrow));
  if (data == nullptr) {
    used_->fetch_sub(charged, std::memory_order_relaxed);
    return NoMemory("the host has no memory left for the device memory buffer");
  }
  std::memset(data, 0, charged);
  return std::unique_ptr<DmBuffer>(new DmBuffer(data, length, charged, align, used_));
}

DmBuffer::DmBuffer(uint8_t* data, uint64_t length, uint64_t charged, std::align_val_t align,
                   std::shared_ptr<std::atomic<uint64_t>> used)
    : data_(data), length_(length), charged_(charged), align_(align), used_(std::move(used)) {}

DmBuffer::~DmBuffer() {
  ::operator delete(data_, align_);
  used_->fetch_sub(charged_, std::memory_order_relaxed);
}

Status DmBuffer::CheckRange(uint64_t offset, uint64_t length) const {
  if (offset > length_ || length > length_ - offset) {
    return Status::Error(EFAULT, fmt::format("[{}, {}+{}) is outside the {}-byte device memory buffer",
                                             offset, offset, length, length_));
  }
  if (offset % 4 != 0 || length % 4 != 0) {
    return InvalidArgument(fmt::format("offset {} and length {} must be multiples of 4: device memory "
                                       "is reached in 4-byte words", offset, length));
  }
  return Status::Ok();
}

Status DmBuffer::CopyIn(uint64_t offset, const void* from, uint64_t length) {
  if (Status s = CheckRange(offset, length); !s.ok()) return s;
  if (length != 0) std::memcpy(data_ + offset, from, length);
  return Status::Ok();
}

Status DmBuffer::CopyOut(void* to, uint64_t offset, uint64_t length) const {
  if (Status s = CheckRange(offset, length); !s.ok()) return s;
  if (length != 0) std::memcpy(to, data_ + offset, length);
  return Status::Ok();
}

}  // namespace rdmaemu::objects
