// The matching list of a tag-matching SRQ (IBV_SRQT_TM), and its phase
// counter, as a ConnectX keeps them (rdma-core's ibv_post_srq_ops(3)).
//
// Tagged buffers are added by the application (IBV_WR_TAG_ADD), each named
// by a handle, and removed by it (IBV_WR_TAG_DEL) or consumed by a matching
// message. An incoming tag matches the oldest buffer whose masked tag equals
// it: (msg_tag & mask) == (tag & mask).
//
// Phase synchronisation: a message that matches nothing is "unexpected" and
// the device counts it. From then on the device does not match until the
// software says it has handled every unexpected message (a sync reporting
// the device's count): until then the software might post a tag for a
// message it has not yet seen, and a match would deliver that message twice.
//
// Thread safety: none of its own; the SRQ's mu guards it (engine::Srq).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/engine/work.h"

namespace rdmaemu::engine {

struct TaggedBuffer {
  uint64_t tag = 0;
  uint64_t mask = 0;
  uint64_t recv_wr_id = 0;  // the wr_id of the message's completions
  std::vector<Sge> sges;
  uint64_t length = 0;  // sum of the SGE lengths
};

class TagList {
 public:
  explicit TagList(uint32_t capacity);

  uint32_t capacity() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t size() const { return posted_; }

  // Adds a buffer; its handle (never 0). ENOMEM when `capacity` are posted.
  Result<uint32_t> Add(TaggedBuffer buffer);
  // Removes the buffer `handle` names; ENOENT if it names none posted (never
  // given, removed already, or consumed by a message).
  Status Remove(uint32_t handle);
  // The oldest posted buffer `tag` matches, taken off the list; nothing
  // when none does or matching is suspended (matching()).
  std::optional<TaggedBuffer> Match(uint64_t tag);

  // Phase counting. `unexpected()` is the device's count (16 bits on a
  // ConnectX, wrapping; here 32); the list matches only while the software
  // has acknowledged all of them.
  uint32_t unexpected() const { return unexpected_; }
  uint32_t acknowledged() const { return acknowledged_; }
  bool matching() const { return acknowledged_ == unexpected_; }
  void CountUnexpected() { ++unexpected_; }
  // The software reports `count` handled unexpected messages (an op with
  // IBV_OPS_TM_SYNC). A count other than the device's changes nothing: it
  // is stale (more arrived since), and matching stays suspended. True if
  // the list is in sync afterwards.
  bool Sync(uint32_t count);

 private:
  struct Slot {
    bool posted = false;
    uint64_t order = 0;  // posting order: smaller is older
    TaggedBuffer buffer;
  };
  std::vector<Slot> slots_;  // handle h is slots_[h - 1]
  uint32_t posted_ = 0;
  uint64_t next_order_ = 0;
  uint32_t unexpected_ = 0;
  uint32_t acknowledged_ = 0;
};

}  // namespace rdmaemu::engine
