// A queue pair as the engine sees it: its queues, the attributes the
// transport needs, the CQs it completes into, and the state of its
// requester and responder.
//
// The provider owns state checking (check-then-apply with the IB state
// machine) and pushes the resulting transport attributes here.
//
// Thread safety: everything mutable is guarded by mu. Application threads
// post and modify under it; the engine thread processes a QP's packets and
// timers under it. Constant after construction: qpn, type, pd, cqs, caps,
// handle.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

#include "emulator/engine/congestion.h"
#include "emulator/engine/counters.h"
#include "emulator/engine/tag_list.h"
#include "emulator/engine/work.h"
#include "emulator/engine/wq.h"
#include "emulator/objects/cq.h"
#include "emulator/objects/mr.h"

namespace rdmaemu::engine {

using Clock = std::chrono::steady_clock;

// libibverbs' numbering (enum ibv_qp_type, enum ibv_qp_state). XRC_SEND is
// an RC requester without a responder, XRC_RECV an RC responder without a
// requester that receives into the XRC SRQ each request names.
// RAW_PACKET sends and receives whole Ethernet frames (engine/raw.cc).
enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4, kRawPacket = 8, kXrcSend = 9, kXrcRecv = 10 };
enum class QpState : uint8_t { kReset = 0, kInit, kRtr, kRts, kSqd, kSqe, kErr };
// The transports with acknowledgements, NAKs, a window and retries.
inline bool IsReliable(QpType t) {
  return t == QpType::kRc || t == QpType::kXrcSend || t == QpType::kXrcRecv;
}
inline bool IsXrc(QpType t) { return t == QpType::kXrcSend || t == QpType::kXrcRecv; }
inline const char* QpTypeName(QpType t) {
  switch (t) {
    case QpType::kRc: return "RC";
    case QpType::kUc: return "UC";
    case QpType::kUd: return "UD";
    case QpType::kRawPacket: return "RAW_PACKET";
    case QpType::kXrcSend: return "XRC_SEND";
    case QpType::kXrcRecv: return "XRC_RECV";
  }
  return "?";
}

// enum ibv_mig_state's numbering.
enum class MigState : uint8_t { kMigrated = 0, kRearm, kArmed };

struct QpCaps {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

// What the transport reads; updated by the provider on modify.
struct TransportAttrs {
  QpState state = QpState::kReset;
  uint32_t qkey = 0;
  uint32_t dest_qpn = 0;
  uint32_t path_mtu = 1024;  // bytes
  uint32_t dest_ip = 0;      // network order; RC/UC
  uint8_t traffic_class = 0; // the path's GRH traffic class: the IP TOS byte on RoCE v2
  uint32_t access = 0;       // remote access rights granted (IBV_ACCESS_*)
  uint8_t port = 1;
  uint16_t pkey_index = 0;   // the QP's P_Key: the port's table entry at this index
  uint8_t timeout = 0;       // 4.096 us * 2^timeout; 0 = no timer
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;     // 7 = retry forever
  uint8_t min_rnr_timer = 0;
  uint8_t max_rd_atomic = 1;
  bool sqd_notify = false;   // en_sqd_async_notify: raise SQ_DRAINED once drained
  // The alternate path (RC/UC, path.cc); alt_port 0 = none loaded.
  uint32_t alt_dest_ip = 0;  // network order
  uint8_t alt_traffic_class = 0;
  uint8_t alt_port = 0;
  uint16_t alt_pkey_index = 0;
  uint8_t alt_timeout = 0;
  MigState mig_state = MigState::kMigrated;
};

// A migration: the alternate path becomes the current one, and the old
// current path is kept as the alternate.
inline void SwapPaths(TransportAttrs& t) {
  std::swap(t.dest_ip, t.alt_dest_ip);
  std::swap(t.traffic_class, t.alt_traffic_class);
  std::swap(t.port, t.alt_port);
  std::swap(t.pkey_index, t.alt_pkey_index);
  std::swap(t.timeout, t.alt_timeout);
}

// A send WQE the requester has started: its PSNs and progress.
struct Inflight {
  SendWqe wqe;
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;   // last request PSN, or last read response PSN
  uint32_t next_psn = 0;   // next request PSN to (re)send
  uint32_t packets = 0;    // request packets (1 for read and atomic)
  uint64_t read_bytes = 0; // read response bytes received
  bool sent = false;       // every request packet has gone out at least once
  bool done = false;       // a READ's or atomic's whole response has arrived
  // A READ or atomic asked for again because its response has a gap (or was
  // acknowledged past): further signs of the same gap ask nothing more until
  // a response arrives in sequence or the timer fires.
  bool rerequested = false;
  // A READ or atomic whose local buffer failed its check: it is sent all
  // the same and fails with this status when its response arrives, where a
  // NIC finds it (writing the response); a remote error found first wins.
  objects::WcStatus local_error = objects::WcStatus::kSuccess;
  // A bind or local invalidate that was executed at admission: it has no
  // packets and completes, in order, once every WQE ahead of it has.
  bool local_op = false;
};

// A WQE that failed its local checks at admission (no packets, not a local
// operation): it completes with its error, read_bytes holding the status,
// when it reaches the front.
inline bool FailedAtAdmission(const Inflight& f) { return f.packets == 0 && !f.local_op; }

// Kept by the responder so that a duplicate READ or atomic is answered
// again rather than executed twice (IBA 9.7.5.2.1).
struct ReplayEntry {
  uint32_t psn = 0;
  uint32_t last_psn = 0;
  bool atomic = false;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  uint64_t atomic_result = 0;
};

// A shared receive queue: receive WQEs many QPs draw from, with the limit
// event (SRQ_LIMIT_REACHED, one-shot) of IBA 10.2.9.
struct Srq {
  Srq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint64_t handle)
      : pd(pd), max_sge(max_sge), handle(handle), max_wr(max_wr) {}
  const uint32_t pd;
  const uint32_t max_sge;
  const uint64_t handle;  // the provider's ibv_srq*, for async events

  std::mutex mu;
  std::deque<RecvWqe> rq;  // guarded by mu
  uint32_t max_wr;         // guarded by mu
  uint32_t limit = 0;      // guarded by mu; 0 = not armed
  // Guarded by mu. Set when a receive taken from the SRQ lost its completion
  // to a CQ overrun (SRQ_ERR): the device takes no more WQEs from it.
  bool error = false;

  // An XRC SRQ (set before it is published, constant after): its XRC
  // domain, its number (the XRCETH's), and the CQ its receives complete on
  // (the target QP that received has none).
  uint32_t xrcd = 0;  // 0: a basic SRQ
  uint32_t srqn = 0;
  objects::Cq* cq = nullptr;
  // A tag-matching SRQ's matching list (set before any QP uses it; its
  // contents guarded by mu); nullptr for a basic or XRC SRQ. A TM SRQ has a
  // CQ too (cq above): its list operations and every message received
  // through it complete there.
  std::unique_ptr<TagList> tags;
  // Guarded by mu. Set by Engine::RemoveSrq: the loop thread may hold the
  // SRQ from a lookup made before; it checks this, under mu, before it
  // touches the SRQ's CQ, which may be gone once the destroy has returned.
  bool removed = false;
};

// How a SEND received through a tag-matching SRQ is delivered; decided on
// its first packet from its TMH.
struct TmDelivery {
  enum class Kind : uint8_t {
    kNone,        // not a TM SRQ: an ordinary receive
    kNoTag,       // TMH NO_TAG: whole, into an ordinary receive (TM_NO_TAG)
    kUnexpected,  // no match (or a FIN): whole, into an ordinary receive (TM_RECV)
    kEager,       // matched: the payload after the TMH, into the tag's buffer
    kRndv,        // matched: the RVH names the data, which the device reads
  };
  Kind kind = Kind::kNone;
  uint64_t skip = 0;  // payload bytes still to drop (the TMH) before scattering
  uint64_t tag = 0;
  uint32_t app_ctx = 0;
  // kRndv: the RVH.
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t len = 0;
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
  // Set before the QP is added to the engine, constant after; but an XRC
  // target's is the SRQ of the message it is receiving (guarded by mu),
  // which each request names in its XRCETH.
  std::shared_ptr<Srq> srq;
  // An XRC target's XRC domain (set before it is added, constant after).
  uint32_t xrcd = 0;
  // Bumped by the engine thread, read by anyone (counters.h).
  Counters counters;
  // When the last packet for this QP arrived (steady clock ns; 0: none),
  // for the log line of a QP whose retries ran out.
  std::atomic<int64_t> last_heard_ns{0};
  // A UD or raw packet QP created with an indirection table receives through its WQs
  // (and has no RQ of its own); set before the QP is added, constant after.
  std::shared_ptr<const RwqIndTable> rss;
  RxHashConfig rx_hash;

  std::mutex mu;
  // Set under mu by Engine::RemoveQp (ibv_destroy_qp). The loop thread may
  // have found the QP just before it was unpublished and take mu only after
  // the destroy returned, when its CQs may be gone too: it checks this
  // first, under mu, and leaves the QP alone.
  bool removed = false;
  TransportAttrs attrs;
  std::deque<SendWqe> sq;        // posted, not yet started
  std::deque<RecvWqe> rq;
  uint32_t sq_outstanding = 0;   // posted and not yet completed

  // Requester and completer.
  uint32_t next_send_psn = 0;    // the PSN the next new request gets
  uint32_t last_acked_psn = 0;   // the newest PSN the responder acknowledged
  CongestionWindow cwnd;         // how far past last_acked_psn requests may go
  std::deque<Inflight> inflight; // started, not yet completed, in PSN order
  uint8_t retries_left = 0;
  uint8_t rnr_retries_left = 0;
  // Transport timeouts since the last progress: each doubles the software
  // floor under the next timer (StartTimer), so a peer that is merely
  // descheduled is not given up on after retry_cnt very short timers.
  uint8_t timeouts_in_row = 0;
  Clock::time_point timeout_at{};  // valid while inflight is not empty
  Clock::time_point last_request_at{};  // when Progress last sent a request packet
  Clock::time_point rnr_until{};   // sending paused after an RNR NAK until then
  bool rnr_waiting = false;
  // The PSN a sequence-error NAK last sent us back to, while no ACK has
  // moved us past it: the responder NAKs a gap once, so another NAK for the
  // same PSN is a duplicate (or stale) and must not cost a retry or a
  // second go-back-N (rxe's started_retry).
  bool nak_retry_pending = false;
  uint32_t nak_retry_psn = 0;

  bool comm_est = false;         // COMM_EST raised since the QP entered RTR
  // SQD: set by the modify to SQD, cleared by the engine once every started
  // WQE has completed (IBA 10.3.1.3, ibv_qp_attr.sq_draining).
  bool sq_draining = false;
  // WQEs posted before the modify to SQD: their doorbell was rung, so they
  // count as started (a NIC has fetched them) and are still admitted.
  size_t sqd_admit = 0;
  // Paths swapped so far (by the engine or a forced migration); the provider
  // swaps its copy of the attributes to match.
  uint32_t migrations = 0;

  // Responder.
  uint32_t epsn = 0;             // expected request PSN
  uint32_t msn = 0;              // message sequence number
  bool nak_sent = false;         // one NAK (sequence error or RNR) per gap
  bool uc_resync = false;        // UC: drop until the next FIRST or ONLY
  bool in_send = false;          // a multi-packet SEND is being received
  RecvWqe recv;                  // its receive WQE
  uint64_t recv_offset = 0;
  // A SEND into a tag-matching SRQ: what the TMH decided (tag_matching.cc).
  TmDelivery tm;
  // ACK coalescing (Engine::HoldAck): an ACK held back to leave right behind
  // the QP's next request, in the same UDP GSO send, so that a program
  // answering each message (a ping-pong) costs its peer one datagram and
  // one receive per message, not two. The psn and msn are the ACK's.
  bool ack_held = false;
  bool ack_hold_listed = false;  // in Engine::held_acks_
  uint32_t held_ack_psn = 0;
  uint32_t held_ack_msn = 0;
  Clock::time_point held_ack_until{};
  // Messages in a row that alternated between received (an ACK due) and
  // sent (Progress): a QP holds only in a sustained ping-pong
  // (kAckHoldAfter). A short exchange, such as a connection's setup
  // messages, takes each ACK ahead of the answer, as a NIC does; perftest's
  // rdma_cm exchange receives the answer into the buffer it sent from.
  uint32_t alternations = 0;
  bool last_was_receive = false;
  // A held ACK that had to leave alone at held_ack_until: no more holds
  // until then (the program does not answer each message).
  Clock::time_point ack_hold_off_until{};
  bool in_write = false;         // a multi-packet WRITE is being received
  std::shared_ptr<const objects::Mr> write_mr;
  uint64_t write_va = 0;
  uint64_t write_left = 0;
  uint64_t write_length = 0;
  std::deque<ReplayEntry> replay;
};

}  // namespace rdmaemu::engine
