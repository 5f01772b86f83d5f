// The requester: posted WQEs become request packets.
//
// Each started WQE is an Inflight entry with its PSN range. Sending walks
// the entries in order and emits every request packet from its cursor
// (next_psn) on; retransmission only moves cursors back (go-back-N), so a
// retransmitted packet is rebuilt from the WQE exactly as it first went out.
#include <arpa/inet.h>

#include <algorithm>

#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/engine/internal.h"
#include "emulator/engine/trace.h"
#include "emulator/wire/psn.h"

namespace rdmaemu::engine {
namespace {

// Long messages ask for an ACK every kPacketsPerAck packets (as rxe does),
// and the packet at the edge of the congestion window asks for one too, so
// the window slides within a message.
constexpr uint32_t kPacketsPerAck = 64;

// Whether a request with this PSN fits the QP's congestion window.
bool InWindow(const Qp& qp, uint32_t psn) {
  return wire::PsnDiff(psn, qp.last_acked_psn) <= static_cast<int32_t>(qp.cwnd.size());
}

uint32_t PacketCount(uint64_t length, uint32_t mtu) {
  return length == 0 ? 1 : static_cast<uint32_t>((length + mtu - 1) / mtu);
}

// The last PSN of the request packets (a read, an atomic or a placement
// operation is one request).
uint32_t LastRequestPsn(const Inflight& f) {
  return UsesResponderResource(f.wqe.op) ? f.first_psn : f.last_psn;
}

// Whether a held ACK may leave right behind what Progress sends now, in the
// same GSO send (BuildGso: every segment but the last as long as the
// first): one request packet, no shorter than the ACK, or none at all (the
// hold goes on). Anything else, and it leaves first, as without the hold.
// Either way the peer never takes in the request without the ACK ahead of
// it: it handles a batch's responses first (Engine::OnDatagrams).
bool AckRidesBehind(const Qp& qp) {
  const Inflight* one = nullptr;
  for (const Inflight& f : qp.inflight) {
    if (f.local_op) continue;
    if (f.packets == 0) break;
    if (wire::PsnDiff(LastRequestPsn(f), f.next_psn) < 0) continue;
    if (one != nullptr || f.next_psn != LastRequestPsn(f)) return false;
    one = &f;
  }
  if (one == nullptr || !InWindow(qp, one->next_psn)) return true;
  // A SEND of no bytes, 16 bytes with its ICRC, is the one request shorter
  // than an ACK (20).
  return !(one->wqe.op == SendOp::kSend && one->wqe.length == 0);
}

}  // namespace

Clock::duration TransportTimeout(uint8_t timeout) {
  // 4.096 us * 2^timeout (IBA 9.7.6.1.3).
  return std::chrono::nanoseconds(static_cast<int64_t>(4096.0 * static_cast<double>(uint64_t{1} << timeout)));
}

void StartTimer(Qp& qp) {
  // Clock::now(), not the caller's `now`: that was read once for a whole
  // loop pass or datagram batch, and on a loaded machine the engine thread
  // can be descheduled for milliseconds after reading it, so a timer started
  // from it expired early (a retransmission 0.8 ms after a post, against a
  // 5 ms timer).
  //
  // The timer is the QP's timeout, as on hardware, but never below a floor
  // for a software peer: 5 ms, doubling over consecutive timeouts without
  // progress up to 40 ms. A peer that is slow because its process is not
  // running has lost nothing, and retry_cnt timers of a few microseconds
  // all expire in one scheduling stall (7 x 5 ms did on a loaded machine).
  // The floor only ever raises short timeouts: from timeout 14 (67 ms, the
  // usual value) up, RETRY_EXC_ERR comes after (retry_cnt + 1) timeouts as
  // on a NIC.
  constexpr uint8_t kMaxFloorDoublings = 3;
  const auto floor = std::chrono::milliseconds(5) * (1 << std::min(qp.timeouts_in_row, kMaxFloorDoublings));
  qp.timeout_at = Clock::now() + std::max<Clock::duration>(TransportTimeout(qp.attrs.timeout), floor);
}

void Engine::Progress(Qp& qp, Clock::time_point now) {
  // In SQD the requester starts no new WQE but finishes those it started
  // (IBA 10.3.1.3: "drained" once all of them are acknowledged).
  const bool draining = qp.attrs.state == QpState::kSqd;
  if (qp.attrs.state != QpState::kRts && !draining) return;
  if (qp.type == QpType::kUd || qp.type == QpType::kRawPacket) {
    // Datagrams: each WQE is sent, and completes, as it is started.
    while (!qp.sq.empty() && (!draining || qp.sqd_admit > 0)) {
      if (draining) --qp.sqd_admit;
      SendWqe w = std::move(qp.sq.front());
      qp.sq.pop_front();
      if (qp.type == QpType::kUd) {
        ExecuteUdSend(qp, w);
      } else {
        ExecuteRawSend(qp, w);
      }
    }
    CheckDrained(qp);
    return;
  }
  MigrateIfPortDown(qp);
  if (qp.rnr_waiting) {
    if (now < qp.rnr_until) {
      Activate(qp);
      return;
    }
    qp.rnr_waiting = false;
  }
  if (!draining) {
    AdmitWqes(qp, qp.sq.size());
  } else if (qp.sqd_admit > 0) {
    qp.sqd_admit -= AdmitWqes(qp, qp.sqd_admit);
  }
  if (qp.ack_held && !AckRidesBehind(qp)) FlushHeldAck(qp);
  bool sent = false;
  for (Inflight& f : qp.inflight) {
    if (f.local_op) continue;  // executed at admission; nothing to send
    if (f.packets == 0) break;  // a WQE that failed locally: nothing after it goes out
    const uint32_t last = LastRequestPsn(f);
    while (wire::PsnDiff(f.next_psn, last) <= 0) {
      if (IsReliable(qp.type) && !InWindow(qp, f.next_psn)) break;
      SendRequest(qp, f, f.next_psn);
      sent = true;
      f.next_psn = wire::PsnNext(f.next_psn);
    }
    if (wire::PsnDiff(f.next_psn, last) <= 0) break;  // the window is full
    f.sent = true;
  }
  if (sent) {
    qp.last_request_at = now;
    qp.alternations = qp.last_was_receive ? qp.alternations + 1 : 0;
    qp.last_was_receive = false;
    FlushHeldAck(qp);
  }
  // UC has no acknowledgements: a message is complete once sent.
  if (qp.type == QpType::kUc) {
    while (!qp.inflight.empty() && qp.inflight.front().sent) {
      const Inflight& f = qp.inflight.front();
      if (FailedAtAdmission(f)) {
        FailQp(qp, static_cast<objects::WcStatus>(f.read_bytes), "a work request failed locally");
        return;
      }
      CompleteFront(qp, objects::WcStatus::kSuccess);
    }
    CheckDrained(qp);
    return;
  }
  // A WQE that failed locally completes when it reaches the front, after
  // the ACKs of those ahead of it (AckUpTo); at the front already, no ACK
  // will ever come for it: it fails now, as a NIC's would.
  // A bind or local invalidate at the front has nothing left to wait for.
  while (!qp.inflight.empty() && qp.inflight.front().local_op) {
    CompleteFront(qp, objects::WcStatus::kSuccess);
  }
  if (!qp.inflight.empty() && FailedAtAdmission(qp.inflight.front())) {
    FailQp(qp, static_cast<objects::WcStatus>(qp.inflight.front().read_bytes),
           "a work request failed locally");
    return;
  }
  if (!qp.inflight.empty()) Activate(qp);
  CheckDrained(qp);
}

void Engine::CheckDrained(Qp& qp) {
  if (qp.attrs.state != QpState::kSqd || !qp.sq_draining) return;
  if (!qp.inflight.empty() || qp.sqd_admit > 0) return;
  qp.sq_draining = false;
  Log().debug("{} qp#{}: send queue drained ({} WRs left queued)", device_->name(), qp.qpn,
              qp.sq.size());
  if (qp.attrs.sqd_notify) RaiseQpEvent(qp, device::AsyncEventType::kSqDrained);
}

size_t Engine::AdmitWqes(Qp& qp, size_t limit) {
  const uint32_t mtu = qp.attrs.path_mtu;
  size_t admitted = 0;
  for (; admitted < limit && !qp.sq.empty(); ++admitted) {
    SendWqe& w = qp.sq.front();
    const bool rd = UsesResponderResource(w.op);
    int outstanding_rd = 0;
    for (const Inflight& f : qp.inflight) outstanding_rd += UsesResponderResource(f.wqe.op);
    // A fenced WQE waits for every earlier READ and atomic (IBA 10.8.3.3).
    if (w.fence && outstanding_rd > 0) break;
    if (rd && outstanding_rd >= std::max<int>(1, qp.attrs.max_rd_atomic)) break;
    // UC has no acknowledgements and so no window. Admission looks at the
    // largest window; sending (Progress) at the current one.
    if (IsReliable(qp.type) &&
        wire::PsnDiff(qp.next_send_psn, qp.last_acked_psn) > static_cast<int32_t>(CongestionWindow::kMax)) {
      break;
    }
    if (qp.inflight.empty()) {
      qp.timeouts_in_row = 0;
      StartTimer(qp);
      qp.retries_left = qp.attrs.retry_cnt;
      qp.rnr_retries_left = qp.attrs.rnr_retry;
    }
    Inflight f;
    f.wqe = std::move(w);
    qp.sq.pop_front();
    if (IsLocalOp(f.wqe.op)) {
      // Executed now, after every WQE ahead of it has started, and without
      // a PSN: it completes once they have (Progress, AckUpTo).
      const objects::WcStatus status = ExecuteLocalOp(qp, f.wqe);
      f.first_psn = f.next_psn = qp.next_send_psn;
      f.last_psn = wire::PsnAdd(f.first_psn, -1);
      f.packets = 0;
      if (status != objects::WcStatus::kSuccess) {
        f.read_bytes = static_cast<uint64_t>(status);
        qp.inflight.push_back(std::move(f));
        return admitted + 1;
      }
      f.local_op = f.sent = f.done = true;
      qp.inflight.push_back(std::move(f));
      continue;
    }
    // READs and atomics write their response into the local SGEs.
    const bool atomic = f.wqe.op == SendOp::kCompareSwap || f.wqe.op == SendOp::kFetchAdd;
    const bool writes_locally = atomic || f.wqe.op == SendOp::kRdmaRead;
    objects::WcStatus local = f.wqe.is_inline ? objects::WcStatus::kSuccess
                                              : CheckSges(qp, f.wqe.sges, writes_locally);
    if (atomic && (f.wqe.sges.size() != 1 || f.wqe.length != 8)) {
      // The original value has nowhere to go; checked before the request
      // leaves, so the target is untouched.
      RDMAEMU_WARN_LIMITED("{} qp#{} WR {}: an atomic needs exactly one 8-byte SGE for the original "
                           "value, not {} SGE(s) of {} bytes: local length error",
                           device_->name(), qp.qpn, f.wqe.wr_id, f.wqe.sges.size(), f.wqe.length);
      local = objects::WcStatus::kLocLenErr;
    } else if (writes_locally && local != objects::WcStatus::kSuccess) {
      f.local_error = local;
      local = objects::WcStatus::kSuccess;
    }
    f.first_psn = qp.next_send_psn;
    if (local != objects::WcStatus::kSuccess) {
      // Completes with the error when it reaches the front (completer.cc).
      f.packets = 0;
      f.last_psn = wire::PsnAdd(f.first_psn, -1);
      f.next_psn = f.first_psn;
      f.read_bytes = static_cast<uint64_t>(local);
      qp.inflight.push_back(std::move(f));
      return admitted + 1;
    }
    // A READ's count is that of its response packets; every other request
    // answered from a responder resource is one packet with one answer.
    uint32_t count = rd && f.wqe.op != SendOp::kRdmaRead ? 1 : PacketCount(f.wqe.length, mtu);
    f.packets = rd ? 1 : count;
    f.last_psn = wire::PsnAdd(f.first_psn, count - 1);
    f.next_psn = f.first_psn;
    qp.next_send_psn = wire::PsnAdd(f.first_psn, count);
    if (DebugOn()) {
      Log().debug("{} qp#{} WR {} {} {} bytes, psn {}..{}{}", device_->name(), qp.qpn, f.wqe.wr_id,
                  SendOpName(f.wqe.op), f.wqe.length, f.first_psn, f.last_psn,
                  f.wqe.signaled ? "" : " (unsignaled)");
    }
    qp.inflight.push_back(std::move(f));
  }
  return admitted;
}

objects::WcStatus Engine::ExecuteLocalOp(Qp& qp, const SendWqe& w) {
  if (w.op == SendOp::kBindMw) {
    objects::BindRequest r = w.bind;
    r.qp_pd = qp.pd;
    r.qpn = qp.qpn;
    Status s = device_->mws().Bind(r, device_->mrs());
    if (!s.ok()) {
      RDMAEMU_WARN_LIMITED("{} qp#{} WR {}: binding the memory window failed: {}: "
                           "IBV_WC_MW_BIND_ERR",
                           device_->name(), qp.qpn, w.wr_id, s.message());
      return objects::WcStatus::kMwBindErr;
    }
    if (DebugOn()) {
      Log().debug("{} qp#{} WR {} BIND_MW: rkey {:#x} now grants {:#x} on [{:#x}, +{}) of lkey {:#x}",
                  device_->name(), qp.qpn, w.wr_id, r.new_rkey, r.access, r.addr, r.length,
                  r.mr_lkey);
    }
    return objects::WcStatus::kSuccess;
  }
  Status s = device_->mws().Invalidate(w.invalidate_rkey, qp.pd, 0);
  if (!s.ok()) {
    // As rxe: a local invalidate the device cannot perform is a local QP
    // operation error.
    RDMAEMU_WARN_LIMITED("{} qp#{} WR {}: LOCAL_INV of rkey {:#x} failed: {}{}: IBV_WC_LOC_QP_OP_ERR",
                         device_->name(), qp.qpn, w.wr_id, w.invalidate_rkey, s.message(),
                         s.code() == ENOENT ? " (regions of ibv_reg_mr cannot be invalidated)" : "");
    return objects::WcStatus::kLocQpOpErr;
  }
  if (DebugOn()) {
    Log().debug("{} qp#{} WR {} LOCAL_INV: rkey {:#x} invalidated", device_->name(), qp.qpn, w.wr_id,
                w.invalidate_rkey);
  }
  return objects::WcStatus::kSuccess;
}

void Engine::SendRequest(Qp& qp, Inflight& f, uint32_t psn) {
  using wire::Opcode;
  const SendWqe& w = f.wqe;
  const uint32_t mtu = qp.attrs.path_mtu;
  wire::PacketFields p;
  p.bth.dest_qpn = qp.attrs.dest_qpn;
  p.bth.psn = psn;
  p.xrc_srqn = w.xrc_remote_srqn;  // written on XRC requests only
  // MigReq is set in MIGRATED and clear while the path is REARM or ARMED.
  p.bth.migreq = qp.attrs.mig_state == MigState::kMigrated;
  std::span<const uint8_t> inline_payload;
  wire::Gather payload(&inline_payload, 1);
  switch (w.op) {
    case SendOp::kSend:
    case SendOp::kSendWithImm:
    case SendOp::kSendWithInv:
    case SendOp::kRdmaWrite:
    case SendOp::kRdmaWriteWithImm: {
      const bool write = w.op == SendOp::kRdmaWrite || w.op == SendOp::kRdmaWriteWithImm;
      const uint32_t index = static_cast<uint32_t>(wire::PsnDiff(psn, f.first_psn));
      const bool first = index == 0;
      const bool last = index + 1 == f.packets;
      Opcode op;
      if (write) {
        if (first && last) {
          op = w.op == SendOp::kRdmaWriteWithImm ? Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                                                 : Opcode::RC_RDMA_WRITE_ONLY;
        } else if (first) {
          op = Opcode::RC_RDMA_WRITE_FIRST;
        } else if (last) {
          op = w.op == SendOp::kRdmaWriteWithImm ? Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
                                                 : Opcode::RC_RDMA_WRITE_LAST;
        } else {
          op = Opcode::RC_RDMA_WRITE_MIDDLE;
        }
      } else {
        const bool imm = w.op == SendOp::kSendWithImm;
        const bool inv = w.op == SendOp::kSendWithInv;
        if (first && last) {
          op = imm ? Opcode::RC_SEND_ONLY_WITH_IMMEDIATE
                   : inv ? Opcode::RC_SEND_ONLY_WITH_INVALIDATE : Opcode::RC_SEND_ONLY;
        } else if (first) {
          op = Opcode::RC_SEND_FIRST;
        } else if (last) {
          op = imm ? Opcode::RC_SEND_LAST_WITH_IMMEDIATE
                   : inv ? Opcode::RC_SEND_LAST_WITH_INVALIDATE : Opcode::RC_SEND_LAST;
        } else {
          op = Opcode::RC_SEND_MIDDLE;
        }
        p.bth.solicited = last && w.solicited;
      }
      p.opcode = OnTransport(qp.type, op);
      p.bth.ack_req = IsReliable(qp.type) &&
                      (last || (index + 1) % kPacketsPerAck == 0 || !InWindow(qp, wire::PsnNext(psn)));
      p.reth = {w.remote_addr, w.rkey, static_cast<uint32_t>(w.length)};
      p.imm = ntohl(w.imm_data);
      p.invalidate_rkey = w.invalidate_rkey;
      const uint64_t offset = uint64_t{index} * mtu;
      const size_t len = static_cast<size_t>(std::min<uint64_t>(mtu, w.length - std::min(w.length, offset)));
      payload = GatherSpans(w, offset, len);
      break;
    }
    case SendOp::kRdmaRead: {
      // A retried read asks only for what has not arrived (rxe does the same).
      p.opcode = OnTransport(qp.type, Opcode::RC_RDMA_READ_REQUEST);
      p.bth.psn = wire::PsnAdd(f.first_psn, static_cast<int64_t>(f.read_bytes / mtu));
      p.bth.ack_req = true;
      p.reth = {w.remote_addr + f.read_bytes, w.rkey, static_cast<uint32_t>(w.length - f.read_bytes)};
      break;
    }
    case SendOp::kCompareSwap:
    case SendOp::kFetchAdd:
      p.opcode = OnTransport(qp.type, w.op == SendOp::kCompareSwap ? Opcode::RC_COMPARE_SWAP
                                                                   : Opcode::RC_FETCH_ADD);
      p.bth.ack_req = true;
      p.atomic_eth.va = w.remote_addr;
      p.atomic_eth.rkey = w.rkey;
      p.atomic_eth.swap_add = w.op == SendOp::kCompareSwap ? w.swap : w.compare_add;
      p.atomic_eth.compare = w.compare_add;
      break;
    case SendOp::kAtomicWrite:
      // The 8 bytes travel as the payload, the RETH names where they go.
      p.opcode = Opcode::RC_ATOMIC_WRITE;
      p.bth.ack_req = true;
      p.reth = {w.remote_addr, w.rkey, static_cast<uint32_t>(w.inline_data.size())};
      inline_payload = std::span<const uint8_t>(w.inline_data);
      break;
    case SendOp::kFlush:
      p.opcode = Opcode::RC_FLUSH;
      p.bth.ack_req = true;
      p.feth = {w.flush_type, w.flush_level};
      p.reth = {w.remote_addr, w.rkey, static_cast<uint32_t>(w.length)};
      break;
    case SendOp::kBindMw:
    case SendOp::kLocalInv:
      return;  // local operations send nothing (Progress never asks)
  }
  if (f.sent) Count(&qp, &Counters::retransmissions);
  Transmit(&qp, p, payload, qp.attrs.dest_ip);
}

void Engine::RetransmitFrom(Qp& qp, uint32_t psn) {
  for (Inflight& f : qp.inflight) {
    if (f.local_op) continue;
    if (f.packets == 0) break;
    if (f.done || wire::PsnDiff(LastRequestPsn(f), psn) < 0) continue;
    f.next_psn = wire::PsnDiff(psn, f.first_psn) > 0 ? psn : f.first_psn;
    f.rerequested = false;
  }
  StartTimer(qp);
  Activate(qp);
}

void Engine::Rerequest(Qp& qp, Inflight& f) {
  // Only the READ or atomic itself goes again: the requests after it reached
  // the responder (its response, not a request, was lost), and a duplicate
  // READ or atomic is answered from the responder's replay list without
  // touching its expected PSN (IBA 9.7.5.1.1). Going back N here would resend
  // every later request of the window as a duplicate.
  if (f.rerequested || f.done) return;
  f.rerequested = true;
  f.next_psn = f.first_psn;
  StartTimer(qp);
  Activate(qp);
}

}  // namespace rdmaemu::engine
