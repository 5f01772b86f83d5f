// The epoll backend: for kernels and sandboxes that refuse io_uring.
//
// One epoll set holds the sockets (EPOLLIN unless applications drive, plus
// EPOLLOUT on the one a send waits on for room) and the doorbell eventfd.
// Receives and sends are DirectIo's recvmmsg and sendmmsg batches; the
// deadline is epoll_pwait2's timeout, to the nanosecond (the applications'
// hold is shorter than a millisecond), or epoll_wait's rounded up to the
// next millisecond where the kernel or a seccomp filter refuses
// epoll_pwait2, so that the loop never wakes before it.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "emulator/base/log.h"
#include "emulator/net/loop_internal.h"

namespace rdmaemu::net::internal {
namespace {

// epoll tags: a socket's is its index, 0..kMaxSockets-1; a group socket's
// its handle (32 bits, from kFirstGroupHandle up).
constexpr uint64_t kDoorbellTag = ~uint64_t{0};
constexpr uint64_t kHoldTimerTag = ~uint64_t{0} - 1;

class EpollLoop final : public LoopBase {
 public:
  EpollLoop(std::vector<UdpSocket> sockets, LoopHandler* handler, int doorbell_fd, int epoll_fd)
      : LoopBase(Backend::kEpoll, std::move(sockets), handler, doorbell_fd),
        epoll_fd_(epoll_fd),
        direct_(counters()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kHoldTimerTag;
    hold_timer_ = hold_timer_fd() >= 0 && epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, hold_timer_fd(), &ev) == 0;
  }

  ~EpollLoop() override {
    Stop();
    close(epoll_fd_);
  }

  void Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos = 0,
            Gathered gathered = Gathered::kCopy) override;

 private:
  void Run() override;
  bool DriveReceive() override;
  // Only once the loop thread has stopped watching them: a waiter must not
  // share a datagram's wakeup with it.
  bool SocketsHandedOver() const override { return !watching_; }
  void DriveFlush() override { Flush(); }
  size_t DriveQueued() const override { return direct_.size(); }
  bool SendsCoalesce() const override { return direct_.gso(); }
  // Adds the group sockets added to the epoll set and closes the removed.
  void ApplyGroupChanges();
  void Flush();
  // Watches the sockets for datagrams, or not while applications drive.
  void WatchSockets(bool on);
  // Sets a socket's epoll events from watching_ and blocked_.
  void UpdateInterest(int socket);
  void DrainDoorbell();
  // epoll_pwait2, or epoll_wait once that is refused; nullopt: no timeout.
  int Wait(epoll_event* events, int max, std::optional<Clock::duration> timeout);

  const int epoll_fd_;
  bool pwait2_refused_ = false;  // loop thread only

  // Drive lock holder only.
  DirectIo direct_;
  // A socket said EAGAIN: wait for its EPOLLOUT before sending again
  // (sends keep their order across sockets, so all of them wait).
  int blocked_ = -1;
  bool hold_timer_ = false;  // the hold timer is in the epoll set
  bool watching_ = true;

  struct Group {
    int owner = 0;
    UdpSocket socket;
  };
  std::map<uint32_t, Group> groups_;  // by handle
  std::vector<GroupSocket> groups_added_;
  std::vector<uint32_t> groups_removed_;
  std::vector<uint32_t> groups_readable_;
};

int EpollLoop::Wait(epoll_event* events, int max, std::optional<Clock::duration> timeout) {
  if (!pwait2_refused_) {
    timespec ts{};
    if (timeout) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(*timeout).count();
      ts.tv_sec = ns / 1'000'000'000;
      ts.tv_nsec = ns % 1'000'000'000;
    }
    const int n = epoll_pwait2(epoll_fd_, events, max, timeout ? &ts : nullptr, nullptr);
    if (n >= 0 || (errno != ENOSYS && errno != EPERM)) return n;
    pwait2_refused_ = true;
    Log().info("epoll_pwait2 refused ({}): waits are rounded up to milliseconds",
               std::strerror(errno));
  }
  const int ms = !timeout ? -1
                 : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(*timeout).count());
  return epoll_wait(epoll_fd_, events, max, ms);
}

void EpollLoop::Run() {
  AcquireDrive();
  std::array<epoll_event, 16> events{};
  while (!stop_requested()) {
    ApplyGroupChanges();
    Clock::time_point now = Clock::now();
    std::optional<Clock::time_point> hold = HoldForSleep(now);
    WatchSockets(!hold);
    const std::optional<Clock::time_point> own = NextWake();
    // The hold's end comes as the timer's fd where there is one.
    const bool timed_hold = hold_timer_ && SetHoldTimer(hold);
    // Time to the loop's deadline or the end of the applications' hold,
    // whichever is first (nullopt: neither).
    auto timeout_at = [&](Clock::time_point t) -> std::optional<Clock::duration> {
      std::optional<Clock::time_point> wake = own;
      if (!timed_hold && hold && *hold != kForever && (!wake || *hold < *wake)) wake = hold;
      if (!wake) return std::nullopt;
      return std::max(*wake - t, Clock::duration::zero());
    };
    std::optional<Clock::duration> timeout = timeout_at(now);
    const bool may_sleep = (!timeout || *timeout > Clock::duration::zero()) && PrepareToSleep();
    ReleaseToSleep(may_sleep ? own : now);
    int n;
    for (;;) {
      n = Wait(events.data(), static_cast<int>(events.size()),
               may_sleep ? timeout : std::optional<Clock::duration>(Clock::duration::zero()));
      if (!may_sleep) break;
      Add(counters().wakeups);
      if (n != 0) break;
      now = Clock::now();
      if (!SleepAgain(now, &hold)) break;
      timeout = timeout_at(now);
    }
    const int wait_errno = errno;
    AcquireDrive();
    if (may_sleep) AfterSleep();
    bool readable[kMaxSockets] = {};
    groups_readable_.clear();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kDoorbellTag) {
        DrainDoorbell();
      } else if (events[i].data.u64 == kHoldTimerTag) {
        DrainHoldTimer();  // the next round looks at the hold again
      } else if (events[i].data.u64 >= kFirstGroupHandle) {
        if (events[i].events & (EPOLLIN | EPOLLERR)) {
          groups_readable_.push_back(static_cast<uint32_t>(events[i].data.u64));
        }
      } else {
        const int s = static_cast<int>(events[i].data.u64);
        if (events[i].events & (EPOLLIN | EPOLLERR)) readable[s] = true;
        if ((events[i].events & EPOLLOUT) && blocked_ == s) {
          blocked_ = -1;
          UpdateInterest(s);
        }
      }
    }
    if (n < 0 && wait_errno != EINTR) {
      RDMAEMU_WARN_LIMITED("epoll_wait: {}", ErrnoText(wait_errno));
    }
    if (RetryDue(Clock::now())) ClearRetry();
    // Readiness seen before an application thread took the sockets (a
    // waiter counted, a poll) is theirs now, as if we had looked at the
    // hold after it: they read the datagrams themselves, or we do in a
    // later round, once their hold has ended. Read anyway, a datagram
    // would be the loop thread's although a waiter holds the sockets.
    const bool theirs = ApplicationHold(Clock::now()).has_value();
    bool delivered = false;
    for (int s = 0; s < num_sockets(); ++s) {
      if (readable[s] && !theirs && direct_.ReceiveAll(socket_fd(s), s, handler(), stop_flag())) {
        delivered = true;
      }
    }
    // The set of groups changes only at the top of the round (or in a
    // Drive, which receives from every group anyway).
    for (uint32_t handle : groups_readable_) {
      auto it = groups_.find(handle);
      if (it == groups_.end()) continue;
      if (direct_.ReceiveAll(it->second.socket.fd(), it->second.owner, handler(), stop_flag())) {
        delivered = true;
      }
    }
    MaybeWork(delivered);
    SendQueued();
  }
  ReleaseToSleep(std::nullopt);
}

bool EpollLoop::DriveReceive() {
  ApplyGroupChanges();
  bool delivered = false;
  for (int s = 0; s < num_sockets(); ++s) {
    if (direct_.ReceiveAll(socket_fd(s), s, handler(), stop_flag())) delivered = true;
  }
  for (auto& [handle, g] : groups_) {
    if (direct_.ReceiveAll(g.socket.fd(), g.owner, handler(), stop_flag())) delivered = true;
  }
  return delivered;
}

void EpollLoop::ApplyGroupChanges() {
  groups_added_.clear();
  groups_removed_.clear();
  if (!TakeGroupChanges(&groups_added_, &groups_removed_)) return;
  for (GroupSocket& added : groups_added_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = added.handle;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, added.socket.fd(), &ev) != 0) {
      RDMAEMU_WARN_LIMITED("epoll_ctl: cannot watch the socket of {}: {}",
                           ToString(added.socket.address()), ErrnoText(errno));
    }
    groups_.insert_or_assign(added.handle, Group{added.owner, std::move(added.socket)});
  }
  for (uint32_t handle : groups_removed_) {
    auto it = groups_.find(handle);
    if (it == groups_.end()) continue;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.socket.fd(), nullptr);
    groups_.erase(it);  // closes the socket
  }
}

void EpollLoop::Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos,
                     Gathered gathered) {
  CheckDriving("Loop::Send");
  if (socket < 0 || socket >= num_sockets()) {
    Add(counters().send_errors);
    RDMAEMU_WARN_LIMITED("Loop::Send: no socket {} (the loop has {})", socket, num_sockets());
    return;
  }
  if (direct_.Queue(socket, to, iov, tos, gathered)) Flush();
}

void EpollLoop::Flush() {
  if (blocked_ >= 0 || RetryPending()) return;
  int blocked = -1;
  switch (direct_.Flush(socket_fds(), &blocked)) {
    case DirectIo::Flushed::kAll:
      break;
    case DirectIo::Flushed::kWouldBlock:
      // The socket buffer is full: wait until the kernel says there is room.
      blocked_ = blocked;
      UpdateInterest(blocked);
      break;
    case DirectIo::Flushed::kNoBuffers:
      // No poll event announces the end of ENOBUFS: try again shortly.
      SetRetryAt(Clock::now() + kSendRetryDelay);
      break;
  }
}

void EpollLoop::WatchSockets(bool on) {
  if (on == watching_) return;
  watching_ = on;
  for (int s = 0; s < num_sockets(); ++s) UpdateInterest(s);
}

void EpollLoop::UpdateInterest(int socket) {
  epoll_event ev{};
  ev.events = (watching_ ? EPOLLIN : 0u) | (blocked_ == socket ? EPOLLOUT : 0u);
  ev.data.u64 = static_cast<uint64_t>(socket);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, socket_fd(socket), &ev) != 0) {
    RDMAEMU_WARN_LIMITED("epoll_ctl: {}", ErrnoText(errno));
  }
}

void EpollLoop::DrainDoorbell() {
  uint64_t value;
  while (read(doorbell_fd(), &value, sizeof(value)) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<std::unique_ptr<Loop>> CreateEpollLoop(std::vector<UdpSocket>& sockets, LoopHandler* handler) {
  const int doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (doorbell < 0) {
    return Status::Error(errno, "cannot create the doorbell eventfd: " + ErrnoText(errno));
  }
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    const int err = errno;
    close(doorbell);
    return Status::Error(err, "epoll_create1: " + ErrnoText(err));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  int rc = 0;
  for (size_t i = 0; i < sockets.size() && rc == 0; ++i) {
    ev.data.u64 = i;
    rc = epoll_ctl(ep, EPOLL_CTL_ADD, sockets[i].fd(), &ev);
  }
  if (rc == 0) {
    ev.data.u64 = kDoorbellTag;
    rc = epoll_ctl(ep, EPOLL_CTL_ADD, doorbell, &ev);
  }
  if (rc != 0) {
    const int err = errno;
    close(ep);
    close(doorbell);
    return Status::Error(err, "epoll_ctl: " + ErrnoText(err));
  }
  return std::unique_ptr<Loop>(new EpollLoop(std::move(sockets), handler, doorbell, ep));
}

}  // namespace rdmaemu::net::internal
