// Memory windows: a window grants remote access to a range of
// a memory region under an rkey of its own, which the application can bind,
// move and revoke without registering again.
//
// A bound window is published as an Mr "view" (its range, its rights, the
// host memory of its region), so the responder checks a window's rkey the
// way it checks a region's: one lookup, then Contains/HostAddress. Binding
// again or invalidating replaces or drops the view, so a WRITE in progress
// through a window notices the change as it notices a deregistration.
//
// Window rkeys have bit 31 set (index 0x800000 and up); region keys never
// reach it (device::kMaxMr regions), so an rkey says which table to ask.
//
// Thread safety: every method may be called from any thread; the table is
// guarded by one mutex. Binding and invalidating run on the engine while it
// holds MrTable::AccessGuard; BeginDeregister/EndDeregister let the
// provider deregister a region without holding this table's lock across the
// region table's drain (which waits for that guard).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/objects/mr.h"

namespace rdmaemu::objects {

// ibv_mw_type's numbering. Type 2 windows are type 2B, as the device
// reports: usable only through the QP that bound them.
enum class MwType : uint8_t { kType1 = 1, kType2 = 2 };

inline constexpr uint32_t kMwKeyBit = 0x80000000u;
inline bool IsWindowKey(uint32_t rkey) { return (rkey & kMwKeyBit) != 0; }

// What a bind work request asks (ibv_mw_bind_info, the new rkey, and who
// posts it).
struct BindRequest {
  uint32_t mw_rkey = 0;     // the window, named by the rkey it was allocated with (index)
  uint32_t new_rkey = 0;    // low 8 bits: the key the window answers to after the bind
  bool has_mr = false;      // type 1 only: false unbinds
  uint32_t mr_lkey = 0;
  uint64_t addr = 0;        // VA in the region where the window starts
  uint64_t length = 0;
  uint32_t access = 0;      // IBV_ACCESS_* for the window
  bool type1_verb = false;  // posted by ibv_bind_mw (type 1 windows only come this way)
  uint32_t qp_pd = 0;       // the PD of the QP the bind was posted on
  uint32_t qpn = 0;
};

class MwTable {
 public:
  // A new, unbound window of `pd`; returns its rkey. ENOMEM past
  // device::kMaxMw, EINVAL for a type that is neither 1 nor 2.
  Result<uint32_t> Allocate(uint32_t pd, int type);
  // The window goes, bound or not (its rkey stops working at once).
  // EINVAL if there is no such window.
  Status Deallocate(uint32_t rkey);

  // The checks a NIC makes when it executes a bind WQE (the IBA spec's
  // rules as rxe checks them); on success the window answers to
  // new_rkey from now on. A failure's message says which rule was broken;
  // the caller completes the WR with IBV_WC_MW_BIND_ERR.
  Status Bind(const BindRequest& request, const MrTable& mrs);
  // LOCAL_INV or SEND_WITH_INV of `rkey` seen by QP `qpn` of PD `pd`: a
  // bound type 2 window of that PD, bound through that QP, goes back to the
  // unbound state. EINVAL (with why) otherwise; ENOENT if `rkey` names no
  // window at all (it may name a region).
  Status Invalidate(uint32_t rkey, uint32_t pd, uint32_t qpn);

  // The bound window answering to `rkey` as a region view (its pd, range,
  // rights, host memory; bound_qpn set for type 2), or nullptr.
  std::shared_ptr<const Mr> FindByRkey(uint32_t rkey) const;

  // A region is deregistered (or re-registered) only with no window bound
  // to it: BeginDeregister fails with EBUSY if one is, else keeps binds off
  // the region until EndDeregister.
  Status BeginDeregister(uint32_t lkey);
  void EndDeregister(uint32_t lkey);

  size_t size() const;
  // How many windows are bound to the region with this lkey.
  int BoundTo(uint32_t lkey) const;

 private:
  struct Window {
    MwType type = MwType::kType1;
    uint32_t pd = 0;
    uint32_t rkey = 0;       // current key (index << 8 | key)
    bool bound = false;
    uint32_t mr_lkey = 0;    // while bound to a region
    std::shared_ptr<const Mr> view;  // while bound with a non-empty range or zero length
  };
  Window* FindLocked(uint32_t rkey);
  const Window* FindLocked(uint32_t rkey) const;
  void UnbindLocked(Window& w);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Window>> slots_;      // guarded by mu_; index = (rkey & ~kMwKeyBit) >> 8
  std::vector<uint32_t> free_;                      // guarded by mu_
  std::unordered_map<uint32_t, int> bound_to_;      // guarded by mu_: region lkey -> windows bound
  std::unordered_map<uint32_t, int> deregistering_; // guarded by mu_: lkeys being deregistered
  size_t live_ = 0;                                 // guarded by mu_
  uint8_t next_key_ = 0;                            // guarded by mu_
};

}  // namespace rdmaemu::objects
