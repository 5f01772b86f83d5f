#include "emulator/objects/directory.h"

#include <mutex>

#include <fmt/format.h>

namespace rdmaemu::objects {

namespace {
// Numbers stay within 24 bits, like QPNs, so every kind prints alike.
constexpr uint32_t kMaxNumber = 0xffffff;
}  // namespace

std::string_view ToString(ObjectKind kind) {
  switch (kind) {
    case ObjectKind::kQp: return "qp";
    case ObjectKind::kCq: return "cq";
    case ObjectKind::kSrq: return "srq";
    case ObjectKind::kWq: return "wq";
  }
  return "object";
}

Result<uint32_t> Directory::Add(ObjectKind kind, uint64_t handle, Describe describe,
                                std::optional<uint32_t> number) {
  std::unique_lock lock(mu_);
  uint32_t n;
  if (number) {
    n = *number;
    if (entries_.count({kind, n}) != 0) {
      return Status::Error(EEXIST, fmt::format("{} {} is already registered", ToString(kind), n));
    }
  } else {
    // The next number of this kind not in use, wrapping within 24 bits.
    uint32_t& next = next_[static_cast<int>(kind)];
    for (uint32_t tries = 0;; ++tries) {
      if (tries == kMaxNumber) return NoMemory(fmt::format("every {} number is in use", ToString(kind)));
      n = next;
      next = next == kMaxNumber ? 1 : next + 1;
      if (entries_.count({kind, n}) == 0) break;
    }
  }
  entries_.emplace(Key{kind, n}, Entry{handle, std::move(describe)});
  return n;
}

void Directory::Remove(ObjectKind kind, uint32_t number) {
  std::unique_lock lock(mu_);  // waits for With() and List() in progress
  entries_.erase({kind, number});
}

Status Directory::With(ObjectKind kind, uint32_t number,
                       const std::function<void(uint64_t handle)>& fn) const {
  std::shared_lock lock(mu_);
  auto it = entries_.find({kind, number});
  if (it == entries_.end()) return NotFound(fmt::format("no {} {}", ToString(kind), number));
  fn(it->second.handle);
  return Status::Ok();
}

std::vector<ObjectInfo> Directory::List() const {
  std::shared_lock lock(mu_);
  std::vector<ObjectInfo> out;
  out.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) {
    out.push_back({key.first, key.second, entry.describe ? entry.describe() : std::string()});
  }
  return out;
}

}  // namespace rdmaemu::objects
