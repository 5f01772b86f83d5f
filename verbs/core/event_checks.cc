// The checker's event checks (event_checks.h).
#include "verbs/core/event_checks.h"

#include <fcntl.h>
#include <poll.h>

#include <string>

#include <fmt/format.h>

#include "provider/check/check.h"
#include "provider/handles.h"
#include "provider/provider.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {
namespace {

using provider::Kind;

// The handles table names live objects; a retired one (being destroyed)
// is named by its pointer.
std::string NameOf(const void* object, Kind kind) {
  return provider::HandleName(object, kind);
}

void ReportUnacked(const void* object, Kind kind, const char* what, unsigned missing) {
  check::Report(check::Kind::kAckMismatch,
                fmt::format("{} {} event(s) returned for {} were never acknowledged when the "
                            "program exited; every event ibv_get_*_event returns must be "
                            "acknowledged (ibv_ack_cq_events / ibv_ack_async_event), or destroying "
                            "the object waits forever",
                            missing, what, NameOf(object, kind)),
                check::CaptureStack());
}

// At exit: every live CQ, QP, SRQ and WQ whose returned events outnumber
// its acknowledgements.
void UnacknowledgedScan() {
  for (const void* p : provider::LiveHandles(Kind::kCq)) {
    auto* cq = static_cast<ibv_cq*>(const_cast<void*>(p));
    if (cq->channel != nullptr) {
      unsigned reported = ToChannel(cq->channel)->events.Reported(cq);
      if (reported > cq->comp_events_completed) {
        ReportUnacked(cq, Kind::kCq, "completion", reported - cq->comp_events_completed);
      }
    }
    unsigned reported = Private(cq->context)->async_events.Reported(cq);
    if (reported > cq->async_events_completed) {
      ReportUnacked(cq, Kind::kCq, "async", reported - cq->async_events_completed);
    }
  }
  for (const void* p : provider::LiveHandles(Kind::kQp)) {
    auto* qp = static_cast<ibv_qp*>(const_cast<void*>(p));
    unsigned reported = Private(qp->context)->async_events.Reported(qp);
    if (reported > qp->events_completed) {
      ReportUnacked(qp, Kind::kQp, "async", reported - qp->events_completed);
    }
  }
  for (const void* p : provider::LiveHandles(Kind::kSrq)) {
    auto* srq = static_cast<ibv_srq*>(const_cast<void*>(p));
    unsigned reported = Private(srq->context)->async_events.Reported(srq);
    if (reported > srq->events_completed) {
      ReportUnacked(srq, Kind::kSrq, "async", reported - srq->events_completed);
    }
  }
}

}  // namespace

void CheckAckCount(const char* verb, const void* object, Kind object_kind, const char* kind,
                   unsigned completed, unsigned reported) {
  // A destroy has taken the object's returned count already, and waits for
  // its acknowledgements itself.
  if (completed <= reported || provider::Retired(object)) return;
  check::Report(check::Kind::kAckMismatch,
                fmt::format("{} acknowledged {} {} event(s) of {}, but ibv_get_*_event returned only {} "
                            "of them: rdma-core's destroy waits until the two counts are "
                            "equal, so destroying it would hang; acknowledge exactly the events "
                            "you got",
                            verb, completed, kind, NameOf(object, object_kind), reported),
                check::CaptureStack());
}

void ReportDestroyWaiting(const char* what, const void* object, unsigned missing) {
  check::Report(check::Kind::kAckMismatch,
                fmt::format("destroying {} {} has waited a second for {} event(s) returned by "
                            "ibv_get_*_event and never acknowledged, and will wait forever: "
                            "acknowledge each event (ibv_ack_cq_events / ibv_ack_async_event) "
                            "before destroying",
                            what, object, missing),
                check::CaptureStack());
}

void WatchCqEventWait(ibv_comp_channel* channel) {
  int flags = ::fcntl(channel->fd, F_GETFL);
  if (flags < 0 || (flags & O_NONBLOCK)) return;  // it will not block
  pollfd p{channel->fd, POLLIN, 0};
  if (::poll(&p, 1, 1000) != 0) return;  // an event (or an error the read will see)
  int cqs = 0;
  for (const void* object : provider::LiveHandles(Kind::kCq)) {
    auto* cq = static_cast<ibv_cq*>(const_cast<void*>(object));
    if (cq->channel != channel) continue;
    ++cqs;
    if (provider::CqArmed(cq)) return;
  }
  check::Report(check::Kind::kUnarmedWait,
                fmt::format("ibv_get_cq_event has blocked for a second on completion channel fd {} "
                            "and none of its {} CQ(s) is armed, so no event can ever come: a CQ "
                            "notifies once per ibv_req_notify_cq; arm it before waiting, and again "
                            "after each event, before polling",
                            channel->fd, cqs),
                check::CaptureStack());
}

void WatchUnacknowledgedAtExit() { check::AtExit(UnacknowledgedScan); }

}  // namespace rdmaemu::verbs
