// A queue pair as the engine sees it: its queues, the attributes the
// transport needs, and the CQs it completes into.
//
// The provider owns state checking (check-then-apply with the IB state
// machine) and pushes the resulting transport attributes here.
//
// Thread safety: application threads post under mu_; the engine thread
// takes work under mu_. Constant after construction: qpn, type, pd, cqs,
// caps, handle.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>

#include "emulator/engine/work.h"
#include "emulator/objects/cq.h"

namespace rdmaemu::engine {

// libibverbs' numbering (enum ibv_qp_type, enum ibv_qp_state).
enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4 };
enum class QpState : uint8_t { kReset = 0, kInit, kRtr, kRts, kSqd, kSqe, kErr };

struct QpCaps {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

// What the transport reads; updated as a whole by the provider.
struct TransportAttrs {
  QpState state = QpState::kReset;
  uint32_t qkey = 0;
  uint32_t sq_psn = 0;
  uint32_t rq_psn = 0;
  uint32_t dest_qpn = 0;
  uint32_t path_mtu = 1024;  // bytes
  uint32_t dest_ip = 0;      // network order; RC/UC
  uint32_t access = 0;       // remote access rights granted (IBV_ACCESS_*)
  uint8_t port = 1;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  uint8_t min_rnr_timer = 0;
};

struct Qp {
  Qp(uint32_t qpn, QpType type, uint32_t pd, objects::Cq* send_cq, objects::Cq* recv_cq,
     QpCaps caps, uint64_t handle)
      : qpn(qpn), type(type), pd(pd), send_cq(send_cq), recv_cq(recv_cq), caps(caps),
        handle(handle) {}

  const uint32_t qpn;
  const QpType type;
  const uint32_t pd;
  objects::Cq* const send_cq;
  objects::Cq* const recv_cq;
  const QpCaps caps;
  const uint64_t handle;  // the provider's ibv_qp*, for async events

  std::mutex mu;
  TransportAttrs attrs;           // guarded by mu
  std::deque<SendWqe> sq;         // guarded by mu; posted, not yet executed
  std::deque<RecvWqe> rq;         // guarded by mu
  uint32_t sq_outstanding = 0;    // guarded by mu; posted and not yet completed
  uint32_t next_send_psn = 0;     // engine thread
};

}  // namespace rdmaemu::engine
