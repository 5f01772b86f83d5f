// Completion queues and completion channels, and the event get/ack verbs.
#include <pthread.h>
#include <time.h>

#include <cerrno>

#include "emulator/base/log.h"
#include "provider/check/check.h"
#include "provider/check/ops.h"
#include "provider/provider.h"
#include "provider/check/quarantine.h"
#include "verbs/core/event_checks.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {

void WaitForAcks(pthread_mutex_t* mutex, pthread_cond_t* cond, const unsigned* completed,
                 unsigned reported, const unsigned* completed2, unsigned reported2,
                 const char* what, const void* object) {
  pthread_mutex_lock(mutex);
  bool warned = false;
  timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 1;
  // Compared with != as rdma-core does: acknowledging more events than were
  // read hangs too, which is the application's bug to see.
  while (*completed != reported || (completed2 != nullptr && *completed2 != reported2)) {
    // Too many acknowledgements were reported when they were made; the
    // checker lets the destroy go on rather than hang as rdma-core does.
    if (check::On() && (*completed > reported || (completed2 != nullptr && *completed2 > reported2))) {
      break;
    }
    if (warned) {
      pthread_cond_wait(cond, mutex);
      continue;
    }
    if (pthread_cond_timedwait(cond, mutex, &deadline) == ETIMEDOUT) {
      unsigned missing = reported - *completed;
      if (completed2 != nullptr) missing += reported2 - *completed2;
      Log().warn("{} {}: destroy is waiting for {} unacknowledged event(s): every event "
                 "returned by ibv_get_*_event must be acknowledged (ibv_ack_*_event[s])",
                 what, object, missing);
      if (check::On()) ReportDestroyWaiting(what, object, missing);
      warned = true;
    }
  }
  pthread_mutex_unlock(mutex);
}

ibv_cq_ex* LibCreateCqEx(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  if (attr->wc_flags & ~uint64_t{IBV_CREATE_CQ_SUP_WC_FLAGS}) return FailWith<ibv_cq_ex>(EOPNOTSUPP);
  auto created = provider::CreateCq(context, *attr);
  if (!created.ok()) return FailWith<ibv_cq_ex>(created.status().code());
  ibv_cq* cq = ibv_cq_ex_to_cq(*created);
  cq->context = context;
  cq->cq_context = attr->cq_context;
  cq->comp_events_completed = 0;
  cq->async_events_completed = 0;
  pthread_mutex_init(&cq->mutex, nullptr);
  pthread_cond_init(&cq->cond, nullptr);
  pthread_mutex_lock(&context->mutex);
  cq->channel = attr->channel;
  if (attr->channel != nullptr) ++attr->channel->refcnt;
  pthread_mutex_unlock(&context->mutex);
  if (check::On()) check::WrapCqEx(*created);
  return *created;
}

}  // namespace rdmaemu::verbs

using namespace rdmaemu;
using namespace rdmaemu::verbs;
using rdmaemu::provider::Kind;
using rdmaemu::provider::LiveHandle;

extern "C" {

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (!LiveHandle(context, Kind::kContext, "ibv_create_comp_channel")) {
    return FailWith<ibv_comp_channel>(kNoSuchObject);
  }
  if (Status dead = provider::DeadDevice(context, "ibv_create_comp_channel"); !dead.ok()) {
    return FailWith<ibv_comp_channel>(dead.code());
  }
  auto* channel = new CompChannel();
  if (Status s = channel->events.Open(); !s.ok()) {
    delete channel;
    return FailWith<ibv_comp_channel>(s.code());
  }
  channel->ibv.context = context;
  channel->ibv.fd = channel->events.fd();
  channel->ibv.refcnt = 0;
  provider::AddHandle(&channel->ibv, Kind::kCompChannel, context);
  return &channel->ibv;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  ibv_context* context = LiveHandle(channel, Kind::kCompChannel, "ibv_destroy_comp_channel");
  if (context == nullptr) return FailInt(kNoSuchObjectToDestroy);
  pthread_mutex_lock(&context->mutex);
  if (channel->refcnt != 0) {
    pthread_mutex_unlock(&context->mutex);
    Log().warn("ibv_destroy_comp_channel: {} CQ(s) still use channel fd {}; destroy them first",
               channel->refcnt, channel->fd);
    return FailInt(EBUSY);
  }
  pthread_mutex_unlock(&context->mutex);
  provider::RemoveHandle(channel);
  check::Dispose(ToChannel(channel));
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                      int comp_vector) {
  if (!LiveHandle(context, Kind::kContext, "ibv_create_cq")) return FailWith<ibv_cq>(kNoSuchObject);
  if (cqe < 1 || comp_vector < 0) return FailWith<ibv_cq>(EINVAL);
  ibv_cq_init_attr_ex attr{};
  attr.cqe = static_cast<uint32_t>(cqe);
  attr.cq_context = cq_context;
  attr.channel = channel;
  attr.comp_vector = static_cast<uint32_t>(comp_vector);
  ibv_cq_ex* cq = LibCreateCqEx(context, &attr);
  return cq == nullptr ? nullptr : ibv_cq_ex_to_cq(cq);
}

int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!LiveHandle(cq, Kind::kCq, "ibv_resize_cq")) return FailInt(kNoSuchObject);
  return provider::ResizeCq(cq, cqe);
}

int ibv_destroy_cq(ibv_cq* cq) {
  ibv_context* context = LiveHandle(cq, Kind::kCq, "ibv_destroy_cq");
  if (context == nullptr) return FailInt(kNoSuchObjectToDestroy);
  ibv_comp_channel* channel = cq->channel;
  if (int rc = provider::DetachCq(cq); rc != 0) return FailInt(rc);
  unsigned comp_reported = channel != nullptr ? ToChannel(channel)->events.Discard(cq) : 0;
  unsigned async_reported = Private(context)->async_events.Discard(cq);
  WaitForAcks(&cq->mutex, &cq->cond, &cq->comp_events_completed, comp_reported,
              &cq->async_events_completed, async_reported, "cq", cq);
  if (channel != nullptr) {
    pthread_mutex_lock(&context->mutex);
    --channel->refcnt;
    pthread_mutex_unlock(&context->mutex);
  }
  provider::FreeCq(cq);
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  // rdma-core reads the channel's fd: a channel destroyed has none (EBADF).
  if (!LiveHandle(channel, Kind::kCompChannel, "ibv_get_cq_event")) {
    errno = EBADF;
    return -1;
  }
  if (check::On()) {
    WatchUnacknowledgedAtExit();
    WatchCqEventWait(channel);
  }
  EventQueue& events = ToChannel(channel)->events;
  {
    // What this thread completes while it waits, it takes itself below.
    EventQueue::DeferSignals defer(events);
    provider::AwaitCompletionEvent(channel->context, channel->fd, events.queued());
  }
  ibv_async_event ev;
  if (events.Get(&ev) != 0) return -1;
  *cq = ev.element.cq;
  *cq_context = (*cq)->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!provider::AckableHandle(cq, Kind::kCq, "ibv_ack_cq_events")) return;
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  unsigned completed = cq->comp_events_completed;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
  if (check::On() && cq->channel != nullptr) {
    CheckAckCount("ibv_ack_cq_events", cq, Kind::kCq, "completion", completed,
                  ToChannel(cq->channel)->events.Reported(cq));
  }
}

int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!LiveHandle(context, Kind::kContext, "ibv_get_async_event")) {
    errno = EBADF;  // as a read of the async fd of a closed context
    return -1;
  }
  if (check::On()) WatchUnacknowledgedAtExit();
  return Private(context)->async_events.Get(event);
}

void ibv_ack_async_event(ibv_async_event* event) {
  pthread_mutex_t* mutex = nullptr;
  pthread_cond_t* cond = nullptr;
  unsigned* counter = nullptr;
  const void* element = nullptr;
  Kind kind = Kind::kQp;
  switch (ElementOf(event->event_type)) {
    case EventElement::kCq: {
      ibv_cq* cq = event->element.cq;
      mutex = &cq->mutex, cond = &cq->cond, counter = &cq->async_events_completed;
      element = cq, kind = Kind::kCq;
      break;
    }
    case EventElement::kQp: {
      ibv_qp* qp = event->element.qp;
      mutex = &qp->mutex, cond = &qp->cond, counter = &qp->events_completed;
      element = qp, kind = Kind::kQp;
      break;
    }
    case EventElement::kSrq: {
      ibv_srq* srq = event->element.srq;
      mutex = &srq->mutex, cond = &srq->cond, counter = &srq->events_completed;
      element = srq, kind = Kind::kSrq;
      break;
    }
    case EventElement::kWq: {
      ibv_wq* wq = event->element.wq;
      mutex = &wq->mutex, cond = &wq->cond, counter = &wq->events_completed;
      element = wq, kind = Kind::kWq;
      break;
    }
    case EventElement::kPort:
      return;  // port and device events carry no counter
  }
  if (!provider::AckableHandle(element, kind, "ibv_ack_async_event")) return;
  pthread_mutex_lock(mutex);
  unsigned completed = ++*counter;
  pthread_cond_signal(cond);
  pthread_mutex_unlock(mutex);
  if (check::On()) {
    ibv_context* context = nullptr;
    switch (kind) {
      case Kind::kCq: context = event->element.cq->context; break;
      case Kind::kQp: context = event->element.qp->context; break;
      case Kind::kSrq: context = event->element.srq->context; break;
      default: context = event->element.wq->context; break;
    }
    CheckAckCount("ibv_ack_async_event", element, kind, "async", completed,
                  Private(context)->async_events.Reported(element));
  }
}

}  // extern "C"
