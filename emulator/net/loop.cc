#include "emulator/net/loop.h"

#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "emulator/base/log.h"
#include "emulator/net/loop_internal.h"

namespace rdmaemu::net {

Result<Backend> ParseBackend(std::string_view text) {
  if (text == "auto") return Backend::kAuto;
  if (text == "uring") return Backend::kUring;
  if (text == "epoll") return Backend::kEpoll;
  return InvalidArgument("engine '" + std::string(text) +
                         "' is not one of auto, uring, epoll");
}

std::string_view ToString(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kUring:
      return "uring";
    case Backend::kEpoll:
      return "epoll";
  }
  return "?";
}

Result<std::unique_ptr<Loop>> Loop::Create(Backend backend, UdpSocket socket,
                                           LoopHandler* handler, const LoopOptions& options) {
  std::vector<UdpSocket> sockets;
  sockets.push_back(std::move(socket));
  return Create(backend, std::move(sockets), handler, options);
}

Result<std::unique_ptr<Loop>> Loop::Create(Backend backend, std::vector<UdpSocket> sockets,
                                           LoopHandler* handler, const LoopOptions& options) {
  if (handler == nullptr) return InvalidArgument("Loop::Create: no handler");
  if (sockets.empty() || sockets.size() > static_cast<size_t>(kMaxSockets)) {
    return InvalidArgument("Loop::Create: " + std::to_string(sockets.size()) +
                           " sockets; a loop serves 1 to " + std::to_string(kMaxSockets));
  }
  switch (backend) {
    case Backend::kUring:
      return internal::CreateUringLoop(sockets, handler, options);
    case Backend::kEpoll:
      return internal::CreateEpollLoop(sockets, handler);
    case Backend::kAuto:
      break;
  }
  auto uring = internal::CreateUringLoop(sockets, handler, options);
  if (uring.ok()) return uring;
  // Said once per process: every device of a process falls back for the same
  // reason. Info, not warn: the epoll engine is a correct engine, and a
  // program run in Docker should not print a line on every start.
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    Log().info("io_uring is not available ({}); using the epoll engine",
               uring.status().message());
  }
  return internal::CreateEpollLoop(sockets, handler);
}

namespace internal {

std::string ErrnoText(int err) {
  const char* text = strerrordesc_np(err);
  return text != nullptr ? text : "errno " + std::to_string(err);
}

uint8_t* CopyArena::Allocate(size_t bytes, int64_t* ticket) {
  *ticket = -1;
  if (bytes == 0 || bytes > kBytes / 4) return nullptr;
  if (memory_.empty()) memory_.resize(kBytes);
  size_t at = head_;
  if (!live_.empty()) {
    const size_t tail = live_.front().offset;
    if (head_ > tail) {
      // In use: [tail, head). Room after the head, else before the tail.
      if (head_ + bytes > kBytes) {
        if (bytes > tail) return nullptr;
        at = 0;
      }
    } else if (head_ + bytes > tail) {
      return nullptr;  // wrapped: in use [tail, ...) and [0, head)
    }
  } else {
    at = 0;
  }
  live_.push_back({at, false});
  head_ = at + bytes;
  *ticket = front_ticket_ + static_cast<int64_t>(live_.size()) - 1;
  return memory_.data() + at;
}

void CopyArena::Free(int64_t ticket) {
  const int64_t index = ticket - front_ticket_;
  if (index < 0 || index >= static_cast<int64_t>(live_.size())) return;
  live_[static_cast<size_t>(index)].freed = true;
  while (!live_.empty() && live_.front().freed) {
    live_.pop_front();
    ++front_ticket_;
  }
  if (live_.empty()) head_ = 0;
}

void SendPool::Release(int id) {
  SendSlot& s = *slots_[id];
  if (s.arena_ticket >= 0) {
    arena_.Free(s.arena_ticket);
    s.arena_ticket = -1;
  }
  free_.push_back(id);
}

int SendPool::Acquire(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos,
                      Gathered gathered) {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (slots_.size() < kMaxPendingSends) {
    id = static_cast<int>(slots_.size());
    slots_.push_back(std::make_unique<SendSlot>());
  } else {
    return -1;
  }
  SendSlot& s = *slots_[id];
  size_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;
  size_t pieces = 1;
  if (gathered == Gathered::kBorrowPayload && iov.size() == 3 && iov[1].iov_len >= kMinBorrowedPayload) {
    // Only the header and the trailer are copied; the kernel copies the
    // payload from where it lies when the datagram leaves.
    s.storage.resize(iov[0].iov_len + iov[2].iov_len);
    uint8_t* head = s.storage.data();
    uint8_t* tail = head + iov[0].iov_len;
    if (iov[0].iov_len != 0) std::memcpy(head, iov[0].iov_base, iov[0].iov_len);
    if (iov[2].iov_len != 0) std::memcpy(tail, iov[2].iov_base, iov[2].iov_len);
    s.iov = {iovec{head, iov[0].iov_len}, iov[1], iovec{tail, iov[2].iov_len}};
    pieces = 3;
  } else {
    uint8_t* start = arena_.Allocate(total, &s.arena_ticket);
    if (start == nullptr) {
      // The copy lands with the second piece (a packet's payload, after its
      // headers) on a cache line: on some CPUs the string instructions
      // memcpy uses copy several times slower into a destination a few
      // bytes off one.
      constexpr size_t kLine = 64;
      s.storage.resize(total + kLine - 1);
      const auto base = reinterpret_cast<uintptr_t>(s.storage.data());
      const size_t lead = iov.size() > 1 ? iov[0].iov_len : 0;
      start = s.storage.data() + (kLine - (base + lead) % kLine) % kLine;
    }
    size_t at = 0;
    for (const iovec& v : iov) {
      if (v.iov_len != 0) std::memcpy(start + at, v.iov_base, v.iov_len);
      at += v.iov_len;
    }
    s.iov[0] = {start, total};
  }
  s.length = total;
  s.socket = socket;
  s.tos = tos;
  s.to = to;
  s.msg = {};
  s.msg.msg_name = &s.to;
  s.msg.msg_namelen = sizeof(s.to);
  s.msg.msg_iov = s.iov.data();
  s.msg.msg_iovlen = pieces;
  if (tos != 0) {
    s.msg.msg_control = s.control.bytes;
    s.msg.msg_controllen = sizeof(s.control.bytes);
    cmsghdr* c = CMSG_FIRSTHDR(&s.msg);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int value = tos;
    std::memcpy(CMSG_DATA(c), &value, sizeof(value));
  }
  return id;
}

LoopBase::LoopBase(Backend backend, std::vector<UdpSocket> sockets, LoopHandler* handler,
                   int doorbell_fd)
    : backend_(backend),
      sockets_(std::move(sockets)),
      handler_(handler),
      doorbell_fd_(doorbell_fd),
      // Non-blocking for epoll, which reads it only when it polled readable
      // (a driver may re-arm it in between, which clears it); io_uring
      // reads it with a request that waits for the expiry.
      hold_timer_fd_(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | (backend == Backend::kEpoll ? TFD_NONBLOCK : 0))) {
  for (size_t s = 0; s < sockets_.size(); ++s) fds_[s] = sockets_[s].fd();
  if (hold_timer_fd_ < 0) {
    Log().debug("timerfd_create: {}; the loop thread wakes each {} us while a program polls",
                ErrnoText(errno), kDriveHold.count());
  }
}

uint32_t LoopBase::AddGroupSocket(int owner, UdpSocket socket) {
  uint32_t handle;
  {
    std::lock_guard lock(groups_mu_);
    handle = next_group_handle_++;
    groups_added_.push_back({handle, owner, std::move(socket)});
  }
  group_changes_.store(true, std::memory_order_release);
  Ring();
  return handle;
}

void LoopBase::RemoveGroupSocket(uint32_t handle) {
  {
    std::lock_guard lock(groups_mu_);
    groups_removed_.push_back(handle);
  }
  group_changes_.store(true, std::memory_order_release);
  Ring();
}

bool LoopBase::TakeGroupChanges(std::vector<GroupSocket>* added, std::vector<uint32_t>* removed) {
  if (!group_changes_.load(std::memory_order_acquire)) return false;
  std::lock_guard lock(groups_mu_);
  group_changes_.store(false, std::memory_order_relaxed);
  added->swap(groups_added_);
  removed->swap(groups_removed_);
  return true;
}

LoopBase::~LoopBase() {
  Stop();
  close(doorbell_fd_);
  if (hold_timer_fd_ >= 0) close(hold_timer_fd_);
}

void LoopBase::Start() {
  if (thread_.joinable() || stop_requested()) return;
  running_.store(true);
  thread_ = std::thread([this] { ThreadMain(); });
  if (pthread_getcpuclockid(thread_.native_handle(), &cpu_clock_) != 0) {
    cpu_clock_ = CLOCK_THREAD_CPUTIME_ID;  // never: the thread exists
  }
}

void LoopBase::ThreadMain() {
  loop_thread_.store(std::this_thread::get_id());
  pthread_setname_np(pthread_self(), "rdmaemu-net");
  Run();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  final_cpu_ns_.store(int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec);
  running_.store(false);
}

void LoopBase::Stop() {
  if (InLoopThread()) {
    std::fprintf(stderr, "rdmaemu: Loop::Stop called on the loop thread itself\n");
    std::abort();
  }
  stop_.store(true);
  Ring();
  if (thread_.joinable()) thread_.join();
}

// The doorbell, as io_uring's SQ polling does it (IORING_SQ_NEED_WAKEUP):
// posters write the eventfd only when the loop says it is going to sleep.
//
//   poster (Ring)                     loop (PrepareToSleep, then block)
//   P1 ring_pending_ = true           L1 sleeping_ = true
//   P2 if (sleeping_) write eventfd   L2 if (ring_pending_) don't block
//
// All four accesses are seq_cst, so they fall in one total order: if P2
// reads false, P2 precedes L1, hence P1 precedes L2 and the loop sees the
// ring and stays awake; if P2 reads true, the eventfd write wakes the loop
// (or, if it has not blocked yet, makes its wait return at once). Either way
// no ring is lost. Release/acquire alone would not do: each side stores one
// flag and then loads the other, a store-load pair that only seq_cst (a full
// fence) orders.
//
// A busy poster finds sleeping_ false and makes no system call. The exchange
// on sleeping_ lets only the first of several posters write per sleep.
// The seq_cst store of ring_pending_ also releases whatever the poster wrote
// before ringing; TakeRing's exchange acquires it before OnWork runs.
void LoopBase::Ring() {
  ring_pending_.store(true, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst) &&
      sleeping_.exchange(false, std::memory_order_seq_cst)) {
    counters_.doorbell_writes.fetch_add(1, std::memory_order_relaxed);
    const uint64_t one = 1;
    while (write(doorbell_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
}

bool LoopBase::PrepareToSleep() {
  sleeping_.store(true, std::memory_order_seq_cst);
  // A driver may have taken the ring meant for group changes (its OnWork
  // answers the ring, not the changes, which only the loop applies).
  if (ring_pending_.load(std::memory_order_seq_cst) || stop_requested() ||
      group_changes_.load(std::memory_order_seq_cst)) {
    sleeping_.store(false, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void LoopBase::AfterSleep() {
  sleeping_.store(false, std::memory_order_relaxed);
  parked_.store(false, std::memory_order_relaxed);
}

bool LoopBase::TakeRing() {
  if (!ring_pending_.load(std::memory_order_relaxed)) return false;
  return ring_pending_.exchange(false, std::memory_order_acquire);
}

std::optional<Clock::time_point> LoopBase::NextWake() const {
  std::optional<Clock::time_point> next = deadline_;
  for (const auto& t : {retry_at_, flush_by_}) {
    if (t && (!next || *t < *next)) next = t;
  }
  return next;
}

void LoopBase::SendQueued() {
  DriveFlush();
  // Sent, or waiting for room (the backend's own retry): not for flush_by_.
  flush_by_.reset();
}

void LoopBase::MaybeWork(bool delivered, bool force) {
  if (stop_requested()) return;
  const bool rang = TakeRing();
  const Clock::time_point now = Clock::now();
  if (force || delivered || rang || (deadline_ && now >= *deadline_)) {
    Add(counters_.work_calls);
    deadline_ = handler_->OnWork(now);
  }
}

bool LoopBase::ReceivePending() const {
  // FIONREAD on a UDP socket: the size of the first queued datagram, so any
  // datagram but an empty one (never a RoCE packet) counts.
  for (int fd : socket_fds()) {
    int bytes = 0;
    if (ioctl(fd, FIONREAD, &bytes) == 0 && bytes > 0) return true;
  }
  return false;
}

bool LoopBase::InLoopThread() const {
  return loop_thread_.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

void LoopBase::CheckDriving(const char* what) const {
  if (driver_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
    std::fprintf(stderr, "rdmaemu: %s called by a thread that is not driving the loop\n", what);
    std::abort();
  }
}

// The loop thread's side of the drive lock. Taking it blocks (a driver holds
// it for one bounded round); the loop never sleeps in the kernel holding it.
void LoopBase::AcquireDrive() {
  // Drivers step aside while the loop waits for the lock: a program spinning
  // on its CQ would otherwise take it again after every round.
  loop_waiting_.store(true, std::memory_order_relaxed);
  drive_mu_.lock();
  loop_waiting_.store(false, std::memory_order_relaxed);
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  asleep_ = false;
  asleep_until_.reset();
}

bool LoopBase::LoopWakesTooLate() const {
  const std::optional<Clock::time_point> next = NextWake();
  if (!asleep_ || !next || (asleep_until_ && *next >= *asleep_until_)) return false;
  // A loop thread asleep on the applications' hold wakes at its timer and
  // then sleeps no longer than NextWake, so the handler's deadline after the
  // timer needs no ring: a held ACK's (Engine::HoldAck), in every round of
  // a ping-pong. Drivers that push the timer past it meet it in their own
  // rounds (MaybeWork); after the last, it is at most kDriveHold late.
  const bool handlers = deadline_ && *deadline_ == *next;
  return !handlers || hold_timer_ns_ == 0 || NanosOf(*next) < hold_timer_ns_;
}

void LoopBase::ReleaseToSleep(std::optional<Clock::time_point> until) {
  asleep_ = true;
  asleep_until_ = until;
  driver_.store(std::thread::id(), std::memory_order_relaxed);
  drive_mu_.unlock();
}

void LoopBase::ArmHoldTimer(int64_t at_ns) {
  itimerspec spec{};
  spec.it_value.tv_sec = at_ns / 1'000'000'000;
  spec.it_value.tv_nsec = at_ns % 1'000'000'000;
  // All zero disarms it; an expiry in the past fires at once.
  if (at_ns != 0 && spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  if (timerfd_settime(hold_timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    RDMAEMU_WARN_LIMITED("timerfd_settime: {}", ErrnoText(errno));
  }
  hold_timer_ns_ = at_ns;
}

bool LoopBase::SetHoldTimer(std::optional<Clock::time_point> hold) {
  if (hold_timer_fd_ < 0) return false;
  const int64_t at = !hold || *hold == kForever ? 0 : NanosOf(*hold);
  if (at != hold_timer_ns_) ArmHoldTimer(at);
  return true;
}

void LoopBase::DrainHoldTimer() {
  uint64_t expirations = 0;
  // EAGAIN: a driver pushed it forward after it fired (nothing to read).
  while (read(hold_timer_fd_, &expirations, sizeof(expirations)) < 0 && errno == EINTR) {
  }
}

void LoopBase::PushHoldTimer(int64_t now_ns) {
  // Only while the loop thread sleeps on it, and only when it is due
  // within half a hold: a program that keeps polling makes one system call
  // per half hold here instead of waking the loop thread once per hold
  // (which, on a machine with as many CPUs as polling programs, takes the
  // CPU from one of them: qperf -cp1 rc_lat 17.8 -> 12.6 us with no
  // wakeups at all). Never earlier than it was. The hold is the one the
  // loop thread would take (ApplicationHold): kWaitCheck while a thread
  // waits with the sockets, else kDriveHold.
  const int64_t hold = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           waiters_.load(std::memory_order_relaxed) > 0 ? kWaitCheck : kDriveHold)
                           .count();
  if (hold_timer_fd_ < 0 || !asleep_ || hold_timer_ns_ == 0 || hold_timer_ns_ - now_ns >= hold / 2) return;
  ArmHoldTimer(now_ns + hold);
}

bool LoopBase::SleepAgain(Clock::time_point now, std::optional<Clock::time_point>* hold) {
  *hold = HoldForSleep(now);
  if (!*hold || (asleep_until_ && *asleep_until_ <= now)) return false;
  return PrepareToSleep();
}

std::optional<Clock::time_point> LoopBase::ApplicationHold(Clock::time_point now) const {
  const int64_t at = app_drive_ns_.load(std::memory_order_relaxed);
  if (waiters_.load(std::memory_order_relaxed) > 0) {
    // A waiter watches the sockets. The loop thread looks again kWaitCheck
    // after the applications' last step; if by then nothing has happened
    // and one still waits, it sleeps until that waiter's EndWait (Park).
    const Clock::time_point check = Clock::time_point(std::chrono::nanoseconds(at)) + kWaitCheck;
    return at != 0 && check > now ? check : kForever;
  }
  if (at == 0) return std::nullopt;
  const Clock::time_point until = Clock::time_point(std::chrono::nanoseconds(at)) + kDriveHold;
  if (until <= now) return std::nullopt;
  return until;
}

std::optional<Clock::time_point> LoopBase::HoldForSleep(Clock::time_point now) {
  std::optional<Clock::time_point> hold = ApplicationHold(now);
  if (hold != kForever) return hold;
  // Said before the waiters are counted again, both sequentially
  // consistent, against EndWait's decrement and look: either the last
  // waiter sees the loop parked and rings it, or the loop sees it gone.
  parked_.store(true, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0) return hold;
  parked_.store(false, std::memory_order_relaxed);
  return ApplicationHold(now);
}

bool LoopBase::SendsMayWait(Clock::time_point now) {
  const size_t queued = DriveQueued();
  if (queued >= kPostBatch) return false;
  // They leave by then at the latest: the loop thread wakes for it (Drive
  // rings it if it sleeps past that), unless a Drive or BeginWait first.
  // With nothing queued there is nothing to wait for: a post the window
  // holds back (one READ or atomic in flight at a time) queues no packet,
  // and a deadline for it rang the sleeping loop thread on every post
  // (qperf rc_fetch_add_mr: 21 -> 35-52 thousand atomics per second).
  if (queued > 0 && !flush_by_) flush_by_ = now + kPostWait;
  return true;
}

bool LoopBase::Drive(bool receive, SendBatching batching) {
  // A handler that calls back into a verb that drives (never expected) must
  // not lock what its own thread holds.
  if (driver_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return false;
  // A poll counts as the program driving even when the lock is taken: the
  // loop thread, mid-round, then finds the hold when it looks next. Where its
  // rounds are slower than kDriveHold (a sanitizer) it otherwise never saw
  // one, and the program never got the sockets.
  const int64_t now_ns = receive ? NanosOf(Clock::now()) : 0;
  if (receive) app_drive_ns_.store(now_ns, std::memory_order_relaxed);
  if (loop_waiting_.load(std::memory_order_relaxed) || !drive_mu_.try_lock()) return false;
  if (stop_requested() || !running_.load(std::memory_order_relaxed)) {
    drive_mu_.unlock();
    return false;
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  bool delivered = false;
  if (receive) {
    PushHoldTimer(now_ns);
    delivered = DriveReceive();
  }
  // A poster's WQEs are what it drives for: OnWork runs whether or not
  // anything arrived.
  MaybeWork(delivered, /*force=*/!receive);
  if (receive || batching == SendBatching::kOff || !SendsMayWait(Clock::now())) SendQueued();
  // The handler (or a send that must wait) may want the loop sooner than it
  // planned to wake; a loop that is awake looks again before it sleeps.
  const bool wake_loop = LoopWakesTooLate();
  driver_.store(std::thread::id(), std::memory_order_relaxed);
  drive_mu_.unlock();
  if (wake_loop) Ring();
  return true;
}

bool LoopBase::Inject(std::span<const Datagram> batch) {
  if (driver_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return false;
  // A driver holds the lock for one bounded round and the loop thread lets
  // go before it sleeps, so this wait is short.
  while (loop_waiting_.load(std::memory_order_relaxed) || !drive_mu_.try_lock()) {
    std::this_thread::yield();
  }
  if (stop_requested() || !running_.load(std::memory_order_relaxed)) {
    drive_mu_.unlock();
    return false;
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  if (!batch.empty()) handler().OnDatagrams(batch);
  MaybeWork(!batch.empty(), /*force=*/true);
  SendQueued();
  const bool wake_loop = LoopWakesTooLate();
  driver_.store(std::thread::id(), std::memory_order_relaxed);
  drive_mu_.unlock();
  if (wake_loop) Ring();
  return true;
}

void LoopBase::Release() {
  if (app_drive_ns_.exchange(0, std::memory_order_relaxed) != 0) Ring();
}

bool LoopBase::BeginWait(std::vector<int>* fds) {
  if (driver_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return false;
  if (stop_requested() || !running_.load(std::memory_order_relaxed)) return false;
  // The caller takes the sockets even where nobody drove within kDriveHold:
  // a poller whose Drive found the loop thread mid-round had left no hold,
  // and the loop thread then did the work of the waiting program's own
  // datagrams (qperf rc_rdma_read_bw on io_uring: 1.4 → 2.1 GB/s). Counted
  // without the drive lock: a loop thread in a round sees the count when
  // it next looks at the hold, and lets go of the sockets then. Waiting for
  // the lock instead, behind rounds of a stream of datagrams that the loop
  // thread took in, kept the waiter from saying that it waits, and so the
  // loop thread kept the sockets (rc_rdma_read_bw on io_uring: the waiter
  // blocked there for 15% of the test, the loop thread took in a third of
  // the datagrams).
  app_drive_ns_.store(NanosOf(Clock::now()), std::memory_order_relaxed);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  fds->assign(fds_.begin(), fds_.begin() + static_cast<std::ptrdiff_t>(sockets_.size()));
  // A loop thread still watching the sockets (it sleeps; it notices a hold
  // only when it wakes) is rung to let go of them, so that the datagram
  // the caller waits for wakes the caller alone; until then the datagram
  // may wake both, and whichever drives first delivers it. So is one in a
  // round, or about to sleep, which may have looked at the hold before we
  // were counted: a ring costs an awake loop thread no system call, only
  // one more round, in which it sees the hold. Where no round is in
  // progress, we look ourselves, and sends a poster left queued
  // (SendBatching) leave now: the loop thread may sleep with the caller
  // until a datagram comes. A round in progress ends with them.
  bool wake_loop = true;
  if (!loop_waiting_.load(std::memory_order_relaxed) && drive_mu_.try_lock()) {
    wake_loop = !SocketsHandedOver();
    driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    SendQueued();
    driver_.store(std::thread::id(), std::memory_order_relaxed);
    drive_mu_.unlock();
  }
  if (wake_loop) Ring();
  return true;
}

void LoopBase::EndWait() {
  app_drive_ns_.store(NanosOf(Clock::now()), std::memory_order_relaxed);
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
  // Only a loop thread that parked (a waiter sat idle past kWaitCheck) sleeps
  // with no end: it is rung to take the hold up again. One that did not
  // park wakes by kWaitCheck anyway and sees the usual kDriveHold from now:
  // a program that waits, handles its completion and waits again costs the
  // loop thread no wakeup per message.
  if (parked_.load(std::memory_order_seq_cst) && parked_.exchange(false, std::memory_order_seq_cst)) Ring();
}

int64_t LoopBase::CpuNanos() const {
  if (running_.load()) {
    timespec ts{};
    if (clock_gettime(cpu_clock_, &ts) == 0) {
      return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
    }
  }
  // Exited (or exiting, and its clock is gone): the value it left behind.
  return final_cpu_ns_.load();
}

LoopStats LoopBase::stats() const {
  constexpr auto r = std::memory_order_relaxed;
  LoopStats s;
  s.datagrams_received = counters_.datagrams_received.load(r);
  s.bytes_received = counters_.bytes_received.load(r);
  s.datagrams_sent = counters_.datagrams_sent.load(r);
  s.bytes_sent = counters_.bytes_sent.load(r);
  s.send_errors = counters_.send_errors.load(r);
  s.send_drops = counters_.send_drops.load(r);
  s.send_retries = counters_.send_retries.load(r);
  s.receive_errors = counters_.receive_errors.load(r);
  s.batches = counters_.batches.load(r);
  s.work_calls = counters_.work_calls.load(r);
  s.wakeups = counters_.wakeups.load(r);
  s.doorbell_writes = counters_.doorbell_writes.load(r);
  s.gso_sends = counters_.gso_sends.load(r);
  s.gro_receives = counters_.gro_receives.load(r);
  s.cpu_time = std::chrono::nanoseconds(CpuNanos());
  return s;
}

}  // namespace internal
}  // namespace rdmaemu::net
