// Event channels and the events on them, with the semantics of the
// kernel's ucma event file (rdma_get_cm_event(3)).
//
// `channel->fd` is an eventfd in semaphore mode whose counter equals the
// number of queued events (plus readers between their read() and taking the
// lock), so poll/epoll report readiness exactly while an event is queued, a
// blocking get sleeps in read(), O_NONBLOCK set by the application with
// fcntl turns an empty get into EAGAIN, and each read takes one count, so
// each event goes to exactly one caller however many threads wait. A
// removal (destroy, migrate) takes back one count per removed event; when a
// reader already holds that count, the debt is kept in `owed` and the next
// reader to lock pays it by reading again. (libibverbs' EventQueue does the
// same for completion channels; librdmacm cannot link it.)
//
// Thread safety: every function may be called from any thread, Push from
// the device's threads too (it only locks the channel and writes the fd).
#pragma once

#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "emulator/cm/uapi.h"

namespace rdmaemu::rdmacm {

struct Id;
struct Membership;

// One event. The application sees `event` (first, so the pointer it gets
// is the Event's); the rest is the library's.
struct Event {
  rdma_cm_event event{};
  // Whose counts the event adds to when taken and acked: the id it is for,
  // except CONNECT_REQUEST, which counts against the listener (rdma-core's
  // rule: destroying a listener waits for its requests to be acked).
  Id* owner = nullptr;
  // The id the event is for (the new child for CONNECT_REQUEST).
  Id* target = nullptr;
  // MULTICAST_JOIN/ERROR: the membership it reports, whose own counts it
  // adds to as well (rdma_leave_multicast waits for them).
  Membership* mc = nullptr;
  // What the device reported (the peer's REQ/REP/REJ/SIDR parameters).
  rdmaemu_cm_param param{};
  // Event private data points here, valid until the ack.
  uint8_t private_data[RDMAEMU_CM_MAX_PRIVATE_DATA]{};
};

struct Channel {
  rdma_event_channel channel{};  // first: what the application holds

  std::mutex mu;
  std::deque<Event*> queue;  // guarded by mu
  uint64_t owed = 0;         // counts held by readers for removed events; mu
  std::atomic<int> ids{0};   // ids whose events go here
};

inline Channel* ToChannel(rdma_event_channel* channel) {
  return reinterpret_cast<Channel*>(channel);
}

// A new channel with its eventfd, or NULL with errno.
Channel* NewChannel();
void DeleteChannel(Channel* channel);
// True if `channel` is one NewChannel made and DeleteChannel has not
// deleted; otherwise logs that `verb` was given something else.
bool LiveChannel(const rdma_event_channel* channel, const char* verb);

// Queues `event` on the channel `target` routes to now (the routing can
// change under rdma_migrate_id: the push retries until it holds the lock of
// the channel the id still routes to). Safe on device threads.
void Deliver(Event* event);

// Takes the oldest event: blocks unless the fd is O_NONBLOCK. Counts the
// event as reported to its owner. Returns 0 or -1 with errno.
int Take(Channel* channel, Event** event);

// Removes every queued event of `id` (owned by it or for it) and takes
// their counts back; returns them in order, for the caller to dispose of.
std::vector<Event*> RemoveEvents(Channel* channel, const Id* id);

// Removes every queued event of the membership `mc` the same way.
std::vector<Event*> RemoveEvents(Channel* channel, const Membership* mc);

// Moves the queued events of `id` from channel `from` to `to`, and routes
// `id` (and the children of its queued CONNECT_REQUESTs, whose events move
// too) to `to`. Locks both channels.
void MoveEvents(Id* id, Channel* from, Channel* to);

}  // namespace rdmaemu::rdmacm
