// The epoll backend: for kernels and sandboxes that refuse io_uring.
//
// One epoll set holds the sockets (EPOLLIN, plus EPOLLOUT on the one a send
// waits on for room) and the doorbell eventfd. Receives are recvmmsg batches
// per socket, sends are sendmmsg batches of consecutive datagrams for one
// socket; the deadline is epoll_wait's timeout, rounded up to
// the next millisecond so that the loop never wakes before it.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "emulator/base/log.h"
#include "emulator/net/loop_internal.h"

namespace rdmaemu::net::internal {
namespace {

constexpr int kBatch = 64;        // datagrams per recvmmsg / sendmmsg
constexpr int kReceiveRounds = 16;  // recvmmsg calls per wakeup, then others get a turn
// epoll tags: a socket's is its index, 0..kMaxSockets-1; a group socket's
// its handle (32 bits, from kFirstGroupHandle up).
constexpr uint64_t kDoorbellTag = ~uint64_t{0};

// Room for the IP_PKTINFO and IP_TOS control messages, aligned for cmsghdr.
union Control {
  cmsghdr align;
  char bytes[CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(int))];
};

in_addr DestinationOf(const msghdr& msg) {
  for (const cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof(info));
      return info.ipi_addr;
    }
  }
  return in_addr{INADDR_ANY};
}

uint8_t TosOf(const msghdr& msg) {
  for (const cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) return *CMSG_DATA(c);
  }
  return 0;
}

class EpollLoop final : public LoopBase {
 public:
  EpollLoop(std::vector<UdpSocket> sockets, LoopHandler* handler, int doorbell_fd, int epoll_fd)
      : LoopBase(Backend::kEpoll, std::move(sockets), handler, doorbell_fd),
        epoll_fd_(epoll_fd),
        buffers_(size_t{kBatch} * kReceiveBufferBytes),
        queue_(kMaxPendingSends) {}

  ~EpollLoop() override {
    Stop();
    close(epoll_fd_);
  }

  void Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos = 0) override;

 private:
  void Run() override;
  // Receives what `fd` holds as socket `owner`'s; true if any datagram was
  // delivered.
  bool ReceiveAll(int fd, int owner);
  // Adds the group sockets added to the epoll set and closes the removed.
  void ApplyGroupChanges();
  void Flush();
  void WatchWritable(int socket, bool on);
  void DrainDoorbell();

  const int epoll_fd_;

  // Loop thread only.
  std::vector<uint8_t> buffers_;
  std::array<sockaddr_in, kBatch> names_{};
  std::array<Control, kBatch> controls_{};
  std::array<iovec, kBatch> iovs_{};
  std::array<mmsghdr, kBatch> msgs_{};
  std::array<Datagram, kBatch> batch_{};
  std::array<mmsghdr, kBatch> send_msgs_{};

  SendPool pool_;
  // FIFO of slot ids waiting to be sent: a ring of kMaxPendingSends entries.
  std::vector<int> queue_;
  size_t queue_head_ = 0;
  size_t queue_size_ = 0;
  // A socket said EAGAIN: wait for its EPOLLOUT before sending again
  // (sends keep their order across sockets, so all of them wait).
  int blocked_ = -1;

  struct Group {
    int owner = 0;
    UdpSocket socket;
  };
  std::map<uint32_t, Group> groups_;  // by handle
  std::vector<GroupSocket> groups_added_;
  std::vector<uint32_t> groups_removed_;
  std::vector<uint32_t> groups_readable_;
};

void EpollLoop::Run() {
  std::array<epoll_event, 16> events{};
  while (!stop_requested()) {
    ApplyGroupChanges();
    int timeout_ms = -1;
    if (auto wake = NextWake()) {
      const auto left = *wake - Clock::now();
      timeout_ms = left <= Clock::duration::zero()
                       ? 0
                       : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
    }
    const bool may_sleep = timeout_ms != 0 && PrepareToSleep();
    const int n = epoll_wait(epoll_fd_, events.data(), events.size(), may_sleep ? timeout_ms : 0);
    if (may_sleep) {
      AfterSleep();
      Add(counters().wakeups);
    }
    bool readable[kMaxSockets] = {};
    groups_readable_.clear();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kDoorbellTag) {
        DrainDoorbell();
      } else if (events[i].data.u64 >= kFirstGroupHandle) {
        if (events[i].events & (EPOLLIN | EPOLLERR)) {
          groups_readable_.push_back(static_cast<uint32_t>(events[i].data.u64));
        }
      } else {
        const int s = static_cast<int>(events[i].data.u64);
        if (events[i].events & (EPOLLIN | EPOLLERR)) readable[s] = true;
        if ((events[i].events & EPOLLOUT) && blocked_ == s) {
          blocked_ = -1;
          WatchWritable(s, false);
        }
      }
    }
    if (n < 0 && errno != EINTR) {
      RDMAEMU_WARN_LIMITED("epoll_wait: {}", ErrnoText(errno));
    }
    if (RetryDue(Clock::now())) ClearRetry();
    bool delivered = false;
    for (int s = 0; s < num_sockets(); ++s) {
      if (readable[s] && ReceiveAll(socket_fd(s), s)) delivered = true;
    }
    // The set of groups changes only at the top of the round.
    for (uint32_t handle : groups_readable_) {
      const Group& g = groups_.at(handle);
      if (ReceiveAll(g.socket.fd(), g.owner)) delivered = true;
    }
    MaybeWork(delivered);
    Flush();
  }
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

bool EpollLoop::ReceiveAll(int fd, int owner) {
  bool delivered = false;
  for (int round = 0; round < kReceiveRounds && !stop_requested(); ++round) {
    for (int i = 0; i < kBatch; ++i) {
      iovs_[i] = {buffers_.data() + static_cast<size_t>(i) * kReceiveBufferBytes, kReceiveBufferBytes};
      msghdr& m = msgs_[i].msg_hdr;
      m = {};
      m.msg_name = &names_[i];
      m.msg_namelen = sizeof(names_[i]);
      m.msg_iov = &iovs_[i];
      m.msg_iovlen = 1;
      m.msg_control = controls_[i].bytes;
      m.msg_controllen = sizeof(controls_[i].bytes);
    }
    const int n = recvmmsg(fd, msgs_.data(), kBatch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // ECONNREFUSED and friends: an ICMP error for an earlier send.
      Add(counters().receive_errors);
      Log().debug("recvmmsg: {}", ErrnoText(errno));
      continue;
    }
    size_t count = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      const msghdr& m = msgs_[i].msg_hdr;
      if (m.msg_flags & MSG_TRUNC) {
        Add(counters().receive_errors);
        RDMAEMU_WARN_LIMITED("dropped a datagram larger than {} bytes", kReceiveBufferBytes);
        continue;
      }
      Datagram& d = batch_[count++];
      d.src = names_[i];
      d.dst = DestinationOf(m);
      d.tos = TosOf(m);
      d.data = {static_cast<const uint8_t*>(iovs_[i].iov_base), msgs_[i].msg_len};
      d.socket = owner;
      bytes += msgs_[i].msg_len;
    }
    if (count > 0 && !stop_requested()) {
      Add(counters().datagrams_received, count);
      Add(counters().bytes_received, bytes);
      Add(counters().batches);
      handler().OnDatagrams(std::span<const Datagram>(batch_.data(), count));
      delivered = true;
    }
    if (n < kBatch) break;
  }
  return delivered;
}

void EpollLoop::Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos) {
  CheckLoopThread("Loop::Send");
  if (socket < 0 || socket >= num_sockets()) {
    Add(counters().send_errors);
    RDMAEMU_WARN_LIMITED("Loop::Send: no socket {} (the loop has {})", socket, num_sockets());
    return;
  }
  const int id = pool_.Acquire(socket, to, iov, tos);
  if (id < 0) {
    Add(counters().send_drops);
    return;
  }
  queue_[(queue_head_ + queue_size_) % queue_.size()] = id;
  ++queue_size_;
  if (queue_size_ >= kBatch) Flush();
}

void EpollLoop::Flush() {
  if (blocked_ >= 0 || RetryPending()) return;
  while (queue_size_ > 0) {
    // One sendmmsg carries consecutive datagrams of one socket.
    const int socket = pool_[queue_[queue_head_]].socket;
    const int most = static_cast<int>(std::min<size_t>(queue_size_, kBatch));
    int k = 0;
    for (; k < most; ++k) {
      const SendSlot& slot = pool_[queue_[(queue_head_ + k) % queue_.size()]];
      if (slot.socket != socket) break;
      send_msgs_[k] = {};
      send_msgs_[k].msg_hdr = slot.msg;
    }
    const int n = sendmmsg(socket_fd(socket), send_msgs_.data(), k, MSG_DONTWAIT);
    int done = n;
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        // The socket buffer is full: wait until the kernel says there is room.
        Add(counters().send_retries);
        blocked_ = socket;
        WatchWritable(socket, true);
        return;
      }
      if (err == ENOBUFS) {
        // No poll event announces the end of ENOBUFS: try again shortly.
        Add(counters().send_retries);
        SetRetryAt(Clock::now() + kSendRetryDelay);
        return;
      }
      // Refused for good (ECONNREFUSED from an ICMP error, EMSGSIZE, ...):
      // count it, drop that datagram and go on with the rest.
      Add(counters().send_errors);
      Log().debug("sendmmsg to {}: {}", ToString(pool_[queue_[queue_head_]].to), ErrnoText(err));
      done = 1;
    } else {
      uint64_t bytes = 0;
      for (int i = 0; i < n; ++i) bytes += send_msgs_[i].msg_len;
      Add(counters().datagrams_sent, n);
      Add(counters().bytes_sent, bytes);
    }
    for (int i = 0; i < done; ++i) {
      pool_.Release(queue_[queue_head_]);
      queue_head_ = (queue_head_ + 1) % queue_.size();
      --queue_size_;
    }
  }
}

void EpollLoop::WatchWritable(int socket, bool on) {
  epoll_event ev{};
  ev.events = on ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
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
