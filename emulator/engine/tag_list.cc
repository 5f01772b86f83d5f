#include "emulator/engine/tag_list.h"

#include <fmt/format.h>

namespace rdmaemu::engine {

TagList::TagList(uint32_t capacity) : slots_(capacity) {}

Result<uint32_t> TagList::Add(TaggedBuffer buffer) {
  if (posted_ == slots_.size()) {
    return NoMemory(fmt::format("the matching list holds its {} tags (max_num_tags)", slots_.size()));
  }
  // The lowest free slot: handles stay small and are reused, as a NIC's
  // list indexes are.
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.posted) continue;
    s.posted = true;
    s.order = next_order_++;
    s.buffer = std::move(buffer);
    ++posted_;
    return static_cast<uint32_t>(i + 1);
  }
  return NoMemory("no free slot");  // unreachable: posted_ < size
}

Status TagList::Remove(uint32_t handle) {
  if (handle == 0 || handle > slots_.size() || !slots_[handle - 1].posted) {
    return NotFound(fmt::format("handle {} names no posted tag (never returned by IBV_WR_TAG_ADD, "
                                "deleted already, or consumed by a message)",
                                handle));
  }
  Slot& s = slots_[handle - 1];
  s.posted = false;
  s.buffer = TaggedBuffer{};
  --posted_;
  return Status::Ok();
}

std::optional<TaggedBuffer> TagList::Match(uint64_t tag) {
  if (!matching()) return std::nullopt;
  Slot* oldest = nullptr;
  for (Slot& s : slots_) {
    if (!s.posted || (tag & s.buffer.mask) != (s.buffer.tag & s.buffer.mask)) continue;
    if (oldest == nullptr || s.order < oldest->order) oldest = &s;
  }
  if (oldest == nullptr) return std::nullopt;
  TaggedBuffer out = std::move(oldest->buffer);
  oldest->buffer = TaggedBuffer{};
  oldest->posted = false;
  --posted_;
  return out;
}

bool TagList::Sync(uint32_t count) {
  if (count == unexpected_) acknowledged_ = count;
  return matching();
}

}  // namespace rdmaemu::engine
