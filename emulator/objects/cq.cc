#include "emulator/objects/cq.h"

#include <fmt/format.h>

#include <new>

#include "emulator/device/clock.h"

namespace rdmaemu::objects {

Cq::Cq(uint32_t capacity, Notifier notifier, uint64_t handle, uint32_t stamps,
       std::pmr::memory_resource* memory)
    : ring_(capacity, memory), notifier_(std::move(notifier)), handle_(handle), stamps_(stamps) {}

bool Cq::TakeOverrunNotice() {
  std::lock_guard lock(mu_);
  if (!overrun_ || overrun_noticed_) return false;
  overrun_noticed_ = true;
  return true;
}

uint32_t Cq::capacity() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(ring_.size());
}

bool Cq::Push(const Cqe& cqe) {
  // Read before the lock, so a poller waiting on it does not wait for a
  // clock read too.
  const uint64_t core = (stamps_ & kStampCoreClock) ? device::CoreClockNow() : 0;
  const uint64_t wall = (stamps_ & kStampWallclock) ? device::WallclockNowNs() : 0;
  if (observer_) observer_(cqe);
  bool notify = false;
  {
    std::lock_guard lock(mu_);
    if (overrun_ || tail_ - head_ == ring_.size()) {
      overrun_ = true;
      return false;
    }
    Cqe& slot = ring_[tail_ % ring_.size()];
    slot = cqe;
    slot.timestamp = core;
    slot.wallclock_ns = wall;
    ++tail_;
    if (arm_ == ArmState::kNextCompletion ||
        (arm_ == ArmState::kSolicited && (cqe.solicited || cqe.status != WcStatus::kSuccess))) {
      arm_ = ArmState::kDisarmed;
      notify = true;
    }
  }
  if (notify && notifier_) notifier_();
  return true;
}

int Cq::Poll(int max, Cqe* out) {
  std::lock_guard lock(mu_);
  int n = 0;
  while (n < max && head_ != tail_) {
    out[n++] = ring_[head_ % ring_.size()];
    ++head_;
  }
  return n;
}

bool Cq::Peek(Cqe* out) {
  std::lock_guard lock(mu_);
  if (head_ == tail_) return false;
  *out = ring_[head_ % ring_.size()];
  peeked_ = true;
  return true;
}

void Cq::Pop() {
  std::lock_guard lock(mu_);
  if (peeked_ && head_ != tail_) ++head_;
  peeked_ = false;
}

void Cq::Arm(bool solicited_only) {
  std::lock_guard lock(mu_);
  // Arming for "next completion" upgrades a solicited-only arm, never the reverse.
  if (!solicited_only) {
    arm_ = ArmState::kNextCompletion;
  } else if (arm_ == ArmState::kDisarmed) {
    arm_ = ArmState::kSolicited;
  }
}

Status Cq::Resize(uint32_t new_capacity) {
  std::lock_guard lock(mu_);
  uint64_t queued = tail_ - head_;
  if (new_capacity < queued) {
    return InvalidArgument(fmt::format("cannot resize to {} CQEs: {} completions are still queued",
                                       new_capacity, queued));
  }
  std::pmr::vector<Cqe> fresh(ring_.get_allocator());
  try {
    fresh.resize(new_capacity);
  } catch (const std::bad_alloc&) {
    return NoMemory(fmt::format("no memory for a ring of {} CQEs", new_capacity));
  }
  for (uint64_t i = 0; i < queued; ++i) fresh[i] = ring_[(head_ + i) % ring_.size()];
  ring_ = std::move(fresh);
  head_ = 0;
  tail_ = queued;
  return Status::Ok();
}

size_t Cq::RemoveQp(uint32_t qp_num) {
  std::lock_guard lock(mu_);
  uint64_t kept = head_;
  if (head_ != tail_ && ring_[head_ % ring_.size()].qp_num == qp_num) peeked_ = false;
  for (uint64_t at = head_; at != tail_; ++at) {
    const Cqe& c = ring_[at % ring_.size()];
    if (c.qp_num == qp_num) continue;
    if (kept != at) ring_[kept % ring_.size()] = c;
    ++kept;
  }
  const size_t removed = tail_ - kept;
  tail_ = kept;
  return removed;
}

bool Cq::armed() const {
  std::lock_guard lock(mu_);
  return arm_ != ArmState::kDisarmed;
}

bool Cq::overrun() const {
  std::lock_guard lock(mu_);
  return overrun_;
}

size_t Cq::depth() const {
  std::lock_guard lock(mu_);
  return tail_ - head_;
}

}  // namespace rdmaemu::objects
