// Work queues (WQs, IBV_WQT_RQ) and receive indirection tables, as the
// engine sees them.
//
// A WQ is a receive queue that exists on its own: it has its own PD, CQ and
// state (RESET, RDY, ERR), and QPs reach it only through an indirection
// table. A UD QP created with a table and an RX hash configuration steers
// each incoming message to one WQ of the table by a Toeplitz hash of the
// packet's selected IPv4/UDP fields (rss.h), and the receive completes on
// that WQ's CQ.
//
// Thread safety: a WQ's mutable state is guarded by its mu. The provider
// posts and modifies under it; the engine takes WQEs under it, holding the
// receiving QP's mu first (lock order: Qp::mu, then Wq::mu). Constant after
// construction: everything but state and rq.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "emulator/engine/work.h"
#include "emulator/objects/cq.h"

namespace rdmaemu::engine {

// libibverbs' numbering (enum ibv_wq_state).
enum class WqState : uint8_t { kReset = 0, kRdy = 1, kErr = 2 };

struct Wq {
  Wq(uint32_t wqn, uint32_t pd, objects::Cq* cq, uint32_t max_wr, uint32_t max_sge, uint64_t handle)
      : wqn(wqn), pd(pd), cq(cq), max_wr(max_wr), max_sge(max_sge), handle(handle) {}

  const uint32_t wqn;     // wq_num, from the device's QP number space
  const uint32_t pd;
  objects::Cq* const cq;
  const uint32_t max_wr;
  const uint32_t max_sge;
  const uint64_t handle;  // the provider's ibv_wq*, for WQ_FATAL

  std::mutex mu;
  WqState state = WqState::kReset;  // guarded by mu
  std::deque<RecvWqe> rq;           // guarded by mu
};

// With wq.mu held: takes every WQE out of the WQ and appends its WR_FLUSH_ERR
// completion (on the WQ's CQ, qp_num = wq_num) to `out`.
void FlushWqLocked(Wq& wq, std::vector<objects::Cqe>& out);

// The RX hash configuration of a QP (ibv_rx_hash_conf), already validated.
struct RxHashConfig {
  uint64_t fields = 0;            // IBV_RX_HASH_* bits: IPv4 and UDP ports only
  std::vector<uint8_t> key;       // the Toeplitz key (40 bytes)
};

// A receive indirection table: 2^log_size entries, each a WQ. Immutable
// after creation; QPs share it.
struct RwqIndTable {
  std::vector<std::shared_ptr<Wq>> entries;
};

}  // namespace rdmaemu::engine
