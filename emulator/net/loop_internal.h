// What both Loop backends share: the thread, the doorbell protocol, the
// deadline, the counters and the pool of send slots. Private to :loop.
#pragma once

#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "emulator/net/loop.h"

namespace rdmaemu::net::internal {

using Clock = std::chrono::steady_clock;

// How long a send that met ENOBUFS (or an EAGAIN with no way to poll for
// writability) waits before it is tried again.
inline constexpr std::chrono::milliseconds kSendRetryDelay{1};

std::string ErrnoText(int err);

// Counters written by the loop thread only (doorbell_writes excepted), read by
// any thread. A single writer needs no read-modify-write: Add is a plain
// load and store, so counting costs no locked instruction.
struct Counters {
  std::atomic<uint64_t> datagrams_received{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> datagrams_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> send_errors{0};
  std::atomic<uint64_t> send_drops{0};
  std::atomic<uint64_t> send_retries{0};
  std::atomic<uint64_t> receive_errors{0};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> work_calls{0};
  std::atomic<uint64_t> wakeups{0};
  std::atomic<uint64_t> doorbell_writes{0};  // any thread: fetch_add
  std::atomic<uint64_t> gso_sends{0};
  std::atomic<uint64_t> gro_receives{0};
};

inline void Add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// One datagram waiting to be sent: a copy of its bytes (one piece, inside
// `storage`), or of its header and trailer around a borrowed payload
// (Gathered::kBorrowPayload), and a msghdr that points at them, stable in
// memory while the kernel holds it.
struct SendSlot {
  int socket = 0;  // which of the loop's sockets sends it
  uint8_t tos = 0;
  sockaddr_in to{};
  std::array<iovec, 3> iov{};  // the first msg.msg_iovlen are the datagram's pieces
  size_t length = 0;           // the datagram's bytes, all pieces
  msghdr msg{};
  std::vector<uint8_t> storage;  // keeps its capacity between uses
  int64_t arena_ticket = -1;     // its copy lies in the pool's CopyArena instead
  // An IP_TOS control message when the datagram has a traffic class.
  union {
    cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(int))];
  } control{};
};

// Where the copies of consecutive datagrams lie end to end, so that a GSO
// send of them hands the kernel one piece (BuildGso joins adjacent pieces):
// Linux copies a run of datagrams given as one piece faster than the same
// bytes given as one piece per datagram (tests/bench/udp_ceiling, gso_32k
// against gso_32k_copied: about 15% less of the sender's time). A ring of
// bytes; allocations are freed in any order and the tail moves past those
// freed at the front. When every allocation is free it starts over at the
// beginning, so a sender that flushes each batch keeps reusing the same,
// cached, bytes. Full, it declines and the slot copies into its own storage.
class CopyArena {
 public:
  static constexpr size_t kBytes = 1 << 20;

  // `bytes` at the head (after the previous allocation where there is
  // room), or nullptr. *ticket names it for Free.
  uint8_t* Allocate(size_t bytes, int64_t* ticket);
  void Free(int64_t ticket);

 private:
  struct Span {
    size_t offset = 0;
    bool freed = false;
  };
  std::vector<uint8_t> memory_;  // kBytes, on first use
  std::deque<Span> live_;        // in allocation order
  int64_t front_ticket_ = 0;     // live_.front()'s ticket
  size_t head_ = 0;              // where the next allocation starts
};

// At most kMaxPendingSends slots, created on first use and then reused, so
// memory follows the largest burst actually seen. Loop thread only.
class SendPool {
 public:
  // A free slot filled with the datagram, or -1 if all are in use.
  int Acquire(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos = 0,
              Gathered gathered = Gathered::kCopy);
  void Release(int id);
  SendSlot& operator[](int id) { return *slots_[id]; }
  size_t in_use() const { return slots_.size() - free_.size(); }

 private:
  CopyArena arena_;
  std::vector<std::unique_ptr<SendSlot>> slots_;
  std::vector<int> free_;
};

// UDP GSO (UDP_SEGMENT): consecutive datagrams of one socket to one
// unicast destination with one TOS, each the size of the first but the
// last (which may be shorter), leave in one send and cross the kernel's
// stack as one packet, which the kernel cuts into the datagrams again at
// the receiving socket (or, one with UDP_GRO on, hands it over whole). The
// packets of one RDMA message are such a run.
inline constexpr int kMaxGsoSegments = 64;  // UDP_MAX_SEGMENTS before Linux 6.9
inline constexpr size_t kMaxGsoBytes = 65507;  // an IPv4 datagram's payload
// The pieces of one GSO send: enough for its most datagrams, copied (one
// piece each), or for the most 4 KiB payloads it can carry, borrowed
// (three pieces each).
inline constexpr int kMaxGsoPieces = 2 * kMaxGsoSegments;

// One send of one or more queued datagrams.
struct GsoMessage {
  msghdr msg{};
  int count = 0;  // datagrams it carries, from the first
  std::array<iovec, kMaxGsoPieces> iov{};
  // UDP_SEGMENT and IP_TOS.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(uint16_t)) + CMSG_SPACE(sizeof(int))]{};
};

// Fills `out` with the longest run of slots, `id_at(0)`, `id_at(1)`, ...
// (at most `available`), that can leave as one GSO send. With `gso` false,
// or a run of one, `out` is the first slot's own message.
void BuildGso(SendPool& pool, const std::function<int(int)>& id_at, int available, bool gso,
              GsoMessage* out);
// The datagrams of one receive: `data` itself, or, where UDP GRO kept
// several together (`segment` > 0, from the UDP_GRO control message), its
// pieces of `segment` bytes, the last one shorter or equal.
template <typename F>
void ForEachDatagram(std::span<const uint8_t> data, size_t segment, F&& each) {
  if (segment == 0 || data.size() <= segment) {
    each(data);
    return;
  }
  for (size_t at = 0; at < data.size(); at += segment) each(data.subspan(at, std::min(segment, data.size() - at)));
}

// Whether a GSO send failed with `err` because of GSO itself (a kernel or
// route without it), so that the same datagrams sent one by one may not.
bool GsoRefused(int err);

// Receiving and sending with plain system calls: recvmmsg batches per
// socket, sendmmsg batches of consecutive datagrams for one socket, from a
// FIFO of SendPool slots. All of the epoll backend's I/O, and what any
// backend does on an application thread that drives (Loop::Drive). Used by
// the thread holding the drive lock only.
class DirectIo {
 public:
  static constexpr int kBatch = 64;  // datagrams per recvmmsg / sendmmsg

  explicit DirectIo(Counters& counters) : counters_(counters) {}
  ~DirectIo();
  DirectIo(const DirectIo&) = delete;
  DirectIo& operator=(const DirectIo&) = delete;

  // Receives what `fd` holds (at most kReceiveRounds batches) as socket
  // `owner`'s and hands each batch to `handler`; true if any was delivered.
  bool ReceiveAll(int fd, int owner, LoopHandler& handler, const std::atomic<bool>& stop);
  // Queues a copy of one datagram; a full queue drops it (send_drops).
  // True when a batch is full and the caller should Flush.
  bool Queue(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos,
             Gathered gathered = Gathered::kCopy);
  enum class Flushed { kAll, kWouldBlock, kNoBuffers };
  // Sends what is queued, in order, through `fds` (by socket index). Stops at
  // a socket whose buffer is full (kWouldBlock, *blocked_socket says which)
  // or at ENOBUFS, keeping the rest queued; a datagram refused for good is
  // counted (send_errors) and dropped.
  Flushed Flush(std::span<const int> fds, int* blocked_socket);
  bool empty() const { return queue_size_ == 0; }
  size_t size() const { return queue_size_; }
  bool gso() const { return gso_; }

 private:
  static constexpr int kReceiveRounds = 16;  // recvmmsg calls per drain, then others get a turn

  // Room for the IP_PKTINFO, IP_TOS and UDP_GRO control messages, aligned
  // for cmsghdr.
  union Control {
    cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(in_pktinfo)) + 2 * CMSG_SPACE(sizeof(int))];
  };

  Counters& counters_;
  uint8_t* buffers_ = nullptr;  // kBatch receive buffers, mapped on first use
  std::array<sockaddr_in, kBatch> names_{};
  std::array<Control, kBatch> controls_{};
  std::array<iovec, kBatch> iovs_{};
  std::array<mmsghdr, kBatch> msgs_{};
  std::vector<Datagram> batch_;  // one receive may hold many (UDP GRO)
  std::array<mmsghdr, kBatch> send_msgs_{};
  std::array<GsoMessage, kBatch> gso_messages_{};  // what send_msgs_[k] carries
  bool gso_ = true;  // off once the kernel refused a GSO send
  SendPool pool_;
  // FIFO of slot ids waiting to be sent: a ring of kMaxPendingSends entries.
  std::vector<int> queue_ = std::vector<int>(kMaxPendingSends);
  size_t queue_head_ = 0;
  size_t queue_size_ = 0;
};

// The part of a Loop that does not depend on the backend. A backend
// implements Run(), which returns when stop_requested(); its destructor must
// call Stop() first, while its own members still exist.
// A group socket on its way into a backend (Loop::AddGroupSocket).
struct GroupSocket {
  uint32_t handle = 0;
  int owner = 0;
  UdpSocket socket;
};
// Group handles start above every socket index, so a backend can tell the
// two apart in one number (io_uring user_data, epoll data).
inline constexpr uint32_t kFirstGroupHandle = 16;

class LoopBase : public Loop {
 public:
  LoopBase(Backend backend, std::vector<UdpSocket> sockets, LoopHandler* handler, int doorbell_fd);
  ~LoopBase() override;

  Backend backend() const override { return backend_; }
  const sockaddr_in& address(int socket = 0) const override { return sockets_.at(socket).address(); }
  int num_sockets() const override { return static_cast<int>(sockets_.size()); }
  using Loop::Send;
  void Start() override;
  void Stop() override;
  void Ring() override;
  bool Drive(bool receive, SendBatching batching = SendBatching::kOff) override;
  bool Inject(std::span<const Datagram> batch) override;
  void Release() override;
  bool BeginWait(std::vector<int>* fds) override;
  void EndWait() override;
  bool InLoopThread() const override;
  bool ReceivePending() const override;
  LoopStats stats() const override;
  uint32_t AddGroupSocket(int owner, UdpSocket socket) override;
  void RemoveGroupSocket(uint32_t handle) override;

 protected:
  virtual void Run() = 0;

  int socket_fd(int socket) const { return sockets_[socket].fd(); }
  // Every socket's fd, by index (what DirectIo::Flush takes).
  std::span<const int> socket_fds() const { return {fds_.data(), sockets_.size()}; }
  int doorbell_fd() const { return doorbell_fd_; }
  LoopHandler& handler() { return *handler_; }
  Counters& counters() { return counters_; }
  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }
  const std::atomic<bool>& stop_flag() const { return stop_; }

  // Aborts with a message when Send is called by a thread not driving.
  void CheckDriving(const char* what) const;
  // True when the caller, who drives (Send's callers do), is an
  // application thread inside Drive rather than the loop thread.
  bool DrivenByApplication() const { return !InLoopThread(); }

  // The drive lock, loop side: the loop thread holds it whenever it is not
  // blocked in the kernel. ReleaseToSleep lets go before a wait that ends
  // at `until` (nullopt: no deadline); Acquire takes it back after.
  void AcquireDrive();
  void ReleaseToSleep(std::optional<Clock::time_point> until);
  // A driver, drive lock held, whose round gave the loop an earlier
  // deadline (NextWake): whether the sleeping loop thread must be rung to
  // see it.
  bool LoopWakesTooLate() const;
  // After a wait that timed out with nothing to do, lock not held: true if
  // applications still drive and the loop's own deadline (the `until` of
  // ReleaseToSleep) is not due, so it may wait again, without the lock,
  // until *hold (set here) or that deadline; PrepareToSleep has been done.
  // The steady state of a polling program costs the loop one wakeup per
  // kDriveHold and never contends for the lock.
  bool SleepAgain(Clock::time_point now, std::optional<Clock::time_point>* hold);
  // Whether application threads are driving the receive side (they did
  // within kDriveHold of `now`), and until when that holds: kForever while
  // one waits with the sockets (BeginWait).
  std::optional<Clock::time_point> ApplicationHold(Clock::time_point now) const;
  static constexpr Clock::time_point kForever = Clock::time_point::max();
  // The loop thread, about to sleep: ApplicationHold, and where that is
  // kForever, marks the loop as parked for EndWait to ring.
  std::optional<Clock::time_point> HoldForSleep(Clock::time_point now);
  // The end of the applications' hold as a timer (a timerfd) that the loop
  // thread sleeps on with its other fds, rather than as the timeout of its
  // wait: a driver pushes it forward (PushHoldTimer), so a program that
  // keeps polling never wakes the loop thread. Loop thread, drive lock
  // held, before it sleeps: sets it to `hold`'s end (disarms it for none
  // or kForever). False where there is no timer: the wait's timeout then
  // includes the hold, and SleepAgain looks at it on each timeout.
  bool SetHoldTimer(std::optional<Clock::time_point> hold);
  int hold_timer_fd() const { return hold_timer_fd_; }
  // Loop thread, after the timer's fd came up (epoll) or its read ended
  // (io_uring has read it itself).
  void DrainHoldTimer();
  // Drive lock held: whether the loop thread has let go of every socket
  // (epoll: it no longer watches them; io_uring: their ring receives have
  // ended, and drivers may read them).
  virtual bool SocketsHandedOver() const { return true; }

  // Drive's backend part, drive lock held: receive what the sockets hold
  // (true if anything was delivered), and send what the handler queued.
  virtual bool DriveReceive() = 0;
  virtual void DriveFlush() = 0;
  // Drive lock held: datagrams queued by drivers and not yet sent.
  virtual size_t DriveQueued() const = 0;

  // The doorbell protocol, loop side (see Ring() in loop.cc for the whole).
  // PrepareToSleep announces that the loop is about to block and returns
  // false if it must not, because a ring or a stop is already pending.
  bool PrepareToSleep();
  void AfterSleep();
  // True once per batch of Ring() calls; the loop then calls OnWork.
  bool TakeRing();

  // The handler's deadline and the backend's own retry time, whichever is
  // first; nullopt if neither is set.
  std::optional<Clock::time_point> NextWake() const;
  void SetRetryAt(Clock::time_point t) { retry_at_ = t; }
  void ClearRetry() { retry_at_.reset(); }
  bool RetryDue(Clock::time_point now) const { return retry_at_ && now >= *retry_at_; }
  bool RetryPending() const { return retry_at_.has_value(); }

  // Drive lock held, by a driver whose sends may wait (SendBatching): true
  // while fewer than kPostBatch wait; they then leave by kPostWait from the
  // first of them (flush_by_, a wake of the loop thread's) at the latest.
  bool SendsMayWait(Clock::time_point now);
  // Drive lock held: DriveFlush, and flush_by_ is met.
  void SendQueued();

  // Calls OnWork if anything asks for it: datagrams were delivered, the
  // doorbell rang, or the deadline passed (or always, with `force`).
  void MaybeWork(bool delivered, bool force = false);

  // Loop thread: the group sockets added and the handles removed since the
  // last call, in that order (a handle added and removed in between comes
  // in both). False, touching nothing, when there are none.
  bool TakeGroupChanges(std::vector<GroupSocket>* added, std::vector<uint32_t>* removed);

 private:
  void ThreadMain();
  int64_t CpuNanos() const;
  // Drive lock held: the hold timer at `at_ns` (steady clock; 0 disarms).
  void ArmHoldTimer(int64_t at_ns);
  // A driver, drive lock held: moves the timer to kDriveHold from now when
  // the sleeping loop thread would wake for it soon.
  void PushHoldTimer(int64_t now_ns);

  // Constant after construction.
  const Backend backend_;
  const std::vector<UdpSocket> sockets_;
  std::array<int, kMaxSockets> fds_{};  // sockets_[i].fd()
  LoopHandler* const handler_;
  const int doorbell_fd_;
  const int hold_timer_fd_;  // -1 if the kernel refused one

  // Owner thread only.
  std::thread thread_;
  clockid_t cpu_clock_{};

  // Shared between the posting threads and the loop thread.
  std::atomic<bool> stop_{false};
  std::atomic<bool> ring_pending_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> running_{false};
  std::atomic<std::thread::id> loop_thread_{};
  std::atomic<int64_t> final_cpu_ns_{0};
  Counters counters_;

  // The drive lock and what it guards besides the backend's state: whether
  // the loop thread sleeps, and until when (so that a driver that moves the
  // deadline earlier wakes it).
  std::mutex drive_mu_;
  std::atomic<std::thread::id> driver_{};  // who holds drive_mu_
  std::atomic<bool> loop_waiting_{false};  // the loop thread waits for drive_mu_
  bool asleep_ = false;                    // guarded by drive_mu_
  std::optional<Clock::time_point> asleep_until_;  // guarded by drive_mu_
  int64_t hold_timer_ns_ = 0;  // its expiry (0: disarmed); guarded by drive_mu_
  // When an application thread last drove the receive side (steady clock
  // nanoseconds; 0: released).
  std::atomic<int64_t> app_drive_ns_{0};
  // Application threads waiting with the sockets (BeginWait..EndWait).
  std::atomic<int> waiters_{0};
  // The loop thread sleeps with no end because a waiter sat idle (HoldForSleep).
  std::atomic<bool> parked_{false};

  // Group sockets waiting for the loop thread (AddGroupSocket/Remove...).
  std::mutex groups_mu_;
  std::vector<GroupSocket> groups_added_;     // guarded by groups_mu_
  std::vector<uint32_t> groups_removed_;      // guarded by groups_mu_
  uint32_t next_group_handle_ = kFirstGroupHandle;  // guarded by groups_mu_
  std::atomic<bool> group_changes_{false};

  // Guarded by drive_mu_.
  std::optional<Clock::time_point> deadline_;
  std::optional<Clock::time_point> retry_at_;
  // When the sends a poster left queued must leave (SendsMayWait).
  std::optional<Clock::time_point> flush_by_;
};

// Backend factories. On failure the sockets are left untouched (so that kAuto
// can hand them to the next backend); on success they are moved into the loop.
Result<std::unique_ptr<Loop>> CreateUringLoop(std::vector<UdpSocket>& sockets, LoopHandler* handler,
                                              const LoopOptions& options);
Result<std::unique_ptr<Loop>> CreateEpollLoop(std::vector<UdpSocket>& sockets, LoopHandler* handler);

}  // namespace rdmaemu::net::internal
