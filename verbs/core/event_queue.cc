#include "verbs/core/event_queue.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "emulator/base/log.h"

namespace rdmaemu::verbs {
namespace {

// The queue whose signals this thread defers (EventQueue::DeferSignals).
thread_local const EventQueue* deferring = nullptr;

// Adds `n` counts to the eventfd.
void Signal(int fd, uint64_t n) {
  // Cannot fail short of the counter overflowing 2^64-2 events.
  if (::write(fd, &n, sizeof n) != sizeof n) {
    Log().error("event queue: eventfd write failed: {}", std::strerror(errno));
  }
}

}  // namespace

EventQueue::DeferSignals::DeferSignals(EventQueue& queue) : previous_(deferring) { deferring = &queue; }

EventQueue::DeferSignals::~DeferSignals() { deferring = previous_; }

EventQueue::~EventQueue() {
  if (fd_ >= 0) ::close(fd_);
}

Status EventQueue::Open() {
  fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd_ < 0) return Status::Error(errno, std::string("eventfd: ") + std::strerror(errno));
  return Status::Ok();
}

void EventQueue::Push(const ibv_async_event& event, const void* object) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Entry{event, object});
    queued_.store(queue_.size(), std::memory_order_release);
    if (deferring == this) {
      ++unsignalled_;
      return;
    }
  }
  Signal(fd_, 1);
}

int EventQueue::Get(ibv_async_event* event) {
  bool taken = false;
  uint64_t rest = 0;
  {
    std::lock_guard lock(mu_);
    if (unsignalled_ > 0 && !queue_.empty()) {
      // One of the events this thread queued with its count deferred: the
      // count is not in the fd, so no read() takes it.
      TakeFront(event);
      taken = true;
      rest = unsignalled_ - 1;
      unsignalled_ = 0;
    }
  }
  if (rest > 0) Signal(fd_, rest);
  if (taken) return 0;
  for (;;) {
    uint64_t count;
    ssize_t n = ::read(fd_, &count, sizeof count);
    if (n != sizeof count) {
      if (n >= 0) errno = EIO;
      return -1;
    }
    std::lock_guard lock(mu_);
    // The count we hold belonged to an event a destroy discarded before we
    // locked: pay that debt and wait for the next event, as the kernel's
    // reader does. (Taking a queued event instead would leave its count in
    // the fd with nothing behind it.)
    if (owed_ > 0) {
      --owed_;
      continue;
    }
    if (queue_.empty()) {  // unreachable while the counts add up
      Log().error("event queue: a count with no event behind it");
      continue;
    }
    TakeFront(event);
    return 0;
  }
}

void EventQueue::TakeFront(ibv_async_event* event) {
  Entry e = queue_.front();
  queue_.pop_front();
  queued_.store(queue_.size(), std::memory_order_release);
  if (e.object != nullptr) ++reported_[e.object];
  *event = e.event;
}

bool EventQueue::TakeBackCount() {
  // A non-blocking read of this one call, whatever the fd's flags: readers
  // blocked in Get are not disturbed. EAGAIN means a reader already holds
  // the count.
  uint64_t count;
  iovec iov{&count, sizeof count};
  if (::preadv2(fd_, &iov, 1, -1, RWF_NOWAIT) >= 0) return true;
  if (errno != EOPNOTSUPP) return false;
  // Kernels without RWF_NOWAIT on eventfds: briefly make the file
  // non-blocking (a concurrent blocking reader may then see EAGAIN).
  int flags = ::fcntl(fd_, F_GETFL);
  bool toggled = flags >= 0 && !(flags & O_NONBLOCK);
  if (toggled) ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  bool taken = ::read(fd_, &count, sizeof count) == sizeof count;
  if (toggled) ::fcntl(fd_, F_SETFL, flags);
  return taken;
}

uint32_t EventQueue::Discard(const void* object) {
  std::lock_guard lock(mu_);
  size_t removed = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->object == object) {
      it = queue_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  queued_.store(queue_.size(), std::memory_order_release);
  for (size_t i = 0; i < removed; ++i) {
    if (unsignalled_ > 0) {
      --unsignalled_;  // its count was never written
    } else if (!TakeBackCount()) {
      ++owed_;
    }
  }
  uint32_t reported = 0;
  if (auto it = reported_.find(object); it != reported_.end()) {
    reported = it->second;
    reported_.erase(it);
  }
  return reported;
}

uint32_t EventQueue::Reported(const void* object) const {
  std::lock_guard lock(mu_);
  auto it = reported_.find(object);
  return it == reported_.end() ? 0 : it->second;
}

}  // namespace rdmaemu::verbs
