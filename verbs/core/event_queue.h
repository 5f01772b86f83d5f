// EventQueue: the queue behind a completion channel's fd and a context's
// async_fd, with the semantics of the kernel's uverbs event files.
//
// The fd is an eventfd in semaphore mode whose counter equals the number of
// queued events (plus readers between their read() and taking the lock), so
// poll/epoll report readiness exactly while an event is queued, a blocking
// get sleeps in read(), and O_NONBLOCK set by the application with fcntl
// turns an empty get into EAGAIN. Each read takes one count, so each event
// goes to exactly one caller however many threads wait.
//
// A discard takes back one count per removed event. When a reader already
// holds that count (it has read() but not yet locked), the take-back finds
// the fd empty; the debt is remembered in `owed_` and the next reader to
// lock pays it by waiting again, so the counter never outlives the queue.
//
// A thread that is about to take an event itself (ibv_get_cq_event, while
// it drives the device) may defer the fd's counts of the events it queues
// meanwhile (DeferSignals): its Get then takes one of them with no read()
// and writes the counts of the rest, so an event the waiter queued and
// takes at once costs no eventfd write and read. The counts are only late
// within that one call: no other thread could have taken the event first
// in a way the program can tell, since the caller takes one in the same call.
//
// "Reported" counts, per object, the events the application has taken; a
// destroy waits until its acks equal that count. Events discarded at destroy
// were never reported and give their counts back.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "emulator/base/status.h"

namespace rdmaemu::verbs {

class EventQueue {
 public:
  EventQueue() = default;
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  Status Open();
  int fd() const { return fd_; }

  // `object` is the pointer whose reported count the event adds to when it
  // is taken (the CQ, QP, SRQ or WQ), or nullptr for port/device events.
  void Push(const ibv_async_event& event, const void* object);

  // While it lives, Push on this thread to `queue` leaves the fd's count
  // owed instead of writing it; the thread must call queue.Get next.
  class DeferSignals {
   public:
    explicit DeferSignals(EventQueue& queue);
    ~DeferSignals();
    DeferSignals(const DeferSignals&) = delete;
    DeferSignals& operator=(const DeferSignals&) = delete;

   private:
    const EventQueue* previous_;
  };

  // Takes the oldest event: blocks unless the fd is O_NONBLOCK. Returns 0,
  // or -1 with errno (EAGAIN, EINTR, …) as read() sets it.
  int Get(ibv_async_event* event);

  // Removes the object's queued events and returns how many events of it
  // the application has taken over the object's life.
  uint32_t Discard(const void* object);

  size_t size() const { return queued_.load(std::memory_order_acquire); }
  // The queue's length, read without a lock or a syscall (a thread waiting
  // for the channel checks it after each datagram it handles).
  const std::atomic<size_t>& queued() const { return queued_; }

  // How many events of `object` the application has taken so far.
  uint32_t Reported(const void* object) const;

 private:
  struct Entry {
    ibv_async_event event;
    const void* object;
  };
  // mu_ held, queue not empty: takes the oldest event for the caller.
  void TakeFront(ibv_async_event* event);
  // True if a count was taken back, false if a reader holds it.
  bool TakeBackCount();

  int fd_ = -1;
  mutable std::mutex mu_;
  std::deque<Entry> queue_;                               // guarded by mu_
  std::unordered_map<const void*, uint32_t> reported_;   // guarded by mu_
  uint64_t owed_ = 0;  // counts held by readers for discarded events; mu_
  // Queued events whose counts were deferred (DeferSignals) and not yet
  // written to the fd; mu_.
  uint64_t unsignalled_ = 0;
  std::atomic<size_t> queued_{0};  // queue_.size(), stored under mu_
};

}  // namespace rdmaemu::verbs
