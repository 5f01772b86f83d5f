// Memory regions: registered application memory, its keys and access rights.
//
// A region is the only way the device touches application memory: every
// local gather/scatter and every remote read, write or atomic is checked
// against one (key, PD, bounds, rights) before a byte moves.
//
// Thread safety: an Mr is immutable once published; the table is guarded by
// a shared mutex (lookups on the data path take it shared).
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::objects {

// Access rights, numbered as the IBTA (and libibverbs) number them.
enum Access : uint32_t {
  kLocalWrite = 1u << 0,
  kRemoteWrite = 1u << 1,
  kRemoteRead = 1u << 2,
  kRemoteAtomic = 1u << 3,
  kMwBind = 1u << 4,
  kZeroBased = 1u << 5,
  kOnDemand = 1u << 6,
  kHugetlb = 1u << 7,
  // FLUSH targets (rdma-core 45's IBV_ACCESS_FLUSH_GLOBAL / _PERSISTENT;
  // Debian 12's verbs.h predates them).
  kFlushGlobal = 1u << 8,
  kFlushPersistent = 1u << 9,
  kRelaxedOrdering = 1u << 20,
};
inline constexpr uint32_t kRemoteAccessMask = kRemoteWrite | kRemoteRead | kRemoteAtomic;

struct Mr {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  uint32_t pd = 0;      // PD handle
  uint64_t iova = 0;    // the address the region answers to
  uint8_t* addr = nullptr;
  uint64_t length = 0;
  uint32_t access = 0;
  // A memory window's view (mw.h): remote access through it comes only
  // through this QP (a type 2 window is the QP's it was bound on); 0 = any.
  uint32_t bound_qpn = 0;

  // True when [iova, iova+len) lies inside the region (overflow-safe).
  bool Contains(uint64_t start, uint64_t len) const;
  // Host address of an iova inside the region.
  // (Integer arithmetic: an implicit region's addr is NULL.)
  uint8_t* HostAddress(uint64_t at) const {
    return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(addr) + (at - iova));
  }

  // An on-demand region (IBV_ACCESS_ON_DEMAND) pins nothing at registration:
  // its pages are faulted in when the device touches them, and one that is
  // not mapped (or not writable, for a write) fails that access instead.
  bool on_demand() const { return access & kOnDemand; }
  // Faults in [at, at+len) for reading or writing, as an ODP NIC's page
  // fault does; EFAULT when a page cannot be. Always OK for a pinned region.
  Status FaultIn(uint64_t at, uint64_t len, bool write) const;
};

// The whole address space: ibv_reg_mr(pd, NULL, SIZE_MAX,
// IBV_ACCESS_ON_DEMAND) registers an implicit on-demand region.
inline constexpr uint64_t kImplicitOdpLength = UINT64_MAX;

// Faults in host memory [addr, addr+len) as FaultIn does (madvise
// MADV_POPULATE_READ/WRITE; where the kernel lacks it, a check that every
// page is mapped). Shared with ibv_advise_mr's prefetch.
Status FaultInHost(const void* addr, uint64_t len, bool write);

class MrTable {
 public:
  // Validates like the kernel does at registration (access combination,
  // length, mapped memory) and publishes the region with fresh keys.
  Result<std::shared_ptr<const Mr>> Register(uint32_t pd, void* addr, uint64_t length,
                                             uint64_t iova, uint32_t access);
  // A region over device memory (ibv_reg_dm_mr): zero-based, so its
  // addresses are offsets from `addr`, and never pinned or checked against
  // the process's mappings (the device owns the memory). The caller checked
  // the range against its buffer.
  Result<std::shared_ptr<const Mr>> RegisterDeviceMemory(uint32_t pd, uint8_t* addr, uint64_t length,
                                                         uint32_t access);
  // Replaces a region's translation, PD or rights in place: the lkey and
  // rkey stay (rxe and mlx5 keep them; rdma-core's tests send the old rkey
  // after a rereg). On failure the region is unchanged.
  Result<std::shared_ptr<const Mr>> Reregister(uint32_t lkey, uint32_t pd, void* addr,
                                               uint64_t length, uint64_t iova, uint32_t access);
  Status Deregister(uint32_t lkey);

  // The engine holds this (shared) while it copies to or from registered
  // memory; Deregister takes it exclusively after unpublishing the region,
  // so once ibv_dereg_mr returns the device never touches that memory.
  std::shared_lock<std::shared_mutex> AccessGuard() const {
    return std::shared_lock<std::shared_mutex>(access_mu_);
  }

  std::shared_ptr<const Mr> FindByLkey(uint32_t lkey) const;
  std::shared_ptr<const Mr> FindByRkey(uint32_t rkey) const;
  size_t size() const;

  // Checks the access rights combination alone (shared with memory windows).
  static Status CheckAccess(uint32_t access);

 private:
  std::shared_ptr<const Mr> Find(uint32_t key) const;
  // A region's checks and fields, without keys and not yet published.
  static Result<std::shared_ptr<Mr>> Build(uint32_t pd, void* addr, uint64_t length, uint64_t iova,
                                           uint32_t access);
  // Gives a built region fresh keys and publishes it; ENOMEM at kMaxMr.
  Result<std::shared_ptr<const Mr>> Publish(std::shared_ptr<Mr> mr);

  mutable std::shared_mutex mu_;
  mutable std::shared_mutex access_mu_;
  std::vector<std::shared_ptr<const Mr>> slots_;  // guarded by mu_; index = key >> 8
  std::vector<uint8_t> generation_;                // guarded by mu_; key & 0xff
  std::vector<uint32_t> free_;                     // guarded by mu_
  size_t live_ = 0;                                // guarded by mu_
};

}  // namespace rdmaemu::objects
