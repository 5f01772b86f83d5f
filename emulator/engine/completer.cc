// The completer: ACKs, NAKs, read responses and atomic ACKs complete the
// requester's WQEs; the transport and RNR timers drive retries; exhausted
// retries and fatal NAKs move the QP to ERR.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/engine/internal.h"
#include "emulator/engine/trace.h"
#include "emulator/wire/psn.h"

namespace rdmaemu::engine {
namespace {

// IBA table 45: the RNR NAK timer codes, in microseconds.
constexpr uint32_t kRnrDelayUs[32] = {
    655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
    480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

bool IsRead(const Inflight& f) { return f.wqe.op == SendOp::kRdmaRead; }
bool IsAtomic(const Inflight& f) {
  return f.wqe.op == SendOp::kCompareSwap || f.wqe.op == SendOp::kFetchAdd;
}
// ATOMIC WRITE and FLUSH: answered by a zero-length READ RESPONSE ONLY.
bool IsPlacement(const Inflight& f) {
  return f.wqe.op == SendOp::kAtomicWrite || f.wqe.op == SendOp::kFlush;
}
// A request answered from a responder resource is done when its answer has
// all arrived; an ACK alone does not complete it.
bool ResponseComplete(const Inflight& f) { return !UsesResponderResource(f.wqe.op) || f.done; }

}  // namespace

void Engine::CompleteFront(Qp& qp, objects::WcStatus status) {
  Inflight f = std::move(qp.inflight.front());
  qp.inflight.pop_front();
  if (f.wqe.device_work != DeviceWork::kNone) {
    CompleteDeviceWork(qp, f.wqe, status);  // the application never posted it
    return;
  }
  if (qp.sq_outstanding > 0) --qp.sq_outstanding;
  if (!f.wqe.signaled && status == objects::WcStatus::kSuccess) return;
  objects::Cqe c;
  c.wr_id = f.wqe.wr_id;
  c.status = status;
  c.opcode = CompletionOpcode(f.wqe.op);
  c.qp_num = qp.qpn;
  // A FLUSH moves no bytes; its length names the range it made visible.
  c.byte_len = f.wqe.op == SendOp::kFlush ? 0 : static_cast<uint32_t>(f.wqe.length);
  PushCqe(qp, qp.send_cq, c);
}

void Engine::FailQp(Qp& qp, objects::WcStatus status, const std::string& why) {
  Log().warn("{} qp#{} {}→ERR: {} ({})", device_->name(), qp.qpn,
             QpStateName(qp.attrs.state), why, WcStatusName(status));
  if (!qp.inflight.empty()) {
    // The failing WQE completes with the error, signaled or not (IBA 10.8.3.1).
    qp.inflight.front().wqe.signaled = true;
    CompleteFront(qp, status);
  }
  EnterError(qp);
}

void Engine::AckUpTo(Qp& qp, uint32_t psn) {
  // Never past what was sent: a stray ACK must not open the window.
  bool progress = false;
  if (wire::PsnDiff(psn, qp.last_acked_psn) > 0 &&
      wire::PsnDiff(psn, wire::PsnAdd(qp.next_send_psn, -1)) <= 0) {
    qp.cwnd.OnAck(static_cast<uint32_t>(wire::PsnDiff(psn, qp.last_acked_psn)));
    qp.last_acked_psn = psn;
    progress = true;
  }
  while (!qp.inflight.empty()) {
    Inflight& f = qp.inflight.front();
    if (FailedAtAdmission(f)) {
      FailQp(qp, static_cast<objects::WcStatus>(f.read_bytes), "a work request failed locally");
      return;
    }
    // Up to the newest PSN ever acknowledged, not just this one: an ACK that
    // came while a READ before it still waited for its response is not sent
    // again, and the WQEs it covers complete once the READ does.
    if (!f.sent || wire::PsnDiff(qp.last_acked_psn, f.last_psn) < 0) break;
    if (!ResponseComplete(f)) {
      // This ACK is past a READ or atomic whose response never came: the
      // response was lost; ask again (IBA 9.7.5.1.1). (Not when a response
      // of the READ itself brought us here.)
      if (wire::PsnDiff(psn, f.last_psn) >= 0) Rerequest(qp, f);
      break;
    }
    CompleteFront(qp, objects::WcStatus::kSuccess);
    progress = true;
  }
  if (progress) {
    qp.nak_retry_pending = false;
    qp.timeouts_in_row = 0;
    qp.retries_left = qp.attrs.retry_cnt;
    qp.rnr_retries_left = qp.attrs.rnr_retry;
    StartTimer(qp);
  }
}

bool Engine::FailLocally(Qp& qp, const Inflight& f) {
  if (f.local_error == objects::WcStatus::kSuccess) return false;
  // Only the front WQE can fail; one behind an unanswered READ waits (its
  // response comes again when the timer asks for it).
  if (&qp.inflight.front() != &f) return true;
  FailQp(qp, f.local_error,
         fmt::format("the response of WR {} cannot be written: its local buffer is not in a memory region "
                     "with IBV_ACCESS_LOCAL_WRITE of the QP's PD",
                     f.wqe.wr_id));
  return true;
}

void Engine::OnResponse(Qp& qp, const wire::PacketView& packet, Clock::time_point now) {
  if (!IsReliable(qp.type) || qp.inflight.empty()) return;
  const uint32_t psn = packet.psn();
  // XRC's responses are RC's under another prefix.
  const wire::Opcode op = wire::AsRc(packet.opcode());

  if (op == wire::Opcode::RC_ACKNOWLEDGE) {
    const auto aeth = packet.aeth();
    switch (aeth.type()) {
      case wire::AethType::kAck:
        AckUpTo(qp, psn);
        return;
      case wire::AethType::kRnrNak: {
        Count(&qp, &Counters::rnr_naks_received);
        AckUpTo(qp, wire::PsnAdd(psn, -1));
        if (qp.attrs.state == QpState::kErr || qp.inflight.empty()) return;
        if (qp.rnr_retries_left == 0) {
          FailQp(qp, objects::WcStatus::kRnrRetryExcErr,
                 fmt::format("the peer had no receive posted after {} RNR retries", qp.attrs.rnr_retry));
          return;
        }
        if (qp.attrs.rnr_retry != 7) --qp.rnr_retries_left;  // 7 means retry forever
        qp.rnr_waiting = true;
        qp.rnr_until = now + std::chrono::microseconds(kRnrDelayUs[aeth.value() & 31]);
        RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                            "{} qp#{}: RNR NAK for psn {}: the peer has no receive posted; "
                            "resending in {} us ({} RNR retries left)",
                            device_->name(), qp.qpn, psn, kRnrDelayUs[aeth.value() & 31],
                            qp.attrs.rnr_retry == 7 ? "unlimited" : fmt::to_string(qp.rnr_retries_left));
        RetransmitFrom(qp, psn);
        return;
      }
      case wire::AethType::kNak: {
        AckUpTo(qp, wire::PsnAdd(psn, -1));
        if (qp.attrs.state == QpState::kErr || qp.inflight.empty()) return;
        switch (static_cast<wire::NakCode>(aeth.value())) {
          case wire::NakCode::kPsnSequenceError:
            if (qp.nak_retry_pending && psn == qp.nak_retry_psn) return;  // already going back there
            if (qp.retries_left == 0) {
              FailQp(qp, objects::WcStatus::kRetryExcErr,
                     fmt::format("retry count exceeded after {} retries", qp.attrs.retry_cnt));
              return;
            }
            --qp.retries_left;
            qp.nak_retry_pending = true;
            qp.nak_retry_psn = psn;
            RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                                "{} qp#{}: NAK PSN sequence error: the peer lost psn {}; "
                                "resending from it ({} retries left)",
                                device_->name(), qp.qpn, psn, qp.retries_left);
            RetransmitFrom(qp, psn);
            return;
          case wire::NakCode::kInvalidRequest:
            FailQp(qp, objects::WcStatus::kRemInvReqErr, "the responder NAKed an invalid request");
            return;
          case wire::NakCode::kRemoteAccessError:
            FailQp(qp, objects::WcStatus::kRemAccessErr,
                   "the responder refused the rkey, the bounds or the access rights");
            return;
          default:
            FailQp(qp, objects::WcStatus::kRemOpErr, "the responder reported an operational error");
            return;
        }
      }
      case wire::AethType::kReserved:
        return;
    }
    return;
  }

  if (packet.Has(wire::kReadMask)) {
    for (Inflight& f : qp.inflight) {
      if (IsPlacement(f) && f.sent && f.first_psn == psn) {
        if (f.done) return;  // duplicate
        AckUpTo(qp, wire::PsnAdd(psn, -1));
        if (qp.attrs.state == QpState::kErr) return;
        if (!packet.payload().empty() || !packet.Has(wire::kOnlyMask)) {
          FailQp(qp, objects::WcStatus::kBadRespErr,
                 fmt::format("the answer to {} WR {} is a {} with {} bytes, not a zero-length "
                             "RDMA READ RESPONSE ONLY",
                             SendOpName(f.wqe.op), f.wqe.wr_id, packet.info().name,
                             packet.payload().size()));
          return;
        }
        f.done = true;
        AckUpTo(qp, psn);
        return;
      }
      if (!IsRead(f) || !f.sent) continue;
      if (wire::PsnDiff(psn, f.first_psn) < 0 || wire::PsnDiff(psn, f.last_psn) > 0) continue;
      const uint32_t mtu = qp.attrs.path_mtu;
      const uint32_t expected = wire::PsnAdd(f.first_psn, static_cast<int64_t>(f.read_bytes / mtu));
      if (psn != expected || f.done) {
        if (wire::PsnDiff(psn, expected) > 0) {
          // A response was lost: the rest of this read's stream is out of
          // sequence too, and asks nothing more once the read is re-requested.
          Count(&qp, &Counters::out_of_sequence);
          RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                              "{} qp#{}: read response psn {} out of sequence (expected {}): "
                              "asking for the READ again",
                              device_->name(), qp.qpn, psn, expected);
          Rerequest(qp, f);
        }
        return;
      }
      // A read response acknowledges everything before the read.
      AckUpTo(qp, wire::PsnAdd(f.first_psn, -1));
      if (qp.attrs.state == QpState::kErr) return;
      if (FailLocally(qp, f)) return;
      std::span<const uint8_t> data = packet.payload();
      if (f.read_bytes + data.size() > f.wqe.length ||
          (packet.Has(wire::kLastMask) && f.read_bytes + data.size() != f.wqe.length)) {
        FailQp(qp, objects::WcStatus::kBadRespErr, "a read response does not match the request's length");
        return;
      }
      ScatterRange(f.wqe.sges, f.read_bytes, data);
      f.read_bytes += data.size();
      // Data in sequence is progress: the gap (if any) is closed.
      f.rerequested = false;
      qp.timeouts_in_row = 0;
      qp.retries_left = qp.attrs.retry_cnt;
      StartTimer(qp);
      if (packet.Has(wire::kLastMask)) {
        f.done = true;
        AckUpTo(qp, f.last_psn);
      }
      return;
    }
    return;
  }

  if (op == wire::Opcode::RC_ATOMIC_ACKNOWLEDGE) {
    for (Inflight& f : qp.inflight) {
      if (!IsAtomic(f) || f.first_psn != psn || !f.sent) continue;
      if (f.done) return;  // duplicate
      AckUpTo(qp, wire::PsnAdd(psn, -1));
      if (qp.attrs.state == QpState::kErr) return;
      if (FailLocally(qp, f)) return;
      uint64_t orig = packet.atomic_ack_eth().orig_data();
      ScatterRange(f.wqe.sges, 0, std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&orig), 8));
      f.done = true;
      AckUpTo(qp, psn);
      return;
    }
  }
}

std::string Engine::HeardLast(const Qp& qp, Clock::time_point now) const {
  // Whether the peer went silent or the packets stopped reaching this
  // device at all (a wrong address or port, a stopped peer process).
  auto ago = [&](int64_t ns) {
    return ns == 0 ? std::string("never")
                   : fmt::format("{} ms ago", (net::NanosOf(now) - ns) / 1'000'000);
  };
  return fmt::format("no answer came; the last packet for this QP arrived {}, the device's last datagram {}",
                     ago(qp.last_heard_ns.load(std::memory_order_relaxed)),
                     ago(last_datagram_ns_.load(std::memory_order_relaxed)));
}

bool Engine::ReceiveBacklog() {
  if (!receive_backlog_) receive_backlog_ = loop_->ReceivePending();
  return *receive_backlog_;
}

bool Engine::TakeTimeoutToken(Clock::time_point now) {
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(now - timeout_tokens_at_);
  if (elapsed.count() > 0) {
    timeout_tokens_ = static_cast<int>(
        std::min<int64_t>(kTimeoutBurst, timeout_tokens_ + elapsed.count() * kTimeoutsPerMs));
    timeout_tokens_at_ = now;
  }
  if (timeout_tokens_ == 0) return false;
  --timeout_tokens_;
  return true;
}

void Engine::CheckTimers(Qp& qp, Clock::time_point now) {
  if (qp.attrs.state != QpState::kRts && qp.attrs.state != QpState::kSqd) return;
  if (qp.inflight.empty() || qp.rnr_waiting) return;
  if (qp.attrs.timeout == 0 || now < qp.timeout_at) return;
  // A NIC takes in each ACK as it arrives. The emulator, on a busy machine
  // with thousands of QPs answered at once, may still hold the ACK this
  // timer waits for in its own socket: the timer then waits until that
  // backlog is read, for at most one more timeout period (a peer that has
  // gone still fails; a flood cannot hold the timer off for ever). Firing
  // anyway resent every such QP's window into the same backlog, until the
  // socket overflowed and retries ran out (tools/bench --scale, 4,000 QPs).
  if (now < qp.timeout_at + TransportTimeout(qp.attrs.timeout) && ReceiveBacklog()) return;
  // Thousands of QPs sent together time out together, typically because
  // the peer's process is still working through their packets (a NIC would
  // have answered in microseconds). Resending every window at once added
  // the same load again each timeout period until no retry was left. So
  // timeouts are paced per device (TakeTimeoutToken); one that finds no
  // token fires a millisecond later, when OnWork looks again.
  if (!TakeTimeoutToken(now)) return;
  Count(&qp, &Counters::timeouts);
  if (qp.retries_left == 0) {
    if (MigrateOnRetriesExhausted(qp)) return;
    FailQp(qp, objects::WcStatus::kRetryExcErr,
           fmt::format("retry count exceeded after {} retries: {}", qp.attrs.retry_cnt, HeardLast(qp, now)));
    return;
  }
  --qp.retries_left;
  if (qp.timeouts_in_row < 255) ++qp.timeouts_in_row;
  // A sequence NAK after our timeout retransmission is a fresh one.
  qp.nak_retry_pending = false;
  qp.cwnd.OnTimeout(static_cast<uint32_t>(wire::PsnDiff(qp.next_send_psn, qp.last_acked_psn) - 1));
  Log().debug("{} qp#{}: transport timeout, retransmitting from psn {} ({} retries left); "
              "congestion window 1 PSN (slow start up to {})",
              device_->name(), qp.qpn, qp.inflight.front().first_psn, qp.retries_left, qp.cwnd.threshold());
  RetransmitFrom(qp, qp.inflight.front().first_psn);
}

}  // namespace rdmaemu::engine
