#include "emulator/objects/mr.h"

#include <sys/mman.h>
#include <unistd.h>

#include <mutex>

#include <fmt/format.h>

#include "emulator/device/attributes.h"

namespace rdmaemu::objects {
namespace {

constexpr uint32_t kKnownAccess = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic |
                                  kMwBind | kZeroBased | kOnDemand | kHugetlb | kFlushGlobal |
                                  kFlushPersistent | kRelaxedOrdering;

// Hardware pins the pages at registration and fails with EFAULT when a page
// is not mapped; mincore() tells us the same without touching the memory.
Status CheckMapped(void* addr, uint64_t length) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  uint64_t end = reinterpret_cast<uintptr_t>(addr) + length;
  std::vector<unsigned char> vec(4096);
  for (uint64_t at = start; at < end;) {
    uint64_t chunk = std::min<uint64_t>(end - at, vec.size() * page);
    if (::mincore(reinterpret_cast<void*>(at), chunk, vec.data()) != 0) {
      return Status::Error(EFAULT, fmt::format("memory [{:#x}, {:#x}) is not mapped in this process",
                                               reinterpret_cast<uintptr_t>(addr),
                                               reinterpret_cast<uintptr_t>(addr) + length));
    }
    at += chunk;
  }
  return Status::Ok();
}

// Whether the kernel has MADV_POPULATE_READ/WRITE (5.14): asked once, of a
// page that is certainly mapped readable and writable.
bool PopulateSupported() {
  static const bool supported = [] {
    static uint64_t probe[512] __attribute__((aligned(4096)));
    return ::madvise(probe, sizeof probe, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
  }();
  return supported;
}

}  // namespace

Status FaultInHost(const void* addr, uint64_t len, bool write) {
  if (len == 0) return Status::Ok();
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uint64_t end = reinterpret_cast<uintptr_t>(addr) + len;
  if (end < start) return Status::Error(EFAULT, "the range wraps around the address space");
  // The kernel's own page fault, asked for in advance: it maps the pages in
  // (and, for writing, writable) or says it cannot (ENOMEM: not mapped;
  // EFAULT: the access would raise SIGSEGV or SIGBUS).
  if (::madvise(reinterpret_cast<void*>(start), end - start,
                write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0) {
    return Status::Ok();
  }
  const int error = errno;
  if (error == EINVAL && !PopulateSupported()) {
    // A kernel before 5.14: at least every page must be mapped.
    return CheckMapped(const_cast<void*>(addr), len);
  }
  // ENOMEM: not mapped; EFAULT, or EINVAL for a mapping that does not
  // allow the access (a read-only page asked for writing).
  return Status::Error(EFAULT, fmt::format("[{:#x}, +{}) cannot be faulted in for {} ({})",
                                           reinterpret_cast<uintptr_t>(addr), len,
                                           write ? "writing" : "reading",
                                           error == ENOMEM ? "not mapped"
                                                           : write ? "not mapped writable"
                                                                   : "not readable"));
}

Status Mr::FaultIn(uint64_t at, uint64_t len, bool write) const {
  if (!on_demand()) return Status::Ok();
  return FaultInHost(HostAddress(at), len, write);
}

bool Mr::Contains(uint64_t start, uint64_t len) const {
  if (start < iova) return false;
  uint64_t offset = start - iova;
  return offset <= length && len <= length - offset;
}

Status MrTable::CheckAccess(uint32_t access) {
  if (access & ~kKnownAccess) {
    return InvalidArgument(fmt::format("unknown access flags {:#x}", access & ~kKnownAccess));
  }
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite)) {
    return InvalidArgument(
        "IBV_ACCESS_REMOTE_WRITE and IBV_ACCESS_REMOTE_ATOMIC require IBV_ACCESS_LOCAL_WRITE");
  }
  if (access & kFlushPersistent) {
    // As rxe, which accepts it only on pages of persistent memory: this
    // device's memory is the process's own, which no FLUSH makes durable.
    return InvalidArgument("IBV_ACCESS_FLUSH_PERSISTENT needs persistent memory (pmem), and this "
                           "device has none; IBV_ACCESS_FLUSH_GLOBAL is supported");
  }
  return Status::Ok();
}

Result<std::shared_ptr<Mr>> MrTable::Build(uint32_t pd, void* addr, uint64_t length,
                                           uint64_t iova, uint32_t access) {
  if (Status s = CheckAccess(access); !s.ok()) return s;
  // As the kernel's ib_umem_get, which pins the pages [addr, addr + length)
  // touches: a zero-length region inside a page pins that page and
  // registers; at a page boundary it spans no page and is refused.
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (length == 0 && reinterpret_cast<uintptr_t>(addr) % page == 0) {
    return InvalidArgument("a zero-length memory region at a page boundary spans no page (the kernel refuses "
                           "it too; inside a page it registers)");
  }
  const bool implicit = addr == nullptr && length == kImplicitOdpLength;
  if (implicit && !(access & kOnDemand)) {
    return InvalidArgument("a region of the whole address space (NULL, SIZE_MAX) is an implicit "
                           "on-demand region and needs IBV_ACCESS_ON_DEMAND");
  }
  if (addr == nullptr && !implicit) {
    return Status::Error(EFAULT, "a memory region cannot start at address NULL");
  }
  if (!implicit && iova + length < iova) return InvalidArgument("iova + length overflows");
  // On demand, nothing is pinned now: pages are faulted in as they are used.
  if (!(access & kOnDemand)) {
    if (Status s = CheckMapped(addr, length); !s.ok()) return s;
  }

  auto mr = std::make_shared<Mr>();
  mr->pd = pd;
  mr->addr = static_cast<uint8_t*>(addr);
  mr->length = length;
  mr->iova = (access & kZeroBased) || implicit ? 0 : iova;
  mr->access = access;
  return mr;
}

Result<std::shared_ptr<const Mr>> MrTable::Register(uint32_t pd, void* addr, uint64_t length,
                                                    uint64_t iova, uint32_t access) {
  auto built = Build(pd, addr, length, iova, access);
  if (!built.ok()) return built.status();
  return Publish(*built);
}

Result<std::shared_ptr<const Mr>> MrTable::RegisterDeviceMemory(uint32_t pd, uint8_t* addr,
                                                                uint64_t length, uint32_t access) {
  if (Status s = CheckAccess(access); !s.ok()) return s;
  auto mr = std::make_shared<Mr>();
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->iova = 0;
  mr->access = access | kZeroBased;
  return Publish(std::move(mr));
}

Result<std::shared_ptr<const Mr>> MrTable::Publish(std::shared_ptr<Mr> mr) {
  std::unique_lock lock(mu_);
  if (live_ >= static_cast<size_t>(device::kMaxMr)) {
    return NoMemory(fmt::format("the device's {} memory regions are all in use", device::kMaxMr));
  }
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    generation_.push_back(0);
  }
  uint8_t gen = static_cast<uint8_t>(generation_[index] + 1);
  generation_[index] = gen;
  mr->lkey = mr->rkey = ((index + 1) << 8) | gen;
  slots_[index] = mr;
  ++live_;
  return std::shared_ptr<const Mr>(mr);
}

Result<std::shared_ptr<const Mr>> MrTable::Reregister(uint32_t lkey, uint32_t pd, void* addr,
                                                      uint64_t length, uint64_t iova,
                                                      uint32_t access) {
  if (!FindByLkey(lkey)) return InvalidArgument(fmt::format("no memory region with lkey {:#x}", lkey));
  auto built = Build(pd, addr, length, iova, access);
  if (!built.ok()) return built.status();
  std::shared_ptr<Mr> mr = *built;
  mr->lkey = mr->rkey = lkey;

  std::unique_lock lock(mu_);
  uint32_t index = (lkey >> 8) - 1;
  // Checked again under the lock: a concurrent deregistration wins.
  if (!slots_[index] || slots_[index]->lkey != lkey) {
    return InvalidArgument(fmt::format("no memory region with lkey {:#x}", lkey));
  }
  slots_[index] = mr;
  lock.unlock();
  // As at deregistration: a copy the engine started under the old
  // translation or rights ends before the call returns.
  std::unique_lock drain(access_mu_);
  return std::shared_ptr<const Mr>(mr);
}

Status MrTable::Deregister(uint32_t lkey) {
  std::unique_lock lock(mu_);
  uint32_t index = (lkey >> 8) - 1;
  if ((lkey >> 8) == 0 || index >= slots_.size() || !slots_[index] || slots_[index]->lkey != lkey) {
    return InvalidArgument(fmt::format("no memory region with lkey {:#x}", lkey));
  }
  slots_[index].reset();
  free_.push_back(index);
  --live_;
  lock.unlock();
  // Wait for any copy the engine started before the region disappeared.
  std::unique_lock drain(access_mu_);
  return Status::Ok();
}

std::shared_ptr<const Mr> MrTable::Find(uint32_t key) const {
  std::shared_lock lock(mu_);
  uint32_t index = (key >> 8) - 1;
  if ((key >> 8) == 0 || index >= slots_.size()) return nullptr;
  const auto& mr = slots_[index];
  if (!mr || mr->lkey != key) return nullptr;
  return mr;
}

std::shared_ptr<const Mr> MrTable::FindByLkey(uint32_t lkey) const { return Find(lkey); }
std::shared_ptr<const Mr> MrTable::FindByRkey(uint32_t rkey) const { return Find(rkey); }

size_t MrTable::size() const {
  std::shared_lock lock(mu_);
  return live_;
}

}  // namespace rdmaemu::objects
