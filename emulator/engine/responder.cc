// The responder: checks each request packet (PSN, opcode sequence, QP
// access, keys, bounds), executes it, and answers with ACK, NAK, read
// responses or atomic ACKs. Duplicate READs and atomics are answered from
// the replay list, never executed twice. In a sustained ping-pong an ACK
// may wait for the QP's next request and leave right behind it (HoldAck).
#include <arpa/inet.h>

#include <cstring>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/engine/internal.h"
#include "emulator/engine/trace.h"
#include "emulator/wire/psn.h"

namespace rdmaemu::engine {
namespace {

// READs and atomics remembered for replay (the QP's max_dest_rd_atomic
// bounds how many can be outstanding; keep comfortably more).
constexpr size_t kReplayEntries = 64;

// IBV_ACCESS_* bits the QP grants.
constexpr uint32_t kQpRemoteWrite = 1u << 1;
constexpr uint32_t kQpRemoteRead = 1u << 2;
constexpr uint32_t kQpRemoteAtomic = 1u << 3;
constexpr uint32_t kQpFlushGlobal = 1u << 8;
constexpr uint32_t kQpFlushPersistent = 1u << 9;

// FETH placement types (IBA Memory Placement Extensions; IBV_FLUSH_GLOBAL,
// IBV_FLUSH_PERSISTENT) and selectivity levels (IBV_FLUSH_RANGE, _MR).
constexpr uint8_t kFlushGlobal = 1;
constexpr uint8_t kFlushPersistent = 2;
constexpr uint8_t kFlushRange = 0;
constexpr uint8_t kFlushMr = 1;

}  // namespace

void Engine::SendAck(Qp& qp, uint32_t psn, uint8_t syndrome) {
  if (syndrome == wire::AckSyndrome() && HoldAck(qp, psn)) return;
  TransmitAck(qp, psn, qp.msn, syndrome);
}

void Engine::TransmitAck(Qp& qp, uint32_t psn, uint32_t msn, uint8_t syndrome) {
  wire::PacketFields p;
  p.opcode = OnTransport(qp.type, wire::Opcode::RC_ACKNOWLEDGE);
  p.bth.dest_qpn = qp.attrs.dest_qpn;
  p.bth.psn = psn;
  p.bth.migreq = qp.attrs.mig_state == MigState::kMigrated;
  p.aeth.syndrome = syndrome;
  p.aeth.msn = msn & 0xffffff;
  Transmit(&qp, p, wire::Gather(), qp.attrs.dest_ip);
}

bool Engine::HoldAck(Qp& qp, uint32_t psn) {
  if (qp.type != QpType::kRc) return false;
  qp.alternations = qp.last_was_receive ? 0 : qp.alternations + 1;
  qp.last_was_receive = true;
  const Clock::time_point now = Clock::now();
  if (!qp.ack_held) {
    // Only a QP in a ping-pong that sent a request of its own lately and
    // has nothing waiting to go (the window is not what holds its requests
    // back: two QPs whose windows are full would each wait for the other's
    // ACK), in a program that does not wait for completion events.
    const Clock::time_point event_wait(
        std::chrono::nanoseconds(last_event_wait_ns_.load(std::memory_order_relaxed)));
    const bool waiting_to_go =
        !qp.sq.empty() || qp.rnr_waiting || (!qp.inflight.empty() && !qp.inflight.back().sent);
    if (qp.alternations < kAckHoldAfter || now >= qp.last_request_at + kAckHoldWindow ||
        now < qp.ack_hold_off_until || waiting_to_go || now < event_wait + kAckHoldWindow ||
        faults_.active() || !loop_->SendsCoalesce()) {
      return false;
    }
    qp.ack_held = true;
    qp.held_ack_until = now + kAckHold;
    if (!qp.ack_hold_listed) {
      qp.ack_hold_listed = true;
      held_acks_.push_back(qp.qpn);
    }
  }
  qp.held_ack_psn = psn;
  qp.held_ack_msn = qp.msn;
  return true;
}

void Engine::FlushHeldAck(Qp& qp) {
  if (!qp.ack_held) return;
  qp.ack_held = false;
  // A QP that went to ERR meanwhile sends nothing more.
  if (qp.attrs.state == QpState::kErr || qp.attrs.state == QpState::kReset) return;
  TransmitAck(qp, qp.held_ack_psn, qp.held_ack_msn, wire::AckSyndrome());
}

std::optional<Clock::time_point> Engine::FlushDueAcks(Clock::time_point now) {
  std::optional<Clock::time_point> next;
  for (size_t i = 0; i < held_acks_.size();) {
    bool keep = false;
    if (auto qp = FindQp(held_acks_[i])) {
      std::lock_guard lock(qp->mu);
      if (!qp->removed && qp->ack_held && now < qp->held_ack_until) {
        keep = true;
        if (!next || qp->held_ack_until < *next) next = qp->held_ack_until;
      } else {
        if (!qp->removed && qp->ack_held) {
          FlushHeldAck(*qp);
          qp->ack_hold_off_until = now + kAckHoldBackoff;
        }
        qp->ack_hold_listed = false;
      }
    }
    if (keep) {
      ++i;
    } else {
      held_acks_[i] = held_acks_.back();
      held_acks_.pop_back();
    }
  }
  return next;
}

void Engine::SendRnrNak(Qp& qp, uint32_t psn) {
  Count(&qp, &Counters::rnr_naks_sent);
  RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{} qp#{}: no receive posted for psn {}: RNR NAK sent",
                      device_->name(), qp.qpn, psn);
  SendAck(qp, psn, wire::RnrNakSyndrome(qp.attrs.min_rnr_timer));
  // The RNR NAK sends the requester back to this PSN, so it is this gap's
  // one NAK: the packets pipelined behind it are dropped silently. A
  // sequence NAK for them would cost the requester a transport retry per
  // RNR round, and a slow receiver would fail a QP that may wait forever.
  qp.nak_sent = true;
}

void Engine::ResponderError(Qp& qp, wire::NakCode code, uint32_t psn, const std::string& why,
                            std::optional<objects::WcStatus> recv_status) {
  if (code == wire::NakCode::kRemoteAccessError) Count(&qp, &Counters::rkey_violations);
  if (qp.type == QpType::kUc) {
    // UC has no NAKs: the message is dropped and the receive WQE reused.
    RDMAEMU_WARN_LIMITED("{} qp#{}: dropped a UC message: {}", device_->name(), qp.qpn, why);
    if (qp.in_send) ReturnRecv(qp, std::move(qp.recv));
    qp.in_send = qp.in_write = false;
    qp.write_mr.reset();
    qp.uc_resync = true;
    return;
  }
  Log().warn("{} qp#{} {}→ERR (responder): {}; NAK {} sent", device_->name(), qp.qpn,
             QpStateName(qp.attrs.state), why, wire::ToString(code));
  SendAck(qp, psn, wire::NakSyndrome(code));
  if (qp.in_send) {
    objects::Cqe c;
    c.wr_id = qp.recv.wr_id;
    c.status = recv_status                                 ? *recv_status
               : code == wire::NakCode::kRemoteAccessError ? objects::WcStatus::kRemAccessErr
               : code == wire::NakCode::kInvalidRequest    ? objects::WcStatus::kRemInvReqErr
                                                           : objects::WcStatus::kLocQpOpErr;
    c.opcode = objects::WcOpcode::kRecv;
    c.qp_num = qp.qpn;
    qp.in_send = false;
    PushRecvCqe(qp, c);
  }
  // Invalid requests and access violations are fatal to the responder's QP
  // and reported by the matching async event (IBA 9.9.2, 11.6.3.1).
  RaiseQpEvent(qp, code == wire::NakCode::kRemoteAccessError ? device::AsyncEventType::kQpAccessErr
                   : code == wire::NakCode::kInvalidRequest  ? device::AsyncEventType::kQpReqErr
                                                             : device::AsyncEventType::kQpFatal);
  EnterError(qp);
}

bool Engine::ResolveXrcSrq(Qp& qp, const wire::PacketView& packet) {
  const uint32_t srqn = packet.xrceth().srqn();
  std::shared_ptr<Srq> srq = FindSrq(srqn);
  std::string why;
  if (!srq) {
    why = fmt::format("its XRCETH names XRC SRQ {}, which {} does not have (a wrong "
                      "remote_srqn, or the SRQ was destroyed)",
                      srqn, device_->name());
  } else if (srq->xrcd != qp.xrcd) {
    why = fmt::format("its XRCETH names XRC SRQ {}, of XRC domain {}, but the target QP belongs "
                      "to XRC domain {}: a target delivers only into SRQs of its own domain",
                      srqn, srq->xrcd, qp.xrcd);
  } else if ((qp.in_send || qp.in_write) && !packet.Has(wire::kFirstMask) && srq != qp.srq) {
    why = fmt::format("its XRCETH names XRC SRQ {} in the middle of a message begun on another",
                      srqn);
  }
  if (!why.empty()) {
    // IBA 9.7.5.2.x: the XRC responder's SRQ check fails as an invalid
    // request; the sender's WR completes with IBV_WC_REM_INV_REQ_ERR.
    ResponderError(qp, wire::NakCode::kInvalidRequest, packet.psn(),
                   fmt::format("{} refused: {}", packet.info().name, why));
    return false;
  }
  qp.srq = std::move(srq);
  return true;
}

std::shared_ptr<const objects::Mr> Engine::RemoteRegion(uint32_t rkey) {
  return objects::IsWindowKey(rkey) ? device_->mws().FindByRkey(rkey) : device_->mrs().FindByRkey(rkey);
}

std::string Engine::RemoteRefusal(const Qp& qp, const objects::Mr* mr, uint32_t rkey, uint32_t need,
                                  uint64_t va, uint64_t len) {
  const bool window = objects::IsWindowKey(rkey);
  const char* right = need == objects::kRemoteWrite       ? "IBV_ACCESS_REMOTE_WRITE"
                      : need == objects::kRemoteRead      ? "IBV_ACCESS_REMOTE_READ"
                      : need == objects::kRemoteAtomic    ? "IBV_ACCESS_REMOTE_ATOMIC"
                      : need == objects::kFlushGlobal     ? "IBV_ACCESS_FLUSH_GLOBAL"
                      : need == objects::kFlushPersistent ? "IBV_ACCESS_FLUSH_PERSISTENT"
                                                          : "IBV_ACCESS_FLUSH_GLOBAL and _PERSISTENT";
  if (mr == nullptr) {
    return window ? "it names no bound memory window (never bound, invalidated, unbound, rebound "
                    "under a new key or deallocated)"
                  : "it names no memory region (a wrong key, or deregistered)";
  }
  const char* what = window ? "the memory window" : "the memory region";
  if (mr->pd != AccessPd(qp)) {
    return fmt::format("{} belongs to another PD than the {}", what,
                       qp.type == QpType::kXrcRecv ? "XRC SRQ the message names" : "QP");
  }
  if (mr->bound_qpn != 0 && mr->bound_qpn != qp.qpn) {
    return fmt::format("the type 2 window was bound through qp#{}, and only that QP may use it",
                       mr->bound_qpn);
  }
  if ((mr->access & need) != need) return fmt::format("{} does not grant {}", what, right);
  if (!mr->Contains(va, len)) {
    return fmt::format("[{:#x}, +{}) is outside {} [{:#x}, +{})", va, len, what, mr->iova, mr->length);
  }
  // On demand: the pages are faulted in now (a FLUSH touches none).
  const bool flush = need & (objects::kFlushGlobal | objects::kFlushPersistent);
  if (!flush) {
    if (Status s = mr->FaultIn(va, len, need != objects::kRemoteRead); !s.ok()) {
      return fmt::format("{} is on demand and {}", what, s.message());
    }
  }
  return "";
}

void Engine::AnswerRead(Qp& qp, const ReplayEntry& r, uint32_t from_psn) {
  using wire::Opcode;
  const uint32_t mtu = qp.attrs.path_mtu;
  const uint32_t count = static_cast<uint32_t>(wire::PsnDiff(r.last_psn, r.psn)) + 1;
  std::shared_ptr<const objects::Mr> mr;
  if (r.length > 0) {
    // Checked again in full, not only for the key: a duplicate READ is
    // answered from memory as it is now, and since the first answer the
    // region may have been re-registered into another PD or without
    // IBV_ACCESS_REMOTE_READ, or the window invalidated and bound again
    // elsewhere. After ibv_rereg_mr returns, the old rights give no access.
    mr = RemoteRegion(r.rkey);
    std::string refused = RemoteRefusal(qp, mr.get(), r.rkey, objects::kRemoteRead, r.va, r.length);
    if (!refused.empty()) {
      ResponderError(qp, wire::NakCode::kRemoteAccessError, from_psn,
                     fmt::format("RDMA READ of [{:#x}, +{}) with rkey {:#x}, answered again, is "
                                 "refused now: {}",
                                 r.va, r.length, r.rkey, refused));
      return;
    }
  }
  for (uint32_t psn = from_psn; wire::PsnDiff(psn, r.last_psn) <= 0; psn = wire::PsnNext(psn)) {
    const uint32_t index = static_cast<uint32_t>(wire::PsnDiff(psn, r.psn));
    wire::PacketFields p;
    if (count == 1) {
      p.opcode = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
    } else if (index == 0) {
      p.opcode = Opcode::RC_RDMA_READ_RESPONSE_FIRST;
    } else if (index + 1 == count) {
      p.opcode = Opcode::RC_RDMA_READ_RESPONSE_LAST;
    } else {
      p.opcode = Opcode::RC_RDMA_READ_RESPONSE_MIDDLE;
    }
    p.opcode = OnTransport(qp.type, p.opcode);
    p.bth.dest_qpn = qp.attrs.dest_qpn;
    p.bth.psn = psn;
    p.bth.migreq = qp.attrs.mig_state == MigState::kMigrated;
    p.aeth.syndrome = wire::AckSyndrome();
    p.aeth.msn = qp.msn & 0xffffff;
    const uint64_t offset = uint64_t{index} * mtu;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(mtu, r.length - std::min<uint64_t>(r.length, offset)));
    std::span<const uint8_t> payload;
    if (len > 0) payload = std::span<const uint8_t>(mr->HostAddress(r.va + offset), len);
    Transmit(&qp, p, wire::Gather(&payload, 1), qp.attrs.dest_ip);
  }
}

bool Engine::ExecutePlacement(Qp& qp, const wire::PacketView& packet) {
  const uint32_t psn = packet.psn();
  const auto reth = packet.reth();
  if (packet.Has(wire::kAtomicWriteMask)) {
    if (!(qp.attrs.access & kQpRemoteWrite)) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     "an ATOMIC WRITE arrived but the QP does not allow remote writes "
                     "(IBV_ACCESS_REMOTE_WRITE in qp_access_flags)");
      return false;
    }
    std::span<const uint8_t> data = packet.payload();
    if (reth.dma_length() != 8 || data.size() != 8) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     fmt::format("an ATOMIC WRITE carries 8 bytes, not a RETH length of {} with {} "
                                 "bytes of payload",
                                 reth.dma_length(), data.size()));
      return false;
    }
    if (reth.va() % 8 != 0) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     fmt::format("ATOMIC WRITE address {:#x} is not 8-byte aligned", reth.va()));
      return false;
    }
    auto mr = RemoteRegion(reth.rkey());
    std::string refused = RemoteRefusal(qp, mr.get(), reth.rkey(), objects::kRemoteWrite, reth.va(), 8);
    if (!refused.empty()) {
      ResponderError(qp, wire::NakCode::kRemoteAccessError, psn,
                     fmt::format("ATOMIC WRITE to {:#x} with rkey {:#x} refused: {}", reth.va(),
                                 reth.rkey(), refused));
      return false;
    }
    // One 8-byte store that no reader sees half done, after everything this
    // QP wrote before it (a release store, as rxe's smp_store_release).
    uint64_t value;
    std::memcpy(&value, data.data(), 8);
    __atomic_store_n(reinterpret_cast<uint64_t*>(mr->HostAddress(reth.va())), value, __ATOMIC_RELEASE);
    return true;
  }
  // FLUSH. The QP and the region must grant each placement type asked for;
  // a type this device does not know is an invalid request.
  const auto feth = packet.feth();
  const uint8_t type = feth.placement_type();
  const uint8_t level = feth.selectivity_level();
  if (type == 0 || (type & ~(kFlushGlobal | kFlushPersistent)) || (level != kFlushRange && level != kFlushMr)) {
    ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                   fmt::format("a FLUSH with placement type {:#x} and selectivity level {}: the "
                               "types are GLOBAL (1) and PERSISTENT (2), the levels RANGE (0) and "
                               "MR (1)",
                               type, level));
    return false;
  }
  const uint32_t qp_need = ((type & kFlushGlobal) ? kQpFlushGlobal : 0) |
                           ((type & kFlushPersistent) ? kQpFlushPersistent : 0);
  if ((qp.attrs.access & qp_need) != qp_need) {
    ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                   fmt::format("a FLUSH arrived but the QP does not grant {} in qp_access_flags",
                               (type & kFlushPersistent) ? "IBV_ACCESS_FLUSH_PERSISTENT"
                                                         : "IBV_ACCESS_FLUSH_GLOBAL"));
    return false;
  }
  const uint32_t need = ((type & kFlushGlobal) ? uint32_t{objects::kFlushGlobal} : 0u) |
                        ((type & kFlushPersistent) ? uint32_t{objects::kFlushPersistent} : 0u);
  auto mr = RemoteRegion(reth.rkey());
  // The MR level flushes the whole region: its address and length are not
  // looked at (rxe skips the range check too).
  const uint64_t va = level == kFlushMr && mr ? mr->iova : reth.va();
  const uint64_t len = level == kFlushMr && mr ? 0 : reth.dma_length();
  std::string refused = RemoteRefusal(qp, mr.get(), reth.rkey(), need, va, len);
  if (!refused.empty()) {
    ResponderError(qp, wire::NakCode::kRemoteAccessError, psn,
                   fmt::format("FLUSH of [{:#x}, +{}) with rkey {:#x} refused: {}", reth.va(),
                               reth.dma_length(), reth.rkey(), refused));
    return false;
  }
  // Global visibility needs nothing more: every write this responder
  // executed before the FLUSH is already stored, by this thread and in
  // order, and the answer that says so leaves through a system call
  // (sendmsg or io_uring), which orders those stores before it.
  return true;
}

void Engine::OnRequest(Qp& qp, const wire::PacketView& packet) {
  const uint32_t psn = packet.psn();
  const bool rc = IsReliable(qp.type);

  if (!rc) {
    // UC: a gap loses the message in progress; resume at the next FIRST/ONLY.
    if (psn != qp.epsn) {
      Count(&qp, &Counters::out_of_sequence);
      if (qp.in_send) ReturnRecv(qp, std::move(qp.recv));
      qp.in_send = qp.in_write = false;
      qp.write_mr.reset();
      qp.uc_resync = true;
    }
    qp.epsn = wire::PsnNext(psn);
    if (qp.uc_resync) {
      if (!packet.Has(wire::kFirstMask)) return;
      qp.uc_resync = false;
    }
  } else {
    const int32_t d = wire::PsnDiff(psn, qp.epsn);
    if (d > 0) {
      Count(&qp, &Counters::out_of_sequence);
      if (!qp.nak_sent) {
        RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                            "{} qp#{}: psn {} out of sequence (expected {}): NAK PSN sequence "
                            "error sent",
                            device_->name(), qp.qpn, psn, qp.epsn);
        SendAck(qp, qp.epsn, wire::NakSyndrome(wire::NakCode::kPsnSequenceError));
        qp.nak_sent = true;
      }
      return;
    }
    if (d < 0) {
      Count(&qp, &Counters::duplicates);
      RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                          "{} qp#{}: duplicate {} psn {} (expected {}): answered again",
                          device_->name(), qp.qpn, packet.info().name, psn, qp.epsn);
      if (packet.Has(wire::kReadMask) || packet.Has(wire::kAtomicMask) ||
          packet.Has(wire::kAtomicWriteMask) || packet.Has(wire::kFlushMask)) {
        for (const ReplayEntry& r : qp.replay) {
          if (wire::PsnDiff(psn, r.psn) < 0 || wire::PsnDiff(psn, r.last_psn) > 0) continue;
          if (r.atomic) {
            wire::PacketFields p;
            p.opcode = OnTransport(qp.type, wire::Opcode::RC_ATOMIC_ACKNOWLEDGE);
            p.bth.dest_qpn = qp.attrs.dest_qpn;
            p.bth.psn = r.psn;
            p.aeth.syndrome = wire::AckSyndrome();
            p.aeth.msn = qp.msn & 0xffffff;
            p.atomic_ack_orig_data = r.atomic_result;
            Transmit(&qp, p, wire::Gather(), qp.attrs.dest_ip);
          } else {
            AnswerRead(qp, r, psn);  // a placement operation's is zero-length
          }
          return;
        }
        return;  // too old to replay: the requester has long moved on
      }
      // A duplicate SEND or WRITE was executed once: acknowledge again.
      SendAck(qp, wire::PsnAdd(qp.epsn, -1), wire::AckSyndrome());
      return;
    }
    qp.nak_sent = false;
  }
  // An XRC target receives each message into the XRC SRQ it names.
  if (qp.type == QpType::kXrcRecv && !ResolveXrcSrq(qp, packet)) return;

  // Opcode sequence (IBA 9.8.3): a message in progress continues with its
  // own MIDDLE or LAST; otherwise only FIRST or ONLY may come.
  const bool is_send = packet.Has(wire::kSendMask);
  const bool is_write = packet.Has(wire::kWriteMask);
  if ((qp.in_send && !(is_send && !packet.Has(wire::kFirstMask))) ||
      (qp.in_write && !(is_write && !packet.Has(wire::kFirstMask))) ||
      (!qp.in_send && !qp.in_write && !packet.Has(wire::kFirstMask))) {
    ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                   fmt::format("{} out of the opcode sequence", packet.info().name));
    return;
  }
  // Fault rules may answer a new request message in place of the responder
  // (RNR NAK, a NAK, the QP to ERR): only RC has NAKs.
  if (rc && packet.Has(wire::kFirstMask) && ForcedResponse(qp, packet)) return;

  if (is_send) {
    if (packet.Has(wire::kFirstMask)) {
      qp.tm = TmDelivery{};
      // A tag-matching SRQ's TMH decides which receive (tag_matching.cc).
      if (qp.srq && qp.srq->tags) {
        if (!TakeTmRecv(qp, packet)) return;
      } else if (!TakeRecv(qp, &qp.recv)) {
        if (rc) {
          SendRnrNak(qp, psn);
        } else {
          Count(&qp, &Counters::dropped_no_receive);
          qp.uc_resync = !packet.Has(wire::kLastMask);
        }
        return;  // RC: the PSN is not consumed; the requester retries
      }
      qp.in_send = true;
      qp.recv_offset = 0;
      // The receiver's own mistake: its completion says so (a ConnectX
      // gives LOC_PROT_ERR here), the sender learns only that the remote
      // side failed (REM_OP_ERR). An SRQ's WQEs belong to the SRQ's PD.
      if (CheckSges(RecvPd(qp), qp.qpn, qp.recv.sges, true) != objects::WcStatus::kSuccess) {
        ResponderError(qp, wire::NakCode::kRemoteOperationalError, psn,
                       fmt::format("receive WR {}: its SGEs are not in a memory region with "
                                   "IBV_ACCESS_LOCAL_WRITE of the {}'s PD",
                                   qp.recv.wr_id, qp.srq ? "SRQ" : "QP"),
                       objects::WcStatus::kLocProtErr);
        return;
      }
    }
    std::span<const uint8_t> data = packet.payload();
    if (qp.tm.skip > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(qp.tm.skip, data.size()));
      data = data.subspan(n);
      qp.tm.skip -= n;
    }
    if (qp.recv_offset + data.size() > qp.recv.length) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     fmt::format("the message is longer than the {}-byte receive buffer of WR {}",
                                 qp.recv.length, qp.recv.wr_id),
                     objects::WcStatus::kLocLenErr);
      return;
    }
    if (packet.Has(wire::kIethMask)) {
      // SEND with invalidate: the window it names is invalidated as the
      // message is delivered. What the responder cannot invalidate fails
      // the message (the receive completes in error, the sender is NAKed),
      // as rxe does: a type 1 window, another QP's or PD's window, a stale
      // key, and a region's rkey too: the IBA lets a SEND with invalidate
      // revoke type 2 windows and regions of fast registration, and
      // ibv_reg_mr makes none (rxe_invalidate_mr refuses its regions).
      // Delivering such a message as a success would tell the receiver a
      // key was revoked that still works.
      const uint32_t rkey = packet.ieth().rkey();
      Status s = objects::IsWindowKey(rkey)
                     ? device_->mws().Invalidate(rkey, AccessPd(qp), qp.qpn)
                     : InvalidArgument(device_->mrs().FindByRkey(rkey)
                                           ? "it names a memory region, and regions of ibv_reg_mr "
                                             "cannot be invalidated (only memory windows can)"
                                           : "it names no memory window (nor any region)");
      if (!s.ok()) {
        ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                       fmt::format("SEND with invalidate of rkey {:#x}: {}", rkey, s.message()),
                       objects::WcStatus::kRemInvReqErr);
        return;
      }
      if (DebugOn()) {
        Log().debug("{} qp#{}: SEND with invalidate: rkey {:#x} invalidated", device_->name(),
                    qp.qpn, rkey);
      }
    }
    ScatterRange(qp.recv.sges, qp.recv_offset, data);
    qp.recv_offset += data.size();
    if (packet.Has(wire::kLastMask)) {
      objects::Cqe c;
      c.wr_id = qp.recv.wr_id;
      c.opcode = objects::WcOpcode::kRecv;
      c.byte_len = static_cast<uint32_t>(qp.recv_offset);
      c.qp_num = qp.qpn;
      c.solicited = packet.bth().solicited();
      if (packet.Has(wire::kImmDtMask)) {
        c.wc_flags |= objects::kWcWithImm;
        c.imm_data = htonl(packet.imm_dt().imm());
      }
      if (packet.Has(wire::kIethMask)) {
        c.wc_flags |= objects::kWcWithInv;
        c.imm_data = packet.ieth().rkey();
      }
      FinishTmRecv(qp, c);
      qp.in_send = false;
      qp.msn = wire::PsnNext(qp.msn);
      PushRecvCqe(qp, c);
    }
  } else if (is_write) {
    if (!(qp.attrs.access & kQpRemoteWrite)) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     "an RDMA WRITE arrived but the QP does not allow remote writes "
                     "(IBV_ACCESS_REMOTE_WRITE in qp_access_flags)");
      return;
    }
    if (packet.Has(wire::kFirstMask)) {
      const auto reth = packet.reth();
      qp.write_mr.reset();
      if (reth.dma_length() > 0) {
        auto mr = RemoteRegion(reth.rkey());
        std::string refused = RemoteRefusal(qp, mr.get(), reth.rkey(), objects::kRemoteWrite,
                                            reth.va(), reth.dma_length());
        if (!refused.empty()) {
          ResponderError(qp, wire::NakCode::kRemoteAccessError, psn,
                         fmt::format("RDMA WRITE to [{:#x}, +{}) with rkey {:#x} refused: {}",
                                     reth.va(), reth.dma_length(), reth.rkey(), refused));
          return;
        }
        qp.write_mr = std::move(mr);
      }
      qp.in_write = true;
      qp.write_va = reth.va();
      qp.write_left = reth.dma_length();
      qp.write_length = reth.dma_length();
    }
    std::span<const uint8_t> data = packet.payload();
    if (data.size() > qp.write_left ||
        (packet.Has(wire::kLastMask) && data.size() != qp.write_left)) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     "the RDMA WRITE's payload does not match its RETH length");
      return;
    }
    const bool imm = packet.Has(wire::kImmDtMask);
    RecvWqe imm_recv;
    if (imm && !TakeRecv(qp, &imm_recv)) {
      // Checked before writing, so the retried packet finds nothing done.
      if (rc) {
        SendRnrNak(qp, psn);
        // An ONLY packet opened the write above: close it again, or its
        // retry would be refused as out of the opcode sequence.
        if (packet.Has(wire::kFirstMask)) {
          qp.in_write = false;
          qp.write_mr.reset();
        }
      } else {
        Count(&qp, &Counters::dropped_no_receive);
        qp.in_write = false;
        qp.write_mr.reset();
      }
      return;
    }
    if (!data.empty()) {
      // The region may have been deregistered since the FIRST packet; after
      // ibv_dereg_mr returns the device must not touch that memory again.
      if (RemoteRegion(qp.write_mr->rkey) != qp.write_mr) {
        ResponderError(qp, wire::NakCode::kRemoteAccessError, psn,
                       "the memory region of an RDMA WRITE in progress was deregistered (or its "
                       "window invalidated, rebound or deallocated)");
        return;
      }
      std::memcpy(qp.write_mr->HostAddress(qp.write_va), data.data(), data.size());
      qp.write_va += data.size();
      qp.write_left -= data.size();
    }
    if (packet.Has(wire::kLastMask)) {
      qp.in_write = false;
      qp.write_mr.reset();
      qp.msn = wire::PsnNext(qp.msn);
      if (imm) {
        objects::Cqe c;
        c.wr_id = imm_recv.wr_id;
        c.opcode = objects::WcOpcode::kRecvRdmaWithImm;
        c.byte_len = static_cast<uint32_t>(qp.write_length);
        c.qp_num = qp.qpn;
        c.wc_flags = objects::kWcWithImm;
        c.imm_data = htonl(packet.imm_dt().imm());
        c.solicited = packet.bth().solicited();
        PushRecvCqe(qp, c);
      }
    }
  } else if (packet.Has(wire::kReadMask)) {
    if (!(qp.attrs.access & kQpRemoteRead)) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     "an RDMA READ arrived but the QP does not allow remote reads "
                     "(IBV_ACCESS_REMOTE_READ in qp_access_flags)");
      return;
    }
    const auto reth = packet.reth();
    if (reth.dma_length() > 0) {
      auto mr = RemoteRegion(reth.rkey());
      std::string refused = RemoteRefusal(qp, mr.get(), reth.rkey(), objects::kRemoteRead, reth.va(),
                                          reth.dma_length());
      if (!refused.empty()) {
        ResponderError(qp, wire::NakCode::kRemoteAccessError, psn,
                       fmt::format("RDMA READ of [{:#x}, +{}) with rkey {:#x} refused: {}", reth.va(),
                                   reth.dma_length(), reth.rkey(), refused));
        return;
      }
    }
    const uint32_t mtu = qp.attrs.path_mtu;
    const uint32_t count = reth.dma_length() == 0 ? 1 : (reth.dma_length() + mtu - 1) / mtu;
    ReplayEntry r;
    r.psn = psn;
    r.last_psn = wire::PsnAdd(psn, count - 1);
    r.va = reth.va();
    r.rkey = reth.rkey();
    r.length = reth.dma_length();
    qp.replay.push_back(r);
    if (qp.replay.size() > kReplayEntries) qp.replay.pop_front();
    qp.msn = wire::PsnNext(qp.msn);
    qp.epsn = wire::PsnAdd(psn, count);
    AnswerRead(qp, r, psn);
    return;
  } else if (packet.Has(wire::kAtomicWriteMask) || packet.Has(wire::kFlushMask)) {
    if (!ExecutePlacement(qp, packet)) return;
    // Answered, now and when repeated, by a zero-length RDMA READ RESPONSE
    // ONLY (as rxe answers them); a duplicate is never executed again.
    ReplayEntry r;
    r.psn = r.last_psn = psn;
    qp.replay.push_back(r);
    if (qp.replay.size() > kReplayEntries) qp.replay.pop_front();
    qp.msn = wire::PsnNext(qp.msn);
    qp.epsn = wire::PsnNext(psn);
    AnswerRead(qp, r, psn);
    return;
  } else if (packet.Has(wire::kAtomicMask)) {
    if (!(qp.attrs.access & kQpRemoteAtomic)) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     "an atomic arrived but the QP does not allow remote atomics "
                     "(IBV_ACCESS_REMOTE_ATOMIC in qp_access_flags)");
      return;
    }
    const auto a = packet.atomic_eth();
    if (a.va() % 8 != 0) {
      ResponderError(qp, wire::NakCode::kInvalidRequest, psn,
                     fmt::format("atomic address {:#x} is not 8-byte aligned", a.va()));
      return;
    }
    auto mr = RemoteRegion(a.rkey());
    std::string refused = RemoteRefusal(qp, mr.get(), a.rkey(), objects::kRemoteAtomic, a.va(), 8);
    if (!refused.empty()) {
      ResponderError(qp, wire::NakCode::kRemoteAccessError, psn,
                     fmt::format("atomic on {:#x} with rkey {:#x} refused: {}", a.va(), a.rkey(),
                                 refused));
      return;
    }
    auto* target = reinterpret_cast<uint64_t*>(mr->HostAddress(a.va()));
    uint64_t orig;
    if (wire::AsRc(packet.opcode()) == wire::Opcode::RC_COMPARE_SWAP) {
      orig = a.compare();
      __atomic_compare_exchange_n(target, &orig, a.swap_add(), false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST);
    } else {
      orig = __atomic_fetch_add(target, a.swap_add(), __ATOMIC_SEQ_CST);
    }
    ReplayEntry r;
    r.psn = r.last_psn = psn;
    r.atomic = true;
    r.atomic_result = orig;
    qp.replay.push_back(r);
    if (qp.replay.size() > kReplayEntries) qp.replay.pop_front();
    qp.msn = wire::PsnNext(qp.msn);
    qp.epsn = wire::PsnNext(psn);
    wire::PacketFields p;
    p.opcode = OnTransport(qp.type, wire::Opcode::RC_ATOMIC_ACKNOWLEDGE);
    p.bth.dest_qpn = qp.attrs.dest_qpn;
    p.bth.psn = psn;
    p.aeth.syndrome = wire::AckSyndrome();
    p.aeth.msn = qp.msn & 0xffffff;
    p.atomic_ack_orig_data = orig;
    Transmit(&qp, p, wire::Gather(), qp.attrs.dest_ip);
    return;
  }

  if (rc) {
    qp.epsn = wire::PsnNext(psn);
    if (packet.bth().ack_req() || packet.Has(wire::kLastMask)) SendAck(qp, psn, wire::AckSyndrome());
  }
}

}  // namespace rdmaemu::engine
