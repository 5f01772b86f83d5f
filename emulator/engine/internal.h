// Helpers shared by the engine's source files.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "emulator/engine/qp.h"
#include "emulator/engine/work.h"
#include "emulator/objects/cq.h"
#include "emulator/wire/opcode.h"

namespace rdmaemu::engine {

// The retransmission timer for an IBA timeout exponent (requester.cc).
Clock::duration TransportTimeout(uint8_t timeout);
// (Re)starts the QP's retransmission timer from the current time (requester.cc).
void StartTimer(Qp& qp);
objects::WcOpcode CompletionOpcode(SendOp op);
// With qp.mu held: takes every WQE out of the QP and appends its flush
// completion to `out` (to be pushed after).
void FlushLocked(Qp& qp, std::vector<std::pair<objects::Cq*, objects::Cqe>>& out);

// Tag matching (tag_matching.cc): a message matched a tagged buffer (its
// receive is that buffer, not an ordinary WQE).
inline bool IsMatched(const TmDelivery& tm) {
  return tm.kind == TmDelivery::Kind::kEager || tm.kind == TmDelivery::Kind::kRndv;
}
// The completion of a rendezvous READ that was flushed (the QP went to ERR).
objects::Cqe FlushedRndv(const Qp& qp, const SendWqe& read);

// The opcode byte of an RC opcode on the QP's transport (UC = RC + 0x20,
// XRC = RC + 0xA0).
inline wire::Opcode OnTransport(QpType type, wire::Opcode rc) {
  if (type == QpType::kUc) return wire::WithPrefix(rc, wire::kUcPrefix);
  if (IsXrc(type)) return wire::WithPrefix(rc, wire::kXrcPrefix);
  return rc;
}

}  // namespace rdmaemu::engine
