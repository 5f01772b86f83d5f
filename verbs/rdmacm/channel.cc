// Event channels: rdma_create_event_channel, rdma_destroy_event_channel,
// and the queue behind each channel's fd (channel.h says how the fd's
// counter stays equal to the queue's length).
#include "verbs/rdmacm/channel.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <unordered_set>

#include <fmt/format.h>

#include "verbs/rdmacm/check.h"
#include "verbs/rdmacm/id.h"
#include "verbs/rdmacm/library.h"
#include "verbs/rdmacm/multicast.h"

namespace rdmaemu::rdmacm {
namespace {

void AddCount(Channel* channel, uint64_t n) {
  if (n == 0) return;
  // Cannot fail short of the counter overflowing 2^64-2 events.
  if (::write(channel->channel.fd, &n, sizeof n) != sizeof n) {
    Log().error("rdma cm: event channel fd {}: eventfd write failed: {}", channel->channel.fd,
                std::strerror(errno));
  }
}

// Takes back one count with a non-blocking read of this one call, whatever
// the fd's flags, so readers blocked in Take are not disturbed. False when a
// reader already holds the count (the fd is empty).
bool TakeBackCount(Channel* channel) {
  uint64_t count;
  iovec iov{&count, sizeof count};
  if (::preadv2(channel->channel.fd, &iov, 1, -1, RWF_NOWAIT) >= 0) return true;
  if (errno != EOPNOTSUPP) return false;
  // Kernels without RWF_NOWAIT on eventfds: briefly make the file
  // non-blocking (a concurrent blocking reader may then see EAGAIN).
  int fd = channel->channel.fd;
  int flags = ::fcntl(fd, F_GETFL);
  bool toggled = flags >= 0 && !(flags & O_NONBLOCK);
  if (toggled) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  bool taken = ::read(fd, &count, sizeof count) == sizeof count;
  if (toggled) ::fcntl(fd, F_SETFL, flags);
  return taken;
}

// Takes back the counts of `n` removed events; mu held.
void TakeBack(Channel* channel, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!TakeBackCount(channel)) ++channel->owed;
  }
}

// Removes the queued events `match` picks and takes their counts back.
template <typename Match>
std::vector<Event*> RemoveQueued(Channel* channel, Match match) {
  std::vector<Event*> removed;
  std::lock_guard lock(channel->mu);
  auto& queue = channel->queue;
  for (auto it = queue.begin(); it != queue.end();) {
    if (match(*it)) {
      removed.push_back(*it);
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
  TakeBack(channel, removed.size());
  return removed;
}

// Every channel made and not yet deleted (LiveChannel): a stale or made-up
// pointer is refused, never followed (its mutex may be garbage: a hang).
std::mutex g_live_mu;
std::unordered_set<const rdma_event_channel*> g_live;  // guarded by g_live_mu

}  // namespace

Channel* NewChannel() {
  auto* channel = new (std::nothrow) Channel;
  if (channel == nullptr) return FailNull<Channel>(ENOMEM);
  channel->channel.fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (channel->channel.fd < 0) {
    int error = errno;
    Log().warn("rdma_create_event_channel: eventfd failed: {}", std::strerror(error));
    delete channel;
    return FailNull<Channel>(error);
  }
  std::lock_guard lock(g_live_mu);
  g_live.insert(&channel->channel);
  return channel;
}

bool LiveChannel(const rdma_event_channel* channel, const char* verb) {
  {
    std::lock_guard lock(g_live_mu);
    if (g_live.contains(channel)) return true;
  }
  Log().warn("{}: {} is not an event channel of this process: destroyed already, a copy, or "
             "never made by rdma_create_event_channel",
             verb, static_cast<const void*>(channel));
  return false;
}

void DeleteChannel(Channel* channel) {
  {
    std::lock_guard lock(g_live_mu);
    g_live.erase(&channel->channel);
  }
  ::close(channel->channel.fd);
  for (Event* event : channel->queue) delete event;
  delete channel;
}

void Deliver(Event* event) {
  Id* id = event->target;
  for (;;) {
    Channel* channel = id->route.load(std::memory_order_acquire);
    std::unique_lock lock(channel->mu);
    // rdma_migrate_id moved the id while we waited for the lock: follow it.
    if (id->route.load(std::memory_order_acquire) != channel) continue;
    channel->queue.push_back(event);
    AddCount(channel, 1);
    return;
  }
}

int Take(Channel* channel, Event** out) {
  for (;;) {
    uint64_t count;
    ssize_t n = ::read(channel->channel.fd, &count, sizeof count);
    if (n != sizeof count) {
      if (n >= 0) errno = EIO;
      return -1;
    }
    std::lock_guard lock(channel->mu);
    // The count we hold belonged to an event removed before we locked: pay
    // that debt and wait for the next event, as the kernel's reader does.
    if (channel->owed > 0) {
      --channel->owed;
      continue;
    }
    if (channel->queue.empty()) {  // unreachable while the counts add up
      Log().error("rdma cm: event channel fd {}: a count with no event behind it",
                  channel->channel.fd);
      continue;
    }
    Event* event = channel->queue.front();
    channel->queue.pop_front();
    {
      // Counted before the channel's lock goes, so a leave or destroy that
      // finds the event gone also finds it counted, and waits for its ack.
      std::lock_guard id_lock(event->owner->mu);
      ++event->owner->reported;
      if (event->mc != nullptr) ++event->mc->reported;
    }
    *out = event;
    return 0;
  }
}

std::vector<Event*> RemoveEvents(Channel* channel, const Id* id) {
  return RemoveQueued(channel, [id](const Event* e) { return e->owner == id || e->target == id; });
}

std::vector<Event*> RemoveEvents(Channel* channel, const Membership* mc) {
  return RemoveQueued(channel, [mc](const Event* e) { return e->mc == mc; });
}

void MoveEvents(Id* id, Channel* from, Channel* to) {
  if (from == to) return;
  // Lock order: by address, so two migrations cannot deadlock.
  std::unique_lock first(from < to ? from->mu : to->mu);
  std::unique_lock second(from < to ? to->mu : from->mu);
  std::unordered_set<const Id*> moving{id};
  for (Event* event : from->queue) {
    if (event->owner == id && event->target != id) moving.insert(event->target);
  }
  size_t moved = 0;
  auto& queue = from->queue;
  for (auto it = queue.begin(); it != queue.end();) {
    if (moving.contains((*it)->target)) {
      to->queue.push_back(*it);
      it = queue.erase(it);
      ++moved;
    } else {
      ++it;
    }
  }
  for (const Id* moved_id : moving) {
    const_cast<Id*>(moved_id)->route.store(to, std::memory_order_release);
  }
  TakeBack(from, moved);
  AddCount(to, moved);
  to->ids.fetch_add(static_cast<int>(moving.size()));
  from->ids.fetch_sub(static_cast<int>(moving.size()));
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu::rdmacm;

extern "C" {

rdma_event_channel* rdma_create_event_channel(void) {
  if (int error = Init(); error != 0) return FailNull<rdma_event_channel>(error);
  Channel* channel = NewChannel();
  if (channel == nullptr) return nullptr;
  CheckTrack(channel, fmt::format("event channel fd {}", channel->channel.fd));
  return &channel->channel;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (channel == nullptr) {
    rdmaemu::Log().warn("rdma_destroy_event_channel: the channel is NULL");
    return;
  }
  if (!LiveChannel(channel, "rdma_destroy_event_channel")) return;
  Channel* ch = ToChannel(channel);
  if (int ids = ch->ids.load(); ids > 0) {
    // The ids would deliver into freed memory: keep the channel (leaked).
    rdmaemu::Log().error(
        "rdma_destroy_event_channel: channel fd {} still has {} id(s) on it: destroy them "
        "(rdma_destroy_id) or move them (rdma_migrate_id) first; the channel is kept",
        channel->fd, ids);
    return;
  }
  {
    std::lock_guard lock(ch->mu);
    if (!ch->queue.empty()) {
      rdmaemu::Log().warn("rdma_destroy_event_channel: channel fd {} has {} unread event(s)",
                          channel->fd, ch->queue.size());
    }
  }
  CheckUntrack(ch);
  DeleteChannel(ch);
}

}  // extern "C"
