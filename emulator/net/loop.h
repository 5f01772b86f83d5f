// Loop: the engine's network thread. One per open device.
//
// A Loop owns the device's UdpSockets (one per port, at most kMaxSockets)
// and one thread. The thread sleeps in the kernel
// until a datagram arrives on any socket, someone rings the doorbell, or the handler's
// deadline passes; then it calls the handler and sends what the handler queued.
// With no deadline it sleeps indefinitely: an idle loop uses no CPU.
//
// Two backends behave the same:
//   kUring  io_uring: one multishot recvmsg per socket into a shared provided buffer ring,
//           sendmsg SQEs submitted together, the doorbell eventfd read by an
//           SQE, the deadline as the wait's timeout.
//   kEpoll  epoll_wait on the sockets and the doorbell eventfd, recvmmsg and
//           sendmmsg batches.
// kAuto picks io_uring and falls back to epoll where the kernel refuses it
// (the default seccomp profile of Docker 25 and later, kernel.io_uring_disabled,
// a kernel older than 6.0), saying so once in the log at info level.
//
// Driving (DESIGN.md, "The fast path"): an application thread may do a round
// of the loop's work itself, without blocking, with Drive(): it receives
// what the sockets hold (plain recvmmsg), runs the handler and sends
// (sendmmsg) on its own thread, saving the hand-off to the loop thread and
// back. One thread drives at a time: the loop thread holds the drive lock
// whenever it is not blocked in the kernel, and Drive only try-locks it.
// While application threads keep driving the receive side, the loop thread
// stops watching the sockets (it would only wake to find them drained) and
// sleeps until its deadline or until nobody has driven for kDriveHold; then
// it watches them again. The hold's end is a timer that drivers push
// forward, so a program that keeps polling never wakes the loop thread.
// Release() hands the sockets back at once. A thread about to block for a
// completion event may keep them while it waits and watch them itself
// (BeginWait/EndWait): one wakeup per datagram, its own.
//
// Thread safety:
//   - Create, Start, Stop and the destructor: the owning thread (never the
//     loop thread itself).
//   - Ring, Drive, Release, InLoopThread, stats, backend: any thread.
//   - Send: the thread driving, i.e. from inside a LoopHandler call.
//   - The LoopHandler is called by the thread driving (the loop thread or a
//     Drive caller), one call at a time.
#pragma once

#include <netinet/in.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/net/udp_socket.h"

namespace rdmaemu::net {

// One received datagram. `data` points into the loop's receive buffer and is
// valid only during the OnDatagrams call that delivers it.
struct Datagram {
  sockaddr_in src;  // the sender's address and port
  in_addr dst;      // the destination address in the IP header (IP_PKTINFO)
  std::span<const uint8_t> data;
  int socket = 0;   // which of the loop's sockets received it (0-based)
  uint8_t tos = 0;  // the IP header's TOS byte: RoCE v2's traffic class (IP_RECVTOS)
};

class LoopHandler {
 public:
  virtual ~LoopHandler() = default;
  // Loop thread. A batch of received datagrams; data is valid only during the call.
  virtual void OnDatagrams(std::span<const Datagram> batch) = 0;
  // Loop thread. Called after each round of receives, after every Ring(), and
  // when the deadline it returned last time has passed. The handler does its
  // pending work (it may call Loop::Send) and returns when it next wants to be
  // called (nullopt = only on new datagrams or Ring()). Each call replaces the
  // previous deadline.
  virtual std::optional<std::chrono::steady_clock::time_point> OnWork(
      std::chrono::steady_clock::time_point now) = 0;
};

enum class Backend { kAuto, kUring, kEpoll };

// "auto" | "uring" | "epoll" (the values of RDMAEMU_ENGINE).
Result<Backend> ParseBackend(std::string_view text);
std::string_view ToString(Backend backend);

// Counters, each read with relaxed ordering: a snapshot, not a transaction.
struct LoopStats {
  uint64_t datagrams_received = 0;
  uint64_t bytes_received = 0;
  uint64_t datagrams_sent = 0;
  uint64_t bytes_sent = 0;
  // Sends the kernel refused for good (ECONNREFUSED from an ICMP error,
  // EMSGSIZE, ...): counted and dropped.
  uint64_t send_errors = 0;
  // Sends dropped because kMaxPendingSends were already waiting.
  uint64_t send_drops = 0;
  // Times a send found the socket buffer full (EAGAIN/ENOBUFS) and waited.
  uint64_t send_retries = 0;
  // Receives that failed or were truncated (larger than kReceiveBufferBytes,
  // which no IPv4 datagram is).
  uint64_t receive_errors = 0;
  uint64_t batches = 0;          // OnDatagrams calls
  uint64_t work_calls = 0;       // OnWork calls
  uint64_t wakeups = 0;          // returns from a blocking wait in the kernel
  uint64_t doorbell_writes = 0;  // eventfd writes by Ring()
  // Sends that carried several datagrams as one (UDP GSO), and receives
  // that brought several (UDP GRO): each datagram is counted above too.
  uint64_t gso_sends = 0;
  uint64_t gro_receives = 0;
  // CPU time the loop thread has used (its final value once it has exited).
  std::chrono::nanoseconds cpu_time{0};
};

// Each receive buffer holds the largest IPv4 UDP payload (65507 bytes) with
// the sender's address and control messages: a UDP GRO receive, several
// datagrams of one GSO send that the kernel kept together, fits whole.
// Buffers are mapped, not written, until the kernel fills them.
inline constexpr size_t kReceiveBufferBytes = 68 * 1024;
// Datagrams queued or in the kernel's hands but not yet sent. A Send beyond
// this is dropped and counted (send_drops), not queued: the transport above
// is reliable (RC retransmits) and must not make the engine's memory grow
// without bound when a peer stops reading.
inline constexpr size_t kMaxPendingSends = 4096;
// A device has at most two ports, each with its own socket.
inline constexpr int kMaxSockets = 2;
// How long after the last Drive(receive) the loop thread leaves the sockets
// to the application threads. It bounds the delay of a datagram that
// arrives once a program has stopped polling without saying so (Release),
// as perftest's ib_write_lat does every iteration (docs/performance.md: 1 ms
// made it 524 µs). Shorter costs a polling program more pushes of the hold
// timer (one per half hold); before the timer, 50 µs woke the loop thread so
// often that ib_send_lat lost 3x.
inline constexpr std::chrono::microseconds kDriveHold{100};
// A steady-clock time as nanoseconds, the form the atomics and timers that
// threads share hold it in (the loop's hold, the engine's last-heard times).
inline int64_t NanosOf(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
// While a thread waits for a completion event with the sockets (BeginWait),
// how often the loop thread looks whether the applications still act.
inline constexpr std::chrono::milliseconds kWaitCheck{1};
// A Drive of a poster that streams (SendBatching::kWhileStreaming) leaves
// up to this many datagrams queued for the next round's send, so that a
// program posting one message at a time still leaves in batches (one
// sendmmsg, and one GSO send where they share a size and destination).
inline constexpr size_t kPostBatch = 16;
// How long they may wait at most, when nothing else sends them first.
inline constexpr std::chrono::microseconds kPostWait{100};

// Whether the sends a Drive queues may wait for a later round.
enum class SendBatching {
  kOff,  // they leave before Drive returns
  // They may wait, up to kPostBatch of them, for a later round: the next
  // Drive or BeginWait of any application thread, or the loop thread's,
  // kPostWait after the first of them at the latest. For a poster whose
  // earlier work is unfinished (it streams): one that waits for each
  // message's completion gets kOff.
  kWhileStreaming,
};

// What Send copies of a datagram's pieces.
enum class Gathered : uint8_t {
  kCopy,  // all of them, before Send returns
  // A datagram of three pieces (headers, payload, trailer) whose payload,
  // of at least kMinBorrowedPayload bytes, stays where it is, unchanged,
  // until the datagram has left: only its headers and trailer are copied,
  // and the kernel copies the payload straight from the caller's memory (a
  // registered region). A smaller payload, or another shape, is copied.
  kBorrowPayload,
};
// Below this a payload costs less to copy than the two more pieces of a
// send it would be.
inline constexpr size_t kMinBorrowedPayload = 1024;

struct LoopOptions {
  // Test seam: an errno value (EPERM, ENOSYS, ...) makes io_uring setup fail
  // as if the kernel refused it, so the fallback path can be exercised on a
  // kernel that supports io_uring. 0: off.
  int simulate_uring_refusal = 0;
};

class Loop {
 public:
  // Sets up the backend (probing the kernel for io_uring when asked) and takes
  // over the socket. The thread starts with Start(); `handler` must outlive
  // the loop. kUring fails, with the kernel's errno, where io_uring is refused.
  static Result<std::unique_ptr<Loop>> Create(Backend backend, UdpSocket socket,
                                              LoopHandler* handler,
                                              const LoopOptions& options = {});
  // The same over 1..kMaxSockets sockets, served by the one thread; a
  // datagram says which socket received it, and Send names the one to use.
  static Result<std::unique_ptr<Loop>> Create(Backend backend, std::vector<UdpSocket> sockets,
                                              LoopHandler* handler,
                                              const LoopOptions& options = {});

  virtual ~Loop() = default;

  // The backend actually running (never kAuto).
  virtual Backend backend() const = 0;
  // The bound address of a socket (0-based, as in Datagram::socket).
  virtual const sockaddr_in& address(int socket = 0) const = 0;
  virtual int num_sockets() const = 0;
  // Spawns the thread. Call once.
  virtual void Start() = 0;
  // Wakes the thread and joins it. Idempotent; the destructor calls it.
  // Once Stop has begun the handler is not called again. What the last
  // round queued is still handed to the kernel; datagrams waiting for room
  // in a full socket buffer are discarded.
  virtual void Stop() = 0;
  // Any thread: asks for an OnWork call soon. Costs no system call while the
  // loop is awake; writes the doorbell eventfd only when it sleeps.
  virtual void Ring() = 0;
  // Any thread not inside a LoopHandler call: if no other thread is driving,
  // does one round on the calling thread without blocking and returns true:
  // with `receive`, takes what the sockets hold and marks the receive side as
  // driven by applications (see above); then OnWork, then sends. Returns
  // false, doing nothing, when another thread drives (or the loop stops).
  // `batching` says whether the sends may wait for a later round.
  virtual bool Drive(bool receive, SendBatching batching = SendBatching::kOff) = 0;
  // Any thread: the caller stops driving the receive side (it is about to
  // block): the loop thread watches the sockets again at once.
  virtual void Release() = 0;
  // Any thread not inside a LoopHandler call, about to block until an fd of
  // its own is ready (a completion channel's): application threads keep
  // the receive side for as long as the caller waits, and `fds` gets the
  // sockets' fds for the caller to watch beside its own; the caller drives
  // when one is readable, so the datagram wakes it alone, not the loop
  // thread first (the loop thread lets go of the sockets within a round,
  // if it still had them: a waiter takes them whether or not a program
  // drove before, since it is about to). Never waits for a round in
  // progress: that round's thread sends what posters left queued and lets
  // go of the sockets when it next looks. True; false, doing nothing, when
  // the loop stops (then Release and block as before).
  // Every true is followed by one EndWait, which starts the usual
  // kDriveHold: if nobody drives or waits again by its end, the loop thread
  // takes the sockets back. While a thread waits, the loop thread looks
  // once per kWaitCheck whether the applications still act; when one has
  // waited that long with nothing done, it sleeps until its EndWait (which
  // then rings it), so a program blocked on its channel costs no CPU.
  virtual bool BeginWait(std::vector<int>* fds) = 0;
  virtual void EndWait() = 0;
  // Test seam (the receive-path fuzz target, tests/fuzz): one round on the
  // calling thread as Drive(false) does, with `batch` handed to the handler
  // first as if the sockets had received it, so a test can push crafted
  // datagrams through the handler synchronously and deterministically.
  // Unlike Drive it waits for the thread driving to finish its round. False
  // if the loop has stopped. Any thread not inside a LoopHandler call.
  virtual bool Inject(std::span<const Datagram> batch) = 0;
  // Loop thread only: sends one datagram, gathered from `iov` (copied before
  // Send returns, but for what `gathered` borrows), with `tos` in its IP
  // header (RoCE v2's traffic class). Sends are queued and flushed together
  // when the handler returns, or earlier when a batch fills.
  virtual void Send(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos = 0,
                    Gathered gathered = Gathered::kCopy) = 0;
  // From the first socket.
  void Send(const sockaddr_in& to, std::span<const iovec> iov) { Send(0, to, iov); }
  virtual bool InLoopThread() const = 0;
  // The driving thread: whether datagrams sent one after another to the
  // same address leave as one UDP GSO send, whoever sends them (the loop
  // thread or a driver); false once the kernel has refused GSO.
  virtual bool SendsCoalesce() const = 0;
  // The driving thread (inside a LoopHandler call): true if a datagram has
  // reached a socket of the device and the handler has not had it yet. A
  // transport timer asks before it fires: the ACK it waits for may be in
  // that backlog, which a NIC would have taken in long ago.
  virtual bool ReceivePending() const = 0;
  virtual LoopStats stats() const = 0;

  // Any thread: receive on a multicast group's socket too (UdpSocket::
  // OpenGroup) while the loop runs. Its datagrams are delivered as if socket
  // `owner` (the port that joined) had received them, their `dst` the
  // group. Takes effect on the loop's next round. The handle, never reused,
  // names it to RemoveGroupSocket, after which nothing more is delivered
  // from it and the socket is closed once the backend has let go of it.
  virtual uint32_t AddGroupSocket(int owner, UdpSocket socket) = 0;
  virtual void RemoveGroupSocket(uint32_t handle) = 0;
};

}  // namespace rdmaemu::net
