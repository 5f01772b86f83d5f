// The io_uring backend.
//
// Requests the ring carries, told apart by user_data (kind << 32 | slot):
//   kRecv      one multishot recvmsg per socket (the slot is the socket's
//              index, or a group socket's handle), each datagram landing in a buffer the kernel picks
//              from the one provided buffer ring they share. It is
//              re-armed when a completion comes without IORING_CQE_F_MORE
//              (the kernel ended it, e.g. -ENOBUFS when every buffer was
//              taken); no datagram is lost then, they wait in the socket.
//   kDoorbell  a read of the doorbell eventfd, re-armed after each completion.
//   kSend      one sendmsg per datagram; the slot is its SendPool index.
//   kSendGso   one sendmsg of several datagrams (UDP GSO, BuildGso); the
//              slot is its GsoBatch index. Sends are queued in pending_
//              and made into requests just before the ring is submitted.
//   kCancel    the cancel-everything request of Drain(), and the cancel of
//              a socket's receive while applications drive.
// The deadline is the timeout of the wait itself (IORING_FEAT_EXT_ARG), so
// no timeout request is needed.
//
// While applications drive (Loop::Drive), their threads never touch the
// ring: they receive and send with DirectIo's plain system calls, and the
// loop cancels its sockets' receives so that it does not wake for every
// datagram (the ring's receive work runs in the loop thread's task).
//
// Every request is submitted by the loop thread. io_uring runs a request's
// completion work in the task that submitted it: a receive armed by the
// thread that called Create would depend on that thread entering the kernel,
// and die with it. Create therefore only probes the kernel; Run arms.
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "emulator/base/log.h"
#include "emulator/net/loop_internal.h"

namespace rdmaemu::net::internal {
namespace {

constexpr unsigned kSqEntries = 256;
// Room for a full pool of send completions plus the receives of one round.
constexpr unsigned kCqEntries = 8192;
// Receive buffers (kReceiveBufferBytes each, for GRO), a power of two as
// the buffer ring requires. The ring hands them out in turn, so all of them
// pass through the cache: 256 (17 MiB) made every receive land in memory
// the cache had lost, and qperf rc_bw and rc_rdma_write_bw on io_uring were
// 9-16% slower than with 32 (2 MiB). When all are in use the receive ends
// (ENOBUFS) and is armed again once a round has given them back, the
// datagrams waiting in the socket meanwhile.
constexpr unsigned kBuffers = 32;
constexpr uint16_t kBufferGroup = 0;
constexpr unsigned kCqeBatch = 128;
constexpr int kReapRounds = 8;  // CQE batches per wakeup, then the handler gets a turn
constexpr std::chrono::seconds kDrainTimeout{2};

enum Kind : uint64_t { kRecv = 1, kDoorbell = 2, kSend = 3, kCancel = 4, kSendGso = 5, kHoldTimer = 6 };
constexpr uint64_t Tag(Kind kind, uint32_t slot = 0) { return uint64_t{kind} << 32 | slot; }

// Anonymous memory, page-aligned as the buffer ring requires.
class Mapping {
 public:
  Mapping() = default;
  // Returns false if the memory cannot be mapped. Once only.
  bool Map(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    addr_ = p;
    bytes_ = bytes;
    return true;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, bytes_);
  }
  void* get() const { return addr_; }

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

// What Create sets up and the loop then owns. Destroyed after the loop
// thread has drained the ring, so the kernel never writes freed memory.
struct UringState {
  io_uring ring{};
  bool ring_ready = false;
  Mapping buf_ring_memory;
  io_uring_buf_ring* buf_ring = nullptr;
  Mapping buffers;
  int doorbell = -1;  // handed to LoopBase, which closes it

  ~UringState() {
    if (ring_ready) io_uring_queue_exit(&ring);
  }
  uint8_t* buffer(uint16_t bid) const {
    return static_cast<uint8_t*>(buffers.get()) + size_t{bid} * kReceiveBufferBytes;
  }
};

Status Refused(int err, const std::string& what) {
  return Status::Error(err, what + ": " + ErrnoText(err));
}

// Multishot recvmsg needs Linux 6.0, a kernel that already has every other
// piece used here. Arm one on a throwaway socket: an old kernel fails it
// right away with EINVAL; a new one leaves it pending and it is cancelled.
Status ProbeMultishot(UringState& u) {
  const int probe_fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (probe_fd < 0) return Refused(errno, "socket");
  msghdr msg{};
  msg.msg_namelen = sizeof(sockaddr_in);
  io_uring_sqe* sqe = io_uring_get_sqe(&u.ring);
  io_uring_prep_recvmsg_multishot(sqe, probe_fd, &msg, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = kBufferGroup;
  io_uring_sqe_set_data64(sqe, Tag(kRecv));
  sqe = io_uring_get_sqe(&u.ring);
  io_uring_prep_cancel64(sqe, Tag(kRecv), 0);
  io_uring_sqe_set_data64(sqe, Tag(kCancel));
  int rc = io_uring_submit(&u.ring);
  Status status;
  if (rc < 0) status = Refused(-rc, "io_uring_submit");
  // Two completions: the receive's and the cancel's.
  for (int seen = 0; rc >= 0 && seen < 2; ++seen) {
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{.tv_sec = 1, .tv_nsec = 0};
    rc = io_uring_wait_cqe_timeout(&u.ring, &cqe, &ts);
    if (rc < 0) {
      status = Refused(-rc, "waiting for the multishot recvmsg probe");
      break;
    }
    if (cqe->user_data == Tag(kRecv) && cqe->res < 0 && cqe->res != -ECANCELED) {
      status = Refused(-cqe->res, "multishot recvmsg (Linux 6.0 or later)");
    }
    io_uring_cqe_seen(&u.ring, cqe);
  }
  close(probe_fd);
  return status;
}

Result<std::unique_ptr<UringState>> SetUp(const LoopOptions& options) {
  if (options.simulate_uring_refusal != 0) {
    return Status::Error(options.simulate_uring_refusal,
                         "io_uring_queue_init: " + ErrnoText(options.simulate_uring_refusal) +
                             " (simulated for a test)");
  }
  auto u = std::make_unique<UringState>();
  io_uring_params params{};
  params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN;
  params.cq_entries = kCqEntries;
  int rc = io_uring_queue_init_params(kSqEntries, &u->ring, &params);
  if (rc == -EINVAL) {  // COOP_TASKRUN is 5.19: retry without it
    params = {};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = kCqEntries;
    rc = io_uring_queue_init_params(kSqEntries, &u->ring, &params);
  }
  if (rc < 0) return Refused(-rc, "io_uring_queue_init");
  u->ring_ready = true;

  io_uring_probe* probe = io_uring_get_probe_ring(&u->ring);
  if (probe == nullptr) return Status::Error(ENOSYS, "io_uring cannot be probed for opcodes");
  const bool has_ops = io_uring_opcode_supported(probe, IORING_OP_RECVMSG) &&
                       io_uring_opcode_supported(probe, IORING_OP_SENDMSG) &&
                       io_uring_opcode_supported(probe, IORING_OP_READ) &&
                       io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL);
  io_uring_free_probe(probe);
  if (!has_ops) return Status::Error(ENOSYS, "io_uring lacks recvmsg/sendmsg/read/cancel");
  if (!(params.features & IORING_FEAT_EXT_ARG)) {
    return Status::Error(ENOSYS, "io_uring lacks wait timeouts (IORING_FEAT_EXT_ARG, Linux 5.11)");
  }

  if (!u->buf_ring_memory.Map(kBuffers * sizeof(io_uring_buf)) ||
      !u->buffers.Map(size_t{kBuffers} * kReceiveBufferBytes)) {
    return NoMemory("cannot map the receive buffers");
  }
  u->buf_ring = static_cast<io_uring_buf_ring*>(u->buf_ring_memory.get());
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uintptr_t>(u->buf_ring);
  reg.ring_entries = kBuffers;
  reg.bgid = kBufferGroup;
  rc = io_uring_register_buf_ring(&u->ring, &reg, 0);
  if (rc < 0) return Refused(-rc, "io_uring_register_buf_ring (Linux 5.19 or later)");
  io_uring_buf_ring_init(u->buf_ring);
  const int mask = io_uring_buf_ring_mask(kBuffers);
  for (unsigned bid = 0; bid < kBuffers; ++bid) {
    io_uring_buf_ring_add(u->buf_ring, u->buffer(bid), kReceiveBufferBytes, bid, mask, bid);
  }
  io_uring_buf_ring_advance(u->buf_ring, kBuffers);

  if (Status s = ProbeMultishot(*u); !s.ok()) return s;

  // Blocking: only io_uring reads it, and io_uring polls a file that would block.
  u->doorbell = eventfd(0, EFD_CLOEXEC);
  if (u->doorbell < 0) return Refused(errno, "cannot create the doorbell eventfd");
  return u;
}

class UringLoop final : public LoopBase {
 public:
  UringLoop(std::vector<UdpSocket> sockets, LoopHandler* handler, std::unique_ptr<UringState> u)
      : LoopBase(Backend::kUring, std::move(sockets), handler, u->doorbell), u_(std::move(u)) {
    recv_msg_.msg_namelen = sizeof(sockaddr_in);
    // IP_PKTINFO, IP_TOS and UDP_GRO.
    recv_msg_.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo)) + 2 * CMSG_SPACE(sizeof(int));
  }

  ~UringLoop() override { Stop(); }

  void Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos = 0,
            Gathered gathered = Gathered::kCopy) override;
  // Also what the ring has received and the loop not yet reaped.
  bool ReceivePending() const override {
    return LoopBase::ReceivePending() || io_uring_cq_ready(&u_->ring) != 0;
  }

 private:
  bool DriveReceive() override;
  bool SocketsHandedOver() const override;
  void DriveFlush() override;
  size_t DriveQueued() const override { return direct_.size(); }
  bool SendsCoalesce() const override { return gso_ && direct_.gso(); }
  // Sends what application threads queued in direct_ and could not send;
  // on failure tries again after kSendRetryDelay.
  void FlushDirect();

  struct Received {
    uint16_t bid;
    Datagram datagram;
    // One per buffer gives it back: a GRO receive is several datagrams.
    bool owns_buffer = true;
  };

  void Run() override;
  io_uring_sqe* GetSqe();
  // One multishot receive on `fd`, its completions tagged with `slot`.
  void ArmRecv(int fd, uint32_t slot);
  // Takes in the group sockets added and lets go of the removed ones: an
  // armed receive is cancelled, and the socket closed on its last completion.
  void ApplyGroupChanges();
  // An 8-byte read of the doorbell eventfd or of the hold timer (it ends
  // when the timer expires), tagged `kind`; re-armed after each completion.
  void ArmRead(int fd, uint64_t* value, Kind kind, bool* armed);
  void SubmitSend(int id);
  // Makes the queued sends into requests, runs of them as GSO sends.
  void SubmitPending();
  void SubmitBatch(int batch);
  void RetrySends();
  // Consumes completions, a batch at a time with one CQ advance each. Never
  // calls the handler (Send calls it to free slots), so it only queues
  // received datagrams in rx_ for Deliver().
  void Reap();
  void HandleRecv(const io_uring_cqe& cqe);
  void HandleSend(const io_uring_cqe& cqe);
  void HandleGsoSend(const io_uring_cqe& cqe);
  // Hands rx_ to the handler, then gives the buffers back to the kernel.
  bool Deliver();
  void ReturnBuffers(std::span<const uint16_t> bids);
  void Drain();

  std::unique_ptr<UringState> u_;
  // Drive lock holder only: the I/O of application threads that drive.
  DirectIo direct_{counters()};

  // Loop thread only.
  msghdr recv_msg_{};  // the layout template of every received buffer
  uint64_t doorbell_value_ = 0;
  int inflight_ = 0;  // requests the kernel still holds
  bool sends_unsubmitted_ = false;  // a sendmsg SQE may wait in the SQ
  bool recv_armed_[kMaxSockets] = {};
  bool recv_cancelling_[kMaxSockets] = {};  // while applications drive
  // Drive lock holder: drivers read the socket (see Run).
  bool handed_over_[kMaxSockets] = {};
  struct Group {
    int owner = 0;
    UdpSocket socket;
    bool armed = false;
    bool closing = false;  // removed: waiting for its receive's last completion
  };
  std::map<uint32_t, Group> groups_;  // by handle
  std::vector<GroupSocket> groups_added_;
  std::vector<uint32_t> groups_removed_;
  bool doorbell_armed_ = false;
  uint64_t hold_timer_value_ = 0;
  bool hold_timer_armed_ = false;
  bool hold_timer_failed_ = false;  // its read failed: the hold is the wait's timeout again
  int recv_error_streak_ = 0;
  bool recv_backoff_ = false;
  std::vector<Received> rx_;
  std::vector<Received> delivering_;
  std::vector<Datagram> batch_;
  std::vector<uint16_t> returning_;
  std::vector<int> retry_;
  SendPool pool_;
  std::vector<int> pending_;  // slots queued by Send, not yet requests
  // Several datagrams sent as one: the message and the slots it carries.
  struct GsoBatch {
    GsoMessage message;
    std::vector<int> ids;
  };
  std::vector<std::unique_ptr<GsoBatch>> batches_;
  std::vector<int> free_batches_;
  std::vector<int> retry_batches_;
  bool gso_ = true;  // off once the kernel refused a GSO send
};

void UringLoop::Run() {
  AcquireDrive();
  while (!stop_requested()) {
    if (RetryDue(Clock::now())) {
      ClearRetry();
      recv_backoff_ = false;
      RetrySends();
      FlushDirect();
    }
    ApplyGroupChanges();
    const std::optional<Clock::time_point> hold = HoldForSleep(Clock::now());
    for (int s = 0; s < num_sockets(); ++s) {
      // A socket is read by the ring or by drivers, never both: a datagram
      // the ring took but had not delivered would be overtaken by the next
      // one a driver reads, and UC loses a message to a reorder. Drivers
      // get a socket once its receive has ended and everything it took has
      // been delivered (the round before); they give it back under the
      // lock, which none of them holds now.
      handed_over_[s] = hold && !recv_armed_[s];
      if (hold) {
        if (recv_armed_[s] && !recv_cancelling_[s]) {
          io_uring_sqe* sqe = GetSqe();
          io_uring_prep_cancel64(sqe, Tag(kRecv, static_cast<uint32_t>(s)), 0);
          io_uring_sqe_set_data64(sqe, Tag(kCancel));
          recv_cancelling_[s] = true;
        }
      } else if (!recv_armed_[s] && !recv_backoff_) {
        ArmRecv(socket_fd(s), static_cast<uint32_t>(s));
        recv_armed_[s] = true;
      }
    }
    for (auto& [handle, g] : groups_) {
      if (recv_backoff_) break;
      if (!g.armed && !g.closing) {
        ArmRecv(g.socket.fd(), handle);
        g.armed = true;
      }
    }
    if (!doorbell_armed_) ArmRead(doorbell_fd(), &doorbell_value_, kDoorbell, &doorbell_armed_);
    // The hold's end comes as the timer's read where there is one.
    const bool timed_hold = !hold_timer_failed_ && SetHoldTimer(hold);
    if (timed_hold && !hold_timer_armed_) ArmRead(hold_timer_fd(), &hold_timer_value_, kHoldTimer, &hold_timer_armed_);

    const std::optional<Clock::time_point> own = NextWake();
    // Time to the loop's deadline or the end of the applications' hold,
    // whichever is first (nullopt: neither).
    std::optional<Clock::time_point> current_hold = hold;
    auto left_at = [&](Clock::time_point t) -> std::optional<Clock::duration> {
      std::optional<Clock::time_point> wake = own;
      if (!timed_hold && current_hold && *current_hold != kForever && (!wake || *current_hold < *wake)) {
        wake = current_hold;
      }
      if (!wake) return std::nullopt;
      return *wake - t;
    };
    Clock::time_point now = Clock::now();
    std::optional<Clock::duration> left = left_at(now);
    const bool may_sleep = (!left || *left > Clock::duration::zero()) && PrepareToSleep();
    if (may_sleep) {
      // Sends this round queued leave before a driver may send: a packet a
      // completion of this round caused (an application thread polled it and
      // posted) must not overtake the ACK that came with that completion, as
      // no NIC lets it (rping's client reuses its send buffer on the reply).
      SubmitPending();
      if (sends_unsubmitted_) io_uring_submit(&u_->ring);
      sends_unsubmitted_ = false;
      // Drivers never touch the ring, so it needs no lock while we wait.
      ReleaseToSleep(own);
      for (;;) {
        __kernel_timespec ts{};
        if (left) {
          const auto ns =
              std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(*left).count());
          ts.tv_sec = ns / 1'000'000'000;
          ts.tv_nsec = ns % 1'000'000'000;
        }
        io_uring_cqe* cqe = nullptr;
        const int rc =
            io_uring_submit_and_wait_timeout(&u_->ring, &cqe, 1, left ? &ts : nullptr, nullptr);
        Add(counters().wakeups);
        if (rc < 0 && rc != -ETIME && rc != -EINTR) {
          RDMAEMU_WARN_LIMITED("io_uring wait: {}", ErrnoText(-rc));
        }
        if (rc != -ETIME || io_uring_cq_ready(&u_->ring) != 0) break;
        now = Clock::now();
        if (!SleepAgain(now, &current_hold)) break;
        left = left_at(now);
      }
      AcquireDrive();
      AfterSleep();
    } else {
      SubmitPending();
      io_uring_submit(&u_->ring);
      sends_unsubmitted_ = false;
      // A driver waiting for the lock gets its turn.
      ReleaseToSleep(now);
      AcquireDrive();
    }
    Reap();
    const bool delivered = Deliver();
    MaybeWork(delivered);
    // What a poster left queued (SendBatching::kWhileStreaming), and this
    // round's sends behind it.
    SendQueued();
  }
  // What the last round queued still leaves, before Drain cancels what the
  // kernel holds: a program that exits right after its last completion
  // owes its peer the ACK that came with it (a peer left without it
  // retransmits into a closed port until its retry count runs out).
  SubmitPending();
  if (sends_unsubmitted_) io_uring_submit(&u_->ring);
  FlushDirect();
  ReleaseToSleep(std::nullopt);
  Drain();
}

bool UringLoop::SocketsHandedOver() const {
  for (int s = 0; s < num_sockets(); ++s) {
    if (!handed_over_[s]) return false;
  }
  return true;
}

bool UringLoop::DriveReceive() {
  bool delivered = false;
  for (int s = 0; s < num_sockets(); ++s) {
    if (handed_over_[s] && direct_.ReceiveAll(socket_fd(s), s, handler(), stop_flag())) delivered = true;
  }
  return delivered;
}

void UringLoop::DriveFlush() { FlushDirect(); }

void UringLoop::FlushDirect() {
  if (direct_.empty()) return;
  int blocked = -1;
  if (direct_.Flush(socket_fds(), &blocked) !=
      DirectIo::Flushed::kAll) {
    SetRetryAt(Clock::now() + kSendRetryDelay);
  }
}

io_uring_sqe* UringLoop::GetSqe() {
  for (;;) {
    if (io_uring_sqe* sqe = io_uring_get_sqe(&u_->ring)) return sqe;
    // The SQ is full: hand it to the kernel. EBUSY means the CQ overflowed
    // and must be reaped first.
    if (io_uring_submit(&u_->ring) == -EBUSY) Reap();
  }
}

void UringLoop::ArmRecv(int fd, uint32_t slot) {
  io_uring_sqe* sqe = GetSqe();
  io_uring_prep_recvmsg_multishot(sqe, fd, &recv_msg_, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = kBufferGroup;
  io_uring_sqe_set_data64(sqe, Tag(kRecv, slot));
  ++inflight_;
}

void UringLoop::ApplyGroupChanges() {
  groups_added_.clear();
  groups_removed_.clear();
  if (!TakeGroupChanges(&groups_added_, &groups_removed_)) return;
  for (GroupSocket& added : groups_added_) {
    groups_.insert_or_assign(added.handle, Group{added.owner, std::move(added.socket)});
  }
  for (uint32_t handle : groups_removed_) {
    auto it = groups_.find(handle);
    if (it == groups_.end() || it->second.closing) continue;
    if (!it->second.armed) {
      groups_.erase(it);
      continue;
    }
    it->second.closing = true;
    io_uring_sqe* sqe = GetSqe();
    io_uring_prep_cancel64(sqe, Tag(kRecv, handle), 0);
    io_uring_sqe_set_data64(sqe, Tag(kCancel));
  }
}

void UringLoop::ArmRead(int fd, uint64_t* value, Kind kind, bool* armed) {
  io_uring_sqe* sqe = GetSqe();
  io_uring_prep_read(sqe, fd, value, sizeof(*value), 0);
  io_uring_sqe_set_data64(sqe, Tag(kind));
  *armed = true;
  ++inflight_;
}

void UringLoop::Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos,
                     Gathered gathered) {
  CheckDriving("Loop::Send");
  if (socket < 0 || socket >= num_sockets()) {
    Add(counters().send_errors);
    RDMAEMU_WARN_LIMITED("Loop::Send: no socket {} (the loop has {})", socket, num_sockets());
    return;
  }
  // Behind what an application thread queued and could not send yet, or
  // from one: the plain path, in order.
  if (DrivenByApplication() || !direct_.empty()) {
    if (direct_.Queue(socket, to, iov, tos, gathered)) FlushDirect();
    return;
  }
  int id = pool_.Acquire(socket, to, iov, tos, gathered);
  if (id < 0) {
    // Every slot is taken, most of them probably by sends the kernel has
    // finished but whose completions wait in the CQ: collect those first.
    SubmitPending();
    io_uring_submit(&u_->ring);
    Reap();
    id = pool_.Acquire(socket, to, iov, tos, gathered);
  }
  if (id < 0) {
    Add(counters().send_drops);
    return;
  }
  pending_.push_back(id);
}

void UringLoop::SubmitPending() {
  size_t at = 0;
  while (at < pending_.size()) {
    auto id_at = [&](int k) { return pending_[at + static_cast<size_t>(k)]; };
    int batch;
    if (!free_batches_.empty()) {
      batch = free_batches_.back();
      free_batches_.pop_back();
    } else {
      batch = static_cast<int>(batches_.size());
      batches_.push_back(std::make_unique<GsoBatch>());
    }
    GsoBatch& b = *batches_[batch];
    BuildGso(pool_, id_at, static_cast<int>(pending_.size() - at), gso_, &b.message);
    if (b.message.count == 1) {
      free_batches_.push_back(batch);
      SubmitSend(pending_[at++]);
      continue;
    }
    b.ids.assign(pending_.begin() + static_cast<ptrdiff_t>(at),
                 pending_.begin() + static_cast<ptrdiff_t>(at) + b.message.count);
    at += static_cast<size_t>(b.message.count);
    SubmitBatch(batch);
  }
  pending_.clear();
}

void UringLoop::SubmitBatch(int batch) {
  GsoBatch& b = *batches_[batch];
  io_uring_sqe* sqe = GetSqe();
  io_uring_prep_sendmsg(sqe, socket_fd(pool_[b.ids[0]].socket), &b.message.msg, 0);
  io_uring_sqe_set_data64(sqe, Tag(kSendGso, static_cast<uint32_t>(batch)));
  ++inflight_;
  sends_unsubmitted_ = true;
}

void UringLoop::SubmitSend(int id) {
  io_uring_sqe* sqe = GetSqe();
  io_uring_prep_sendmsg(sqe, socket_fd(pool_[id].socket), &pool_[id].msg, 0);
  io_uring_sqe_set_data64(sqe, Tag(kSend, static_cast<uint32_t>(id)));
  ++inflight_;
  sends_unsubmitted_ = true;
}

void UringLoop::RetrySends() {
  std::vector<int> again;
  again.swap(retry_);
  for (int id : again) SubmitSend(id);
  std::vector<int> batches;
  batches.swap(retry_batches_);
  for (int batch : batches) SubmitBatch(batch);
}

void UringLoop::Reap() {
  io_uring_cqe* cqes[kCqeBatch];
  for (int round = 0; round < kReapRounds; ++round) {
    const unsigned n = io_uring_peek_batch_cqe(&u_->ring, cqes, kCqeBatch);
    if (n == 0) break;
    for (unsigned i = 0; i < n; ++i) {
      const io_uring_cqe& cqe = *cqes[i];
      switch (static_cast<Kind>(cqe.user_data >> 32)) {
        case kRecv:
          HandleRecv(cqe);
          break;
        case kDoorbell:
          // The read of the counter is the whole point; it resets it to 0.
          doorbell_armed_ = false;
          --inflight_;
          break;
        case kSend:
          HandleSend(cqe);
          break;
        case kSendGso:
          HandleGsoSend(cqe);
          break;
        case kCancel:
          break;
        case kHoldTimer:
          hold_timer_armed_ = false;
          --inflight_;
          if (cqe.res < 0 && cqe.res != -ECANCELED && cqe.res != -EINTR && !hold_timer_failed_) {
            // Never seen; re-arming a read that fails would spin.
            hold_timer_failed_ = true;
            SetHoldTimer(std::nullopt);
            Log().warn("io_uring engine: the hold timer's read failed ({}); the loop thread wakes "
                       "each {} us while a program polls",
                       ErrnoText(-cqe.res), kDriveHold.count());
          }
          break;
      }
    }
    io_uring_cq_advance(&u_->ring, n);
  }
}

void UringLoop::HandleRecv(const io_uring_cqe& cqe) {
  const uint32_t slot = static_cast<uint32_t>(cqe.user_data & 0xffffffff);
  const bool ended = !(cqe.flags & IORING_CQE_F_MORE);
  if (ended) --inflight_;
  int socket;
  if (slot < kFirstGroupHandle) {
    socket = static_cast<int>(slot);
    if (ended) recv_armed_[socket] = recv_cancelling_[socket] = false;
  } else {
    auto it = groups_.find(slot);
    if (it == groups_.end()) return;  // never: a group leaves on its last completion
    socket = it->second.owner;
    if (ended) it->second.armed = false;
    if (it->second.closing) {
      // Removed: what it still brings is no longer wanted.
      if (cqe.res >= 0 && (cqe.flags & IORING_CQE_F_BUFFER)) {
        const uint16_t bid = static_cast<uint16_t>(cqe.flags >> IORING_CQE_BUFFER_SHIFT);
        ReturnBuffers(std::span<const uint16_t>(&bid, 1));
      }
      if (ended) groups_.erase(it);
      return;
    }
  }
  if (cqe.res < 0) {
    if (cqe.res == -ENOBUFS || cqe.res == -ECANCELED) return;  // re-armed after Deliver
    // ECONNREFUSED and friends: an ICMP error for an earlier send. Re-arm at
    // once the first time; back off if the receive keeps failing.
    Add(counters().receive_errors);
    Log().debug("multishot recvmsg: {}", ErrnoText(-cqe.res));
    if (ended && ++recv_error_streak_ > 1) {
      recv_backoff_ = true;
      SetRetryAt(Clock::now() + kSendRetryDelay);
    }
    return;
  }
  recv_error_streak_ = 0;
  if (!(cqe.flags & IORING_CQE_F_BUFFER)) return;
  const uint16_t bid = static_cast<uint16_t>(cqe.flags >> IORING_CQE_BUFFER_SHIFT);
  uint8_t* buf = u_->buffer(bid);
  io_uring_recvmsg_out* out = io_uring_recvmsg_validate(buf, cqe.res, &recv_msg_);
  if (out == nullptr || (out->flags & MSG_TRUNC) || out->namelen < sizeof(sockaddr_in)) {
    Add(counters().receive_errors);
    RDMAEMU_WARN_LIMITED("dropped a datagram larger than {} bytes (or malformed)",
                         kReceiveBufferBytes);
    ReturnBuffers(std::span<const uint16_t>(&bid, 1));
    return;
  }
  Received r{bid, {}};
  size_t segment = 0;  // UDP GRO: the size of each datagram of the receive
  r.datagram.socket = socket;
  std::memcpy(&r.datagram.src, io_uring_recvmsg_name(out), sizeof(sockaddr_in));
  r.datagram.dst.s_addr = INADDR_ANY;
  for (cmsghdr* c = io_uring_recvmsg_cmsg_firsthdr(out, &recv_msg_); c != nullptr;
       c = io_uring_recvmsg_cmsg_nexthdr(out, &recv_msg_, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof(info));
      r.datagram.dst = info.ipi_addr;
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
      r.datagram.tos = *CMSG_DATA(c);
    } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int value;
      std::memcpy(&value, CMSG_DATA(c), sizeof(value));
      segment = value > 0 ? static_cast<size_t>(value) : 0;
    }
  }
  const std::span<const uint8_t> data{static_cast<const uint8_t*>(io_uring_recvmsg_payload(out, &recv_msg_)),
                                      io_uring_recvmsg_payload_length(out, cqe.res, &recv_msg_)};
  if (segment != 0 && data.size() > segment) Add(counters().gro_receives);
  ForEachDatagram(data, segment, [&](std::span<const uint8_t> piece) {
    r.datagram.data = piece;
    r.owns_buffer = piece.data() == data.data();
    rx_.push_back(r);
  });
}

void UringLoop::HandleSend(const io_uring_cqe& cqe) {
  const int id = static_cast<int>(cqe.user_data & 0xffffffff);
  --inflight_;
  if (cqe.res >= 0) {
    Add(counters().datagrams_sent);
    Add(counters().bytes_sent, static_cast<uint64_t>(cqe.res));
  } else if ((cqe.res == -EAGAIN || cqe.res == -ENOBUFS) && !stop_requested()) {
    // io_uring polls for room itself, so EAGAIN is rare; ENOBUFS has no poll
    // event at all. Keep the datagram and try again shortly.
    Add(counters().send_retries);
    retry_.push_back(id);
    SetRetryAt(Clock::now() + kSendRetryDelay);
    return;
  } else if (cqe.res != -ECANCELED) {
    // Refused for good (ECONNREFUSED from an ICMP error, EMSGSIZE, ...).
    Add(counters().send_errors);
    Log().debug("sendmsg to {}: {}", ToString(pool_[id].to), ErrnoText(-cqe.res));
  }
  pool_.Release(id);
}

void UringLoop::HandleGsoSend(const io_uring_cqe& cqe) {
  const int batch = static_cast<int>(cqe.user_data & 0xffffffff);
  GsoBatch& b = *batches_[batch];
  --inflight_;
  size_t resend_from = b.ids.size();  // the slots that go again, one by one
  if (cqe.res >= 0) {
    Add(counters().datagrams_sent, b.ids.size());
    Add(counters().bytes_sent, static_cast<uint64_t>(cqe.res));
    Add(counters().gso_sends);
  } else if ((cqe.res == -EAGAIN || cqe.res == -ENOBUFS) && !stop_requested()) {
    Add(counters().send_retries);
    retry_batches_.push_back(batch);
    SetRetryAt(Clock::now() + kSendRetryDelay);
    return;
  } else if (cqe.res != -ECANCELED && !stop_requested()) {
    if (GsoRefused(-cqe.res)) {
      // Each datagram then meets its own fate.
      if (gso_) Log().info("UDP GSO refused by the kernel ({}): sending one datagram per packet", ErrnoText(-cqe.res));
      gso_ = false;
      resend_from = 0;
    } else {
      // Refused for good (ECONNREFUSED from an ICMP error): the first
      // datagram is dropped, as a single send's would be.
      Add(counters().send_errors);
      Log().debug("sendmsg to {}: {}", ToString(pool_[b.ids[0]].to), ErrnoText(-cqe.res));
      resend_from = 1;
    }
  }
  // Reap never submits (a full SQ would make it reap inside itself): the
  // slots that go again are sent by the next round.
  for (size_t i = 0; i < b.ids.size(); ++i) {
    if (i >= resend_from) {
      retry_.push_back(b.ids[i]);
    } else {
      pool_.Release(b.ids[i]);
    }
  }
  if (resend_from < b.ids.size()) SetRetryAt(Clock::now());
  b.ids.clear();
  free_batches_.push_back(batch);
}

bool UringLoop::Deliver() {
  bool delivered = false;
  if (stop_requested()) rx_.clear();  // Drain returns the buffers with the ring
  // A Send inside OnDatagrams may reap more datagrams into rx_: they are
  // delivered by the next pass, never into the vector being handed out.
  while (!rx_.empty()) {
    delivering_.swap(rx_);
    batch_.clear();
    uint64_t bytes = 0;
    for (const Received& r : delivering_) {
      batch_.push_back(r.datagram);
      bytes += r.datagram.data.size();
    }
    Add(counters().datagrams_received, batch_.size());
    Add(counters().bytes_received, bytes);
    Add(counters().batches);
    handler().OnDatagrams(batch_);
    returning_.clear();
    for (const Received& r : delivering_) {
      if (r.owns_buffer) returning_.push_back(r.bid);
    }
    ReturnBuffers(returning_);
    delivering_.clear();
    delivered = true;
  }
  return delivered;
}

void UringLoop::ReturnBuffers(std::span<const uint16_t> bids) {
  const int mask = io_uring_buf_ring_mask(kBuffers);
  int offset = 0;
  for (uint16_t bid : bids) {
    io_uring_buf_ring_add(u_->buf_ring, u_->buffer(bid), kReceiveBufferBytes, bid, mask, offset++);
  }
  io_uring_buf_ring_advance(u_->buf_ring, offset);
}

// Cancels whatever the kernel still holds and waits for the last completion,
// so that no request outlives the memory it points into.
void UringLoop::Drain() {
  io_uring_sqe* sqe = GetSqe();
  io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
  io_uring_sqe_set_data64(sqe, Tag(kCancel));
  const Clock::time_point give_up = Clock::now() + kDrainTimeout;
  io_uring_submit(&u_->ring);
  while (inflight_ > 0 && Clock::now() < give_up) {
    __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 100'000'000};
    io_uring_cqe* cqe = nullptr;
    io_uring_submit_and_wait_timeout(&u_->ring, &cqe, 1, &ts, nullptr);
    Reap();
  }
  rx_.clear();
  if (inflight_ > 0) {
    // Leak the ring and its buffers rather than free memory the kernel may
    // still write.
    Log().warn("io_uring engine: {} requests still pending at exit", inflight_);
    (void)u_.release();
  }
}

}  // namespace

Result<std::unique_ptr<Loop>> CreateUringLoop(std::vector<UdpSocket>& sockets, LoopHandler* handler,
                                              const LoopOptions& options) {
  auto state = SetUp(options);
  if (!state.ok()) return state.status();
  return std::unique_ptr<Loop>(new UringLoop(std::move(sockets), handler, std::move(state).value()));
}

}  // namespace rdmaemu::net::internal
