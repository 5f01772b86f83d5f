// Engine: the device's transport, run on one network loop per open device
// and shared by every context of that device in the process.
//
// Split the way Linux's soft-RoCE splits it:
//   requester.cc  posted WQEs -> request packets (segmentation by path MTU,
//                 PSNs, the window, retransmission from a PSN)
//   responder.cc  request packets -> checks (PSN, opcode sequence, keys,
//                 bounds, access), execution, ACK/NAK, read/atomic replay
//   completer.cc  ACKs, NAKs, read responses and atomic ACKs -> completions;
//                 the retry and RNR timers; moving a QP to ERR
//   engine.cc     the loop, packet receive checks and dispatch, UD
//
// Thread safety: AddQp/RemoveQp/Doorbell/Drive/Release from any thread;
// everything else on the thread driving the loop (its own thread, or an
// application thread inside Doorbell or Drive: net::Loop::Drive), one at a
// time, holding the QP's mu while touching a QP. "The loop thread" below
// means whichever thread drives.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "emulator/base/log.h"
#include "emulator/base/status.h"
#include "emulator/cm/manager.h"
#include "emulator/device/device.h"
#include "emulator/engine/counters.h"
#include "emulator/engine/trace.h"
#include "emulator/engine/qp.h"
#include "emulator/fault/injector.h"
#include "emulator/flow/rule.h"
#include "emulator/net/loop.h"
#include "emulator/wire/ethernet.h"
#include "emulator/wire/packet.h"

namespace rdmaemu::engine {

// Completes every WQE of the QP with WR_FLUSH_ERR, as a QP in ERR does
// (caller must not hold qp.mu).
void FlushQp(Qp& qp);
// The same for a WQ in ERR (caller must not hold wq.mu).
void FlushWq(Wq& wq);

inline constexpr std::chrono::milliseconds kStartPostedWait{100};
// How long a thread about to block for a completion event first polls the
// device's sockets (and its channel) without sleeping: a datagram that
// comes meanwhile costs no wakeup of a sleeping thread, which on a
// virtual machine costs tens of microseconds (qperf rc_lat 51 -> 20 us).
// 50 us is what Linux's documentation suggests for net.core.busy_poll.
// RDMAEMU_WAIT_SPIN_US sets it (0 turns it off).
inline constexpr std::chrono::microseconds kDefaultWaitSpin{50};
inline constexpr std::chrono::microseconds kMaxWaitSpin{10'000};
// ACK coalescing (Engine::HoldAck). A QP in a ping-pong (kAckHoldAfter
// messages alternating between received and sent) that sent a request
// within kAckHoldWindow may hold an ACK back for kAckHold, to leave behind its next
// request: that is the hold the loop thread keeps for a polling program
// (net::kDriveHold), so the held ACK's deadline never wakes a loop thread
// that sleeps on that hold. One that had to leave alone turns holding off
// on its QP for kAckHoldBackoff.
inline constexpr std::chrono::microseconds kAckHold = net::kDriveHold;
inline constexpr std::chrono::milliseconds kAckHoldWindow{10};
inline constexpr std::chrono::milliseconds kAckHoldBackoff{10};
inline constexpr uint32_t kAckHoldAfter = 16;
// Engine::AwaitsNothing looks at no more queues than this: a latency test
// has one QP, and a device with thousands keeps its polls cheap.
inline constexpr size_t kIdleScanQueues = 32;

class Engine : public net::LoopHandler, private fault::PacketSink, private cm::Wire {
 public:
  // Takes over the sockets of every port of the device and starts the loop
  // thread, which serves them all.
  // RDMAEMU_FAULTS (fault rules, docs/faults.md) is read here: a bad rule
  // fails the start (EINVAL) with a message naming it.
  static Result<std::shared_ptr<Engine>> Start(std::shared_ptr<device::Device> device);
  ~Engine() override;

  device::Device& device() { return *device_; }
  net::Backend backend() const { return loop_->backend(); }

  // A fresh QP number (24 bits, never 0 or 1, unique on this device).
  Result<uint32_t> AllocateQpn();
  void AddQp(std::shared_ptr<Qp> qp);
  // Before a destroy (not on the loop thread): waits, at most
  // kStartPostedWait, until the engine has started every WQE posted to an
  // RTS QP. A NIC has sent what was posted long before its destroy command
  // returns; programs that post unsignaled sends and destroy at once
  // (Debian's mckey) rely on it.
  void StartPosted(uint32_t qpn);
  // After this returns the engine holds no reference to the QP.
  void RemoveQp(uint32_t qpn);
  // The QP published under `qpn`, or nullptr (any thread; ibv_open_qp).
  std::shared_ptr<Qp> FindQp(uint32_t qpn);
  // Any thread holding no engine lock: the QP has new send work (or was
  // modified). The calling thread does the work itself when no other thread
  // drives the engine (the doorbell is rung only when one does).
  // `streaming`: the poster's earlier work is unfinished, so the packets
  // may wait briefly to leave in a batch (net::SendBatching).
  void Doorbell(uint32_t qpn, bool streaming = false);
  // Any thread holding no engine lock, polling an empty CQ or about to wait
  // for a completion: runs the receive side once on the calling thread
  // unless another thread is driving. False if nothing was done.
  bool Drive() { return loop_->Drive(/*receive=*/true); }
  // Drive for a poll of an empty CQ (ibv_poll_cq, ibv_start_poll). A
  // program that stops polling after its last completion (TookCompletions)
  // leaves the receive side with the engine's thread for these polls too:
  // that thread has it after each last completion anyway, and taking it for
  // a poll and giving it back costs more wakeups than the datagram.
  bool DriveForPoll() {
    LearnFromRepoll();
    if (release_when_done_.load(std::memory_order_relaxed)) return false;
    return Drive();
  }
  // Any thread holding no engine lock, whose poll has just taken
  // completions. Where they were the last awaited ones (AwaitsNothing), the
  // program either polls on (it posts again, as qperf's rc_lat does) or
  // stops without saying so: perftest's ib_write_lat spins on its buffer
  // for the peer's RDMA WRITE, which brings no completion, and held for
  // polls that had stopped, that write waited out net::kDriveHold (100 us).
  // The second kind gets the receive side back to the engine's thread at
  // once (Release); for the first that would cost a hand-off each way per
  // message. Its next poll tells which (LearnFromRepoll): a program that
  // let a datagram in meanwhile, handled by another thread, was not
  // polling for it. One that takes a receive's completion polls for what
  // comes in, and is never released. Nor is one that waited for a
  // completion event meanwhile (NoteEventWait): it waited for what came.
  void TookCompletions(bool took_receive);
  // A thread is about to wait for a completion event (ibv_get_cq_event):
  // its program is not one that stops polling, whoever takes the datagram
  // in. qperf's rc_rdma_read_lat posts a READ, waits for its event and
  // polls; taken for the first kind, it handed the sockets to the engine's
  // thread after each READ and took them back for the next wait (20 -> 60
  // us per READ).
  void NoteEventWait() {
    event_waits_.fetch_add(1, std::memory_order_relaxed);
    last_event_wait_ns_.store(net::NanosOf(Clock::now()), std::memory_order_relaxed);
  }
  // What TookCompletions has learned (tests).
  bool releases_when_done() const { return release_when_done_.load(std::memory_order_relaxed); }
  // The caller stops polling (it is about to block): the engine's own thread
  // takes the receive side back at once.
  void Release() { loop_->Release(); }
  // Any thread holding no engine lock: true when no posted work request
  // waits for the device: no send WQE outstanding, no receive WQE posted on
  // any QP, SRQ or WQ, no message half received. False where that is not
  // known at no cost: more than kIdleScanQueues QPs, WQs and SRQs, or one
  // of them locked (busy).
  bool AwaitsNothing();
  // A thread about to block for a completion event: net::Loop::BeginWait
  // and EndWait (it watches the sockets itself while it waits).
  bool BeginWait(std::vector<int>* fds) { return loop_->BeginWait(fds); }
  void EndWait() { loop_->EndWait(); }
  // How long such a thread polls before it sleeps (kDefaultWaitSpin).
  std::chrono::microseconds wait_spin() const { return wait_spin_; }

  // Multicast (IBA 10.5), any thread: UD QP `qpn` receives what is sent to
  // IPv4 group `group` (network order) on `port`, as the IP multicast the
  // group is carried in on RoCE v2. The first QP of a group on a port opens
  // the group's socket (net::UdpSocket::OpenGroup), the last to leave closes
  // it. Attaching again is no error (as rxe). ENOMEM past
  // device::kMaxMcastGrp groups or device::kMaxMcastQpAttach QPs in one;
  // the socket's errno if the host refuses the group.
  Status AttachMcast(uint32_t qpn, uint8_t port, uint32_t group);
  // EINVAL if the QP is not attached to the group. RemoveQp detaches a QP
  // from every group, as the kernel does at destroy.
  Status DetachMcast(uint32_t qpn, uint8_t port, uint32_t group);

  // Flow steering for raw packet QPs (raw.cc, flow/rule.h), any thread.
  // AddFlow gives the rule its id and returns it; ENOMEM past
  // device::kMaxFlowRules. The first rule on a port makes the port listen
  // to its segment's flooded frames (kRawSegmentGroup), the last one
  // removed stops it. RemoveQp removes the QP's rules.
  Result<uint64_t> AddFlow(flow::Rule rule);
  // EINVAL if no rule has the id.
  Status RemoveFlow(uint64_t id);

  // The device's counters: the sum of its ports'.
  CounterValues counters() const;
  // One port's. EINVAL for a port the device lacks.
  Result<CounterValues> port_counters(int port) const;
  // One QP's (any thread). ENOENT for a QPN the engine does not have.
  Result<CounterValues> qp_counters(uint32_t qpn);
  // The device's fault rules and link shaping (rdmaemu.h, the control
  // socket): add, clear, list, and what they did.
  fault::Injector& faults() { return faults_; }
  fault::FaultCounters fault_counters() const { return faults_.counters(); }
  // WQ numbers come from the QP number space (a WQ and a QP never share
  // one, as on mlx5 where both are queues of the device). AddWq publishes
  // the WQ under its number; after RemoveWq returns the engine holds no
  // reference to it through the number.
  Result<uint32_t> AllocateWqn() { return AllocateQpn(); }
  void AddWq(std::shared_ptr<Wq> wq);
  void RemoveWq(uint32_t wqn);
  std::shared_ptr<Wq> FindWq(uint32_t wqn);
  // XRC SRQs, by their number (ibv_get_srq_num, the XRCETH's): AddSrq
  // publishes one; after RemoveSrq returns, the engine no longer touches it
  // (its CQ may go).
  void AddSrq(std::shared_ptr<Srq> srq);
  void RemoveSrq(uint32_t srqn);
  std::shared_ptr<Srq> FindSrq(uint32_t srqn);

  // Test seam (tests/fuzz:receive_fuzzer): `batch` goes through the receive
  // path as if this device's sockets had received it, on the calling thread,
  // followed by one round of work and the sends it queued; returns once done.
  // Any thread holding no engine lock. False if the engine has stopped.
  bool InjectForTest(std::span<const net::Datagram> batch) { return loop_->Inject(batch); }

  // net::LoopHandler
  void OnDatagrams(std::span<const net::Datagram> batch) override;
  std::optional<Clock::time_point> OnWork(Clock::time_point now) override;

 private:
  explicit Engine(std::shared_ptr<device::Device> device);

  // cm::Wire: queues a MAD for the loop thread, which sends it from QP1
  // (SendQueuedMads) like any UD packet: through fault rules and capture.
  void SendMad(uint8_t port, uint32_t dst_ip, uint8_t dst_slot, uint8_t traffic_class,
               std::span<const uint8_t> mad) override;
  void Flush(std::chrono::steady_clock::time_point deadline) override;
  void SendQueuedMads();
  // A packet for QP1, the General Services Interface: a CM MAD goes to the
  // connection manager; anything else there is dropped and counted.
  void ReceiveGsi(const wire::PacketView& packet, const net::Datagram& dgram, uint8_t port);

  // A UD packet that arrived for a multicast group: a copy for each QP
  // attached to it on `port`.
  void ReceiveMulticast(const wire::PacketView& packet, const net::Datagram& dgram, uint8_t port);
  // Leaves the group, closing its socket if nobody is left; mcast_mu_ held.
  void LeaveGroupLocked(uint8_t port, uint32_t group, uint32_t qpn);

  // raw.cc: raw packet QPs. A frame to another port's MAC goes to that
  // port only; broadcast, multicast and any other destination are flooded
  // to the segment group, which every port with flow rules listens to.
  void ExecuteRawSend(Qp& qp, const SendWqe& wqe);
  // A datagram that carries the raw frame marker (wire/ethernet.h), from
  // `port`'s socket or its segment group socket.
  void ReceiveRawFrame(const net::Datagram& dgram, uint8_t port);
  void DeliverRaw(Qp& qp, std::span<const uint8_t> frame, const wire::FrameFields& fields,
                  uint8_t port);
  void DeliverRawRss(Qp& qp, std::span<const uint8_t> frame, const wire::FrameFields& fields);
  // RDMAEMU_RAW_SEGMENT: the IPv4 multicast group of the raw segment, when
  // not wire::kRawSegmentGroup (separate segments on one host: tests that
  // run at once). EINVAL for an address outside 224.0.0.0/4.
  Status RawSegmentFromEnvironment();
  // Drops the rules `drop` selects, leaving the segment group on ports left
  // without rules; flows_mu_ held. How many it dropped.
  size_t EraseFlowsLocked(const std::function<bool(const flow::Rule&)>& drop);

  // engine.cc: UD and shared helpers.
  void ExecuteUdSend(Qp& qp, const SendWqe& wqe);
  // A UD or raw send is done once it has left (nothing acknowledges it):
  // frees its SQ slot and completes it if signaled or failed.
  void CompleteUnackedSend(Qp& qp, const SendWqe& wqe, objects::WcStatus status);
  // A UD QP hears only what arrives on its own port (`port`).
  void ReceiveUd(Qp& qp, const wire::PacketView& packet, const net::Datagram& dgram, uint8_t port);
  // ReceiveUd for a QP with an indirection table: the message goes to the
  // WQ the RX hash picks and completes on that WQ's CQ.
  void ReceiveUdRss(Qp& qp, const wire::PacketView& packet, const net::Datagram& dgram);
  // Scatters a UD message (GRH area, then payload) into a receive WQE and
  // fills the completion's status and length.
  void DeliverUd(const RecvWqe& wqe, uint32_t pd, uint32_t num, const wire::PacketView& packet,
                 const net::Datagram& d, objects::Cqe& cqe);
  // Builds one packet for `qp` (counted on it) to its peer (RC/UC) or
  // `dst_ip` (network order) and sends it from the socket of the QP's port
  // (its current path; port 1 without a QP), through the fault rules when
  // any are active. The BTH gets the P_Key of the QP's pkey_index.
  // `port` 0: the QP's port (port 1 without a QP).
  // `tos`: the IP header's TOS byte (the GRH's traffic class); by default
  // the QP's current path's.
  // The destination's host slot (hosts.h) is its QPN's, or `gsi_slot` for
  // QP1, which every process has.
  void Transmit(Qp* qp, const wire::PacketFields& fields, wire::Gather payload, uint32_t dst_ip,
                uint8_t port = 0, std::optional<uint8_t> tos = std::nullopt, uint8_t gsi_slot = 0);
  // Counts a packet Transmit built on its QP and traces it.
  void Sent(Qp* qp, const wire::PacketFields& fields, wire::Gather payload, uint32_t dst_ip, size_t length);
  // fault::PacketSink. SendNow takes a packet past the fault rules to the
  // socket of `port` (through SendDatagram, counted on the port); Deliver
  // processes a received datagram past them through ReceiveDatagram (its
  // port is the one whose socket received it: datagram.socket + 1).
  void SendNow(uint8_t port, const sockaddr_in& to, std::span<const uint8_t> bytes, uint8_t tos) override;
  void Deliver(const net::Datagram& datagram) override;
  // Counts what a fault rule did (a fault_ counter) on the packet's port and
  // on its local QP when that is one of this engine's.
  void Counted(fault::FaultEvent what, uint8_t port, uint32_t local_qpn, uint64_t n) override;
  void ReceiveDatagram(const net::Datagram& datagram, Clock::time_point now);
  // OnDatagrams, for one datagram of a live port: through the fault rules
  // where there are any, else straight to ReceiveDatagram.
  void Admit(const net::Datagram& datagram, uint8_t port, Clock::time_point now);
  // Forced protocol events (fault rules rnr, nak, error); qp.mu held.
  // ForcedError: true if an `error` rule moved the QP to ERR on this packet.
  bool ForcedError(Qp& qp, const wire::PacketView& packet);
  // True if an `rnr` or `nak` rule answered this new request message.
  bool ForcedResponse(Qp& qp, const wire::PacketView& packet);
  // Bumps a counter of the QP's port (its current path; port 1 without a
  // QP) and, if given, of the QP. Relaxed: the data path pays one
  // uncontended add each.
  void Count(Qp* qp, std::atomic<uint64_t> Counters::*c, uint64_t n = 1) {
    CountPort(qp != nullptr ? qp->attrs.port : 1, c, n);
    if (qp != nullptr) (qp->counters.*c).fetch_add(n, std::memory_order_relaxed);
  }
  // The same for a packet of no QP (or none known yet) on `port`.
  void CountPort(uint8_t port, std::atomic<uint64_t> Counters::*c, uint64_t n = 1) {
    (ports_[(port - 1) & 1].*c).fetch_add(n, std::memory_order_relaxed);
  }
  // The QP's share of something the port has counted already.
  static void CountOnQp(Qp& qp, std::atomic<uint64_t> Counters::*c, uint64_t n = 1) {
    (qp.counters.*c).fetch_add(n, std::memory_order_relaxed);
  }
  // The received packet's BTH P_Key matches the QP's P_Key (IBA 10.9.3);
  // a mismatch is dropped and counted (engine and port bad_pkey_cntr).
  bool PkeyAccepted(Qp& qp, const wire::PacketView& packet);
  // Device::Fatal: every QP to ERR with its work flushed (any thread).
  void FailAllQps();
  // The one exit to the socket: every datagram (`length` bytes gathered
  // from `iov`, what `gathered` says borrowed) leaves here, counted on the
  // port, and is captured here (after fault rules, before the kernel),
  // exactly as it goes out.
  void SendDatagram(uint8_t port, const sockaddr_in& to, std::span<const iovec> iov, size_t length,
                    uint8_t tos, net::Gathered gathered = net::Gathered::kCopy);
  // Validates an SGE list against the QP's PD; `write` needs LOCAL_WRITE.
  objects::WcStatus CheckSges(const Qp& qp, const std::vector<Sge>& sges, bool write);
  // The same against `pd`, naming queue `num` (a QP or WQ) in the log.
  objects::WcStatus CheckSges(uint32_t pd, uint32_t num, const std::vector<Sge>& sges, bool write);
  // The PD receive WQEs of `qp` are checked against: its SRQ's, if any.
  static uint32_t RecvPd(const Qp& qp) { return qp.srq ? qp.srq->pd : qp.pd; }
  // The PD remote accesses to `qp` are checked against: an XRC target has
  // none and uses its message's XRC SRQ's (IBA 11.2.11).
  static uint32_t AccessPd(const Qp& qp) {
    return qp.type == QpType::kXrcRecv && qp.srq ? qp.srq->pd : qp.pd;
  }
  // Copies [offset, offset+len) of a WQE's payload into out.
  void GatherRange(const SendWqe& wqe, uint64_t offset, size_t len, std::vector<uint8_t>& out);
  // The same bytes as spans into the registered memory itself (or the
  // inline data), for BuildPacket to copy once into the packet: valid until
  // the next call, the regions held until then.
  wire::Gather GatherSpans(const SendWqe& wqe, uint64_t offset, size_t len);
  // Writes data at `offset` into an SGE list (already checked).
  void ScatterRange(const std::vector<Sge>& sges, uint64_t offset, std::span<const uint8_t> data);
  // Pushes a completion; a full CQ is overrun: CQ_ERR is raised and the QP
  // goes to ERR (IBA 11.4.2.1), as Linux's soft-RoCE does. A receive lost
  // that way that came from an SRQ also puts the SRQ in error (SRQ_ERR).
  void PushCqe(Qp& qp, objects::Cq* cq, const objects::Cqe& cqe);
  // Pushes a receive completion: on the QP's recv CQ, or for an XRC target
  // on the CQ of the XRC SRQ it received into (XrcRecvCqe).
  void PushRecvCqe(Qp& qp, const objects::Cqe& cqe);
  void PushXrcRecvCqe(Qp& qp, const objects::Cqe& cqe);
  // An XRC target's request (qp.mu held): names an XRC SRQ of the QP's
  // domain in its XRCETH, which becomes qp.srq; false after a NAK.
  bool ResolveXrcSrq(Qp& qp, const wire::PacketView& packet);
  // Pushes a WQ's receive completion (wq.mu held); an overrun of the WQ's
  // CQ raises CQ_ERR, moves the WQ to ERR, flushes it and raises WQ_FATAL.
  // The QP that received is not affected: the WQ is the queue that failed.
  void PushWqCqe(Wq& wq, const objects::Cqe& cqe);
  // Moves the QP to ERR and flushes it; a QP on an SRQ reports
  // QP_LAST_WQE_REACHED (IBA 11.6.3.5).
  void EnterError(Qp& qp);
  void RaiseQpEvent(Qp& qp, device::AsyncEventType type);
  // Takes the next receive WQE from the QP's SRQ or RQ (raising the SRQ's
  // limit event when it fires); false when there is none.
  bool TakeRecv(Qp& qp, RecvWqe* out);
  // Gives back a receive WQE whose message was dropped (UC).
  void ReturnRecv(Qp& qp, RecvWqe&& wqe);

  // tag_matching.cc: SENDs into a tag-matching SRQ (docs/tag-matching.md).
  // On a SEND's first packet (qp.mu held): reads the TMH, matches it and
  // takes the message's receive into qp.recv (a tagged buffer or an
  // ordinary WQE), qp.tm saying how it is delivered. False when the packet
  // has been answered instead (an RNR NAK, or a NAK and the QP to ERR).
  bool TakeTmRecv(Qp& qp, const wire::PacketView& packet);
  // The message's last packet arrived: fills its completion's opcode, flags
  // and tag info; a matched rendezvous queues the device's READ.
  void FinishTmRecv(Qp& qp, objects::Cqe& c);
  // A WQE of the device's own completed (CompleteFront): the rendezvous
  // READ's TM_RECV with DATA_VALID and then the FIN to the sender.
  void CompleteDeviceWork(Qp& qp, const SendWqe& w, objects::WcStatus status);

  // requester.cc
  void Progress(Qp& qp, Clock::time_point now);
  // Starts at most `limit` posted WQEs; returns how many it started.
  size_t AdmitWqes(Qp& qp, size_t limit);
  void SendRequest(Qp& qp, Inflight& f, uint32_t psn);
  // Executes a bind or local invalidate (qp.mu held); the status its
  // completion gets (MW_BIND_ERR, LOC_QP_OP_ERR), with a line saying why.
  objects::WcStatus ExecuteLocalOp(Qp& qp, const SendWqe& w);
  // Go-back-N: every request from `psn` on is sent again.
  void RetransmitFrom(Qp& qp, uint32_t psn);
  // Asks again for the response of a READ or atomic whose response was lost,
  // once per gap.
  void Rerequest(Qp& qp, Inflight& f);
  // In SQD with nothing started left: clears sq_draining and raises
  // SQ_DRAINED if the QP asked for it.
  void CheckDrained(Qp& qp);

  // path.cc: automatic path migration (IBA 17.2.8).
  // Moves an ARMED QP to its alternate path and reports PATH_MIG; false if
  // it is not armed or the alternate port is down.
  bool Migrate(Qp& qp, std::string_view why);
  void MigrateIfPortDown(Qp& qp);
  // Retries ran out on the current path: migrates (true) or reports
  // PATH_MIG_ERR if the QP had an alternate path (false: the QP then fails).
  bool MigrateOnRetriesExhausted(Qp& qp);
  void RestartOnNewPath(Qp& qp);
  // Whether an RC/UC packet from src_ip (network order) arriving on `port`
  // belongs to the QP's path; arms a REARM QP and migrates an ARMED responder
  // as the spec says.
  bool AcceptPath(Qp& qp, const wire::PacketView& packet, uint32_t src_ip, uint8_t port);

  // completer.cc
  void OnResponse(Qp& qp, const wire::PacketView& packet, Clock::time_point now);
  void AckUpTo(Qp& qp, uint32_t psn);
  void CompleteFront(Qp& qp, objects::WcStatus status);
  void CheckTimers(Qp& qp, Clock::time_point now);
  // Whether the device's sockets hold datagrams not yet handled (asked of
  // the loop once per OnWork call, and only when a timer is due).
  bool ReceiveBacklog();
  // A transport timeout may be acted on now (the pacing of CheckTimers).
  bool TakeTimeoutToken(Clock::time_point now);
  // Puts the QP among those OnWork watches, for its timer or RNR wait.
  void Activate(Qp& qp);
  // Moves the QP to ERR from the engine (retries exhausted, a NAK, a fatal
  // responder error): the failing WQE gets `status`, the rest are flushed.
  void FailQp(Qp& qp, objects::WcStatus status, const std::string& why);
  // A READ's or atomic's response arrived for a WQE whose local buffer
  // failed its check (Inflight::local_error): fails the QP if it is the
  // front WQE. False when there is no local error.
  bool FailLocally(Qp& qp, const Inflight& f);

  // responder.cc
  void OnRequest(Qp& qp, const wire::PacketView& packet);
  void SendAck(Qp& qp, uint32_t psn, uint8_t syndrome);
  void TransmitAck(Qp& qp, uint32_t psn, uint32_t msn, uint8_t syndrome);
  // ACK coalescing: holds the QP's ACK of `psn` back for its next request
  // (Progress sends it right behind) or until held_ack_until (FlushDueAcks),
  // where the QP talks both ways; a newer ACK replaces a held one. False
  // where it must leave now.
  bool HoldAck(Qp& qp, uint32_t psn);
  void FlushHeldAck(Qp& qp);
  // Sends the held ACKs that are due; when the next one is.
  std::optional<Clock::time_point> FlushDueAcks(Clock::time_point now);
  // RNR NAK for `psn` (no receive WQE): the requester retries it later.
  void SendRnrNak(Qp& qp, uint32_t psn);
  // NAKs `psn` with `code` and moves the QP to ERR; a receive WQE in use
  // completes with `recv_status` (by default the status the NAK gives the
  // requester).
  void ResponderError(Qp& qp, wire::NakCode code, uint32_t psn, const std::string& why,
                      std::optional<objects::WcStatus> recv_status = std::nullopt);
  void AnswerRead(Qp& qp, const ReplayEntry& r, uint32_t from_psn);
  // Checks and executes a new ATOMIC WRITE or FLUSH; false (the QP gone to
  // ERR with a NAK sent) when refused.
  bool ExecutePlacement(Qp& qp, const wire::PacketView& packet);
  // The region or bound memory window an rkey names (nullptr if none).
  std::shared_ptr<const objects::Mr> RemoteRegion(uint32_t rkey);
  // Why the QP may not access [va, +len) of `mr` with `need` (an
  // objects::Access bit), or "" when it may. `mr` may be nullptr.
  std::string RemoteRefusal(const Qp& qp, const objects::Mr* mr, uint32_t rkey, uint32_t need,
                            uint64_t va, uint64_t len);

  const std::shared_ptr<device::Device> device_;
  std::unique_ptr<net::Loop> loop_;
  // Port p's socket is the loop's socket p-1. Constant after Start.
  struct Endpoint {
    uint32_t ip = 0;        // host order
    uint16_t udp_port = 0;  // host order: the port bound (ephemeral at a host slot > 0)
    uint16_t service_port = 0;  // host order: where slot 0 of an address receives (4791)
  };
  // The UDP port that reaches slot `slot` at `dst_ip` (network order):
  // the slot's record (hosts.h), looked up at most once a second per
  // slot, else (slot 0, or a slot no process holds) the service port.
  uint16_t DestinationPort(const Endpoint& from, uint32_t dst_ip, uint8_t slot);
  // The UDP port datagram `d` was sent to (host order).
  uint16_t ArrivalPort(const net::Datagram& d) const;
  std::vector<Endpoint> endpoints_;
  std::chrono::microseconds wait_spin_ = kDefaultWaitSpin;  // constant after Start
  // When the last datagram reached the device (steady clock ns; 0: none).
  std::atomic<int64_t> last_datagram_ns_{0};
  // For the log line of a QP whose retries ran out: when it last heard from
  // its peer, and the device from anyone.
  std::string HeardLast(const Qp& qp, Clock::time_point now) const;
  // TookCompletions and LearnFromRepoll, any polling thread: a hint, relaxed.
  // Datagrams received on every port (ports_).
  uint64_t DatagramsReceived() const;
  // A poll took a program's last awaited completion, when the device had
  // received took_last_received_ datagrams.
  std::atomic<bool> took_last_{false};
  std::atomic<uint64_t> took_last_received_{0};
  // Waits for a completion event begun (NoteEventWait), and their number
  // when a poll took the last awaited completion.
  std::atomic<uint64_t> event_waits_{0};
  std::atomic<uint64_t> took_last_waits_{0};
  // The program stops polling after its last completion: release then.
  std::atomic<bool> release_when_done_{false};
  void LearnFromRepoll() {
    if (!took_last_.load(std::memory_order_relaxed) || !took_last_.exchange(false, std::memory_order_relaxed)) {
      return;
    }
    const bool waited = event_waits_.load(std::memory_order_relaxed) !=
                        took_last_waits_.load(std::memory_order_relaxed);
    release_when_done_.store(
        !waited && DatagramsReceived() != took_last_received_.load(std::memory_order_relaxed),
        std::memory_order_relaxed);
  }
  Counters ports_[2];  // per port; a device has at most 2
  fault::Injector faults_;

  std::shared_mutex qps_mu_;
  std::unordered_map<uint32_t, std::shared_ptr<Qp>> qps_;  // guarded by qps_mu_
  uint32_t next_qpn_ = 0x11;                                // guarded by qps_mu_; below 2^20 (hosts.h)

  // DestinationPort's cache of other processes' slots: (address, slot) →
  // (port, when looked up).
  std::mutex slot_ports_mu_;
  std::map<std::pair<uint32_t, uint8_t>, std::pair<uint16_t, Clock::time_point>> slot_ports_;  // guarded by slot_ports_mu_

  std::unordered_map<uint32_t, std::shared_ptr<Wq>> wqs_;  // guarded by qps_mu_
  std::unordered_map<uint32_t, std::shared_ptr<Srq>> srqs_;  // guarded by qps_mu_: XRC SRQs

  // Multicast groups joined, by (port, group address in network order).
  struct Group {
    uint32_t handle = 0;         // its socket in the loop (AddGroupSocket)
    std::vector<uint32_t> qpns;  // the QPs attached
  };
  std::mutex mcast_mu_;
  std::map<std::pair<uint8_t, uint32_t>, Group> groups_;  // guarded by mcast_mu_

  // Flow rules of raw packet QPs, and per port the socket of the segment
  // group it listens on while it has rules (0: none).
  std::shared_mutex flows_mu_;
  std::vector<flow::Rule> flows_;     // guarded by flows_mu_
  uint64_t next_flow_id_ = 1;         // guarded by flows_mu_
  uint32_t raw_segment_ = wire::kRawSegmentGroup;  // host order; constant after Start
  uint32_t segment_socket_[2] = {};   // guarded by flows_mu_
  bool segment_joined_[2] = {};       // guarded by flows_mu_

  std::mutex pending_mu_;
  std::vector<uint32_t> pending_;  // guarded by pending_mu_: QPs rung since the last OnWork
  std::optional<bool> receive_backlog_;  // driving thread: ReceiveBacklog's answer in this OnWork
  // Transport timeouts are paced per device (CheckTimers): a bucket of
  // kTimeoutBurst, refilled by kTimeoutsPerMs each millisecond. A few QPs
  // timing out never wait; 10,000 at once resend over about 0.6 s.
  static constexpr int kTimeoutBurst = 64;
  static constexpr int kTimeoutsPerMs = 16;
  int timeout_tokens_ = kTimeoutBurst;
  Clock::time_point timeout_tokens_at_{};

  struct QueuedMad {
    uint8_t port;
    uint32_t dst_ip;  // network order
    uint8_t dst_slot;  // the process at dst_ip (hosts.h)
    uint8_t traffic_class;
    cm::MadBytes mad;
  };
  std::mutex mads_mu_;
  std::vector<QueuedMad> mads_;  // guarded by mads_mu_: MADs for the loop to send
  uint64_t mads_queued_ = 0;     // guarded by mads_mu_: ever handed to SendMad
  uint64_t mads_sent_ = 0;       // guarded by mads_mu_: of those, handed to the loop

  PacketTracer tracer_;  // per-packet trace lines, rate-limited (trace.h)

  // Loop thread only.
  std::set<uint32_t> active_;      // QPs with requests in flight (timers)
  // When OnWork next needs to look at active_: the earliest timer or RNR
  // wait of its QPs (nullopt: none). Activate lowers it; OnWork skips the
  // walk before then, so a post or a batch of datagrams costs the same with
  // 10,000 QPs in flight as with one.
  std::optional<Clock::time_point> scan_at_;
  // When a thread last began to wait for a completion event (NoteEventWait).
  // A program that waits for events holds no ACK (HoldAck): qperf's rc_lat
  // went from 12-17 to 22-27 us with holds.
  std::atomic<int64_t> last_event_wait_ns_{0};
  std::vector<uint32_t> held_acks_;  // QPs that may hold an ACK (Qp::ack_hold_listed)
  std::vector<uint32_t> deferred_;   // OnDatagrams: requests, after the batch's responses
  std::vector<uint8_t> scratch_;   // payload gathering
  std::vector<std::span<const uint8_t>> gather_;                // GatherSpans' spans
  std::vector<std::shared_ptr<const objects::Mr>> gather_mrs_;  // and the regions they are in
  std::vector<uint8_t> packet_;    // packet building
  std::vector<uint32_t> mcast_members_;  // ReceiveMulticast: a group's QPs
  std::vector<uint32_t> raw_targets_;    // ReceiveRawFrame: the QPs a frame goes to
  // ExecuteRawSend's datagram, apart from packet_: that one keeps the size
  // of the largest packet, which BuildPacket writes into.
  std::vector<uint8_t> raw_datagram_;
};

// One engine per open device in the process, shared by its contexts.
Result<std::shared_ptr<Engine>> AcquireEngine(int device_index);
// The engine of device `device_index` if one runs, else nullptr; starts
// nothing (the control plane looks, it does not open devices).
std::shared_ptr<Engine> FindEngine(int device_index);

}  // namespace rdmaemu::engine
