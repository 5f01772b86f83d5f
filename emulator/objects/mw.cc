#include "emulator/objects/mw.h"

#include <fmt/format.h>

#include "emulator/device/attributes.h"

namespace rdmaemu::objects {
namespace {

// The rights a window can carry. IBV_ACCESS_LOCAL_WRITE means nothing for a
// window (nobody writes locally through an rkey), and rdma-core's own test
// binds windows with it: accepted and dropped, as mlx5 does.
constexpr uint32_t kWindowAccess = kRemoteAccessMask | kZeroBased | kLocalWrite;

uint32_t IndexOf(uint32_t rkey) { return ((rkey & ~kMwKeyBit) >> 8) - 1; }

}  // namespace

Result<uint32_t> MwTable::Allocate(uint32_t pd, int type) {
  if (type != static_cast<int>(MwType::kType1) && type != static_cast<int>(MwType::kType2)) {
    return InvalidArgument(fmt::format("memory window type {} does not exist (IBV_MW_TYPE_1 or "
                                       "IBV_MW_TYPE_2)",
                                       type));
  }
  std::lock_guard lock(mu_);
  if (live_ >= static_cast<size_t>(device::kMaxMw)) {
    return NoMemory(fmt::format("the device's {} memory windows are all in use", device::kMaxMw));
  }
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  auto w = std::make_unique<Window>();
  w->type = static_cast<MwType>(type);
  w->pd = pd;
  // A slot used again starts from another key, so an rkey of the window
  // that had it before does not work for the new one.
  w->rkey = kMwKeyBit | ((index + 1) << 8) | next_key_;
  next_key_ = static_cast<uint8_t>(next_key_ + 0x35);
  const uint32_t rkey = w->rkey;
  slots_[index] = std::move(w);
  ++live_;
  return rkey;
}

MwTable::Window* MwTable::FindLocked(uint32_t rkey) {
  if (!IsWindowKey(rkey) || ((rkey & ~kMwKeyBit) >> 8) == 0) return nullptr;
  const uint32_t index = IndexOf(rkey);
  if (index >= slots_.size()) return nullptr;
  return slots_[index].get();
}

const MwTable::Window* MwTable::FindLocked(uint32_t rkey) const {
  return const_cast<MwTable*>(this)->FindLocked(rkey);
}

void MwTable::UnbindLocked(Window& w) {
  if (w.bound && w.mr_lkey != 0) {
    auto it = bound_to_.find(w.mr_lkey);
    if (it != bound_to_.end() && --it->second == 0) bound_to_.erase(it);
  }
  w.bound = false;
  w.mr_lkey = 0;
  w.view.reset();
}

Status MwTable::Deallocate(uint32_t rkey) {
  std::lock_guard lock(mu_);
  Window* w = FindLocked(rkey);
  if (w == nullptr) return InvalidArgument(fmt::format("no memory window with rkey {:#x}", rkey));
  UnbindLocked(*w);
  slots_[IndexOf(rkey)].reset();
  free_.push_back(IndexOf(rkey));
  --live_;
  return Status::Ok();
}

Status MwTable::Bind(const BindRequest& r, const MrTable& mrs) {
  std::lock_guard lock(mu_);
  Window* w = FindLocked(r.mw_rkey);
  if (w == nullptr) {
    return InvalidArgument(fmt::format("the window (rkey {:#x}) no longer exists", r.mw_rkey));
  }
  const bool type2 = w->type == MwType::kType2;
  if (!type2 && !r.type1_verb) {
    return InvalidArgument("a type 1 window is bound with ibv_bind_mw, not with a posted bind WR");
  }
  if (type2 && r.type1_verb) {
    return InvalidArgument("a type 2 window is bound with a posted IBV_WR_BIND_MW, not ibv_bind_mw");
  }
  if (w->pd != r.qp_pd) {
    return InvalidArgument("the QP the bind was posted on is of another PD than the window");
  }
  if ((r.new_rkey & ~0xffu) != (w->rkey & ~0xffu)) {
    return InvalidArgument(fmt::format("the new rkey {:#x} is not this window's: only its low 8 bits "
                                       "are the program's to choose (the window's rkey is {:#x})",
                                       r.new_rkey, w->rkey));
  }
  if (type2 && w->bound) {
    return InvalidArgument(fmt::format("the type 2 window is bound already (rkey {:#x}): invalidate "
                                       "it first (IBV_WR_LOCAL_INV or a SEND with invalidate)",
                                       w->rkey));
  }
  if (type2 && (!r.has_mr || r.length == 0)) {
    return InvalidArgument("a type 2 window is bound to a region with a non-zero length (to unbind "
                           "it, invalidate it)");
  }
  std::shared_ptr<const Mr> mr;
  if (r.has_mr) {
    if (r.access & ~kWindowAccess) {
      return InvalidArgument(fmt::format("access flags {:#x} cannot be given to a window (remote "
                                         "read, write, atomic and zero-based can)",
                                         r.access & ~kWindowAccess));
    }
    if (!type2 && (r.access & kZeroBased)) {
      return InvalidArgument("a type 1 window cannot be zero-based");
    }
    mr = mrs.FindByLkey(r.mr_lkey);
    if (!mr) return InvalidArgument(fmt::format("no memory region has lkey {:#x}", r.mr_lkey));
    if (deregistering_.count(r.mr_lkey)) {
      return InvalidArgument(fmt::format("the region (lkey {:#x}) is being deregistered", r.mr_lkey));
    }
    if (mr->pd != w->pd) return InvalidArgument("the region is of another PD than the window");
    if (!(mr->access & kMwBind)) {
      return InvalidArgument("the region was registered without IBV_ACCESS_MW_BIND");
    }
    if (mr->access & kZeroBased) {
      return InvalidArgument("the region is zero-based (IBV_ACCESS_ZERO_BASED): windows bind only "
                             "to regions addressed by virtual address");
    }
    if ((r.access & (kRemoteWrite | kRemoteAtomic)) && !(mr->access & kLocalWrite)) {
      return InvalidArgument("remote write or atomic access through a window needs "
                             "IBV_ACCESS_LOCAL_WRITE on its region");
    }
    if (!mr->Contains(r.addr, r.length)) {
      return InvalidArgument(fmt::format("[{:#x}, +{}) is not inside the region [{:#x}, +{})", r.addr,
                                         r.length, mr->iova, mr->length));
    }
  } else if (r.addr != 0 || r.length != 0) {
    return InvalidArgument("an unbind (no region) must have address and length 0");
  }

  UnbindLocked(*w);
  w->rkey = r.new_rkey;
  if (mr) {
    auto view = std::make_shared<Mr>();
    view->pd = w->pd;
    view->rkey = r.new_rkey;
    view->iova = (r.access & kZeroBased) ? 0 : r.addr;
    view->addr = mr->HostAddress(r.addr);
    view->length = r.length;
    // A window over an on-demand region faults its pages in as the region would.
    view->access = (r.access & (kRemoteAccessMask | kZeroBased)) | (mr->access & kOnDemand);
    view->bound_qpn = type2 ? r.qpn : 0;
    w->view = std::move(view);
    w->bound = true;
    w->mr_lkey = r.mr_lkey;
    ++bound_to_[r.mr_lkey];
  }
  return Status::Ok();
}

Status MwTable::Invalidate(uint32_t rkey, uint32_t pd, uint32_t qpn) {
  std::lock_guard lock(mu_);
  Window* w = FindLocked(rkey);
  if (w == nullptr) return NotFound(fmt::format("no memory window has rkey {:#x}", rkey));
  if (w->type == MwType::kType1) {
    return InvalidArgument(fmt::format("rkey {:#x} is a type 1 window's: those are not invalidated; "
                                       "bind it again with length 0 (ibv_bind_mw)",
                                       rkey));
  }
  if (!w->bound) return InvalidArgument(fmt::format("the window of rkey {:#x} is not bound", rkey));
  if (w->rkey != rkey) {
    return InvalidArgument(fmt::format("rkey {:#x} is stale: the window answers to {:#x}", rkey, w->rkey));
  }
  if (w->pd != pd) return InvalidArgument("the window is of another PD than the QP");
  if (qpn != 0 && w->view && w->view->bound_qpn != qpn) {
    return InvalidArgument(fmt::format("the window was bound through qp#{}, not this QP",
                                       w->view->bound_qpn));
  }
  UnbindLocked(*w);
  return Status::Ok();
}

std::shared_ptr<const Mr> MwTable::FindByRkey(uint32_t rkey) const {
  std::lock_guard lock(mu_);
  const Window* w = FindLocked(rkey);
  if (w == nullptr || !w->bound || w->rkey != rkey) return nullptr;
  return w->view;
}

Status MwTable::BeginDeregister(uint32_t lkey) {
  std::lock_guard lock(mu_);
  if (auto it = bound_to_.find(lkey); it != bound_to_.end() && it->second > 0) {
    return Busy(fmt::format("{} memory window(s) are bound to the region; invalidate, rebind or "
                            "deallocate them first",
                            it->second));
  }
  ++deregistering_[lkey];
  return Status::Ok();
}

void MwTable::EndDeregister(uint32_t lkey) {
  std::lock_guard lock(mu_);
  if (auto it = deregistering_.find(lkey); it != deregistering_.end() && --it->second == 0) {
    deregistering_.erase(it);
  }
}

size_t MwTable::size() const {
  std::lock_guard lock(mu_);
  return live_;
}

int MwTable::BoundTo(uint32_t lkey) const {
  std::lock_guard lock(mu_);
  auto it = bound_to_.find(lkey);
  return it == bound_to_.end() ? 0 : it->second;
}

}  // namespace rdmaemu::objects
