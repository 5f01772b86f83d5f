// Manager: the process's connection manager, as the kernel's rdma_cm and
// ib_cm are one per host. It owns the ids' wire state (an explicit state
// machine per id, below), the port spaces, the listeners, the MADs' retries
// and timewait. librdmacm reaches it through uapi.h; each open device's
// engine carries its MADs (Wire) and hands it what arrives on QP1 (OnMad).
//
// Each process is its own emulated host: its port spaces and listeners are
// this process's, and a peer is found by the IP address of its device, and
// where processes share an address, by the host slot its communication IDs
// carry (device/hosts.h).
//
// Thread safety: every public function may be called from any thread. One
// mutex guards everything; events are delivered (uapi.h's deliver function)
// and MADs handed to a Wire while it is held, so neither may call back in.
// A timer thread, started with the first id, retransmits and ends timewait;
// it sleeps while nothing is due, so an idle manager uses no CPU.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/cm/messages.h"
#include "emulator/cm/uapi.h"

namespace rdmaemu::cm {

using Clock = std::chrono::steady_clock;

// How the manager reaches the wire of one device (the engine).
class Wire {
 public:
  virtual ~Wire() = default;
  // Sends one MAD from QP1 of `port` to QP1 of host slot `dst_slot` at
  // `dst_ip` (network order; device/hosts.h); any thread, never blocks.
  // Loss is the retries' business.
  virtual void SendMad(uint8_t port, uint32_t dst_ip, uint8_t dst_slot, uint8_t traffic_class,
                       std::span<const uint8_t> mad) = 0;
  // Waits (until `deadline` at most) for the MADs handed over so far to
  // leave; for a process about to end.
  virtual void Flush(std::chrono::steady_clock::time_point deadline) = 0;
};

struct DevicePort {
  uint32_t ip = 0;            // network order
  uint8_t path_mtu = 5;       // IB enum of the active MTU (5 = 4096)
  uint8_t slot = 0;           // this process's host slot at `ip` (device/hosts.h)
};

// Timing, from the IBA's 4.096 us * 2^t encodings (cm_convert_to_ms in the
// kernel: 2^(t-8) ms). Shorter than the kernel's defaults (20 and 18, a REQ
// retried every 6 s), because every emulated host is a software peer on a
// fast link; a real CM peer honours what our MADs advertise.
struct Timing {
  uint8_t cm_response_timeout = 16;  // 256 ms
  uint8_t packet_life_time = 14;     // 64 ms
  uint8_t max_cm_retries = 15;
  // The MRA's service timeout when a duplicate REQ finds the request not
  // yet accepted (the kernel's 24: about a minute).
  uint8_t mra_service_timeout = 24;
};

Clock::duration FromIbTime(uint8_t t);

class Manager {
 public:
  // The process's manager (never destroyed: devices detach while exit()
  // runs static destructors).
  static Manager& Get();
  explicit Manager(Timing timing = {});
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Devices: an engine attaches when it starts and detaches before it
  // stops; MADs for a detached device are dropped.
  void AttachDevice(int index, uint64_t node_guid, std::vector<DevicePort> ports, Wire* wire);
  void DetachDevice(int index);
  // A MAD that arrived on QP1 of a device's port from `src_ip` (network
  // order). Malformed or hostile MADs are dropped and counted, never acted
  // on: false then (the engine counts it on the port too).
  bool OnMad(int device, uint8_t port, uint32_t src_ip, std::span<const uint8_t> mad);

  // uapi.h's commands, with its meanings; errors carry an errno value and a
  // message (logged by the caller).
  Status Init(uint32_t abi_version, rdmaemu_cm_deliver_fn deliver);
  Result<uint32_t> CreateId(uint64_t handle, uint16_t ps);
  Status DestroyId(uint32_t id);
  // `device` -1 with INADDR_ANY: the any-address of every device.
  Status Bind(uint32_t id, int device, uint8_t port, sockaddr_in* addr);
  Status Listen(uint32_t id, int backlog);
  Status Connect(uint32_t id, const sockaddr_in& dst, const rdmaemu_cm_param& param);
  Status Accept(uint32_t id, const rdmaemu_cm_param& param);
  Status Reject(uint32_t id, uint16_t reason, std::span<const uint8_t> private_data);
  Status Establish(uint32_t id);
  Status Disconnect(uint32_t id);
  Status SetOption(uint32_t id, int name, uint32_t value);
  // The process is ending (atexit, registered by Init): every id is
  // destroyed as the kernel destroys them when the process's rdma_cm file
  // closes, each sending once what it owes its peer, and the MADs are
  // flushed. Does nothing in a forked child.
  void CloseForExit();

  // fork(): a child is a new host, with no ids, no devices attached and no
  // timer thread until it makes its own; its ids' communication IDs are
  // drawn afresh. The engine's fork handler calls these, in its lock order.
  void PrepareFork();
  void AfterFork(bool child);

  // MADs dropped as malformed, hostile or for nobody (rdmaemu stats).
  uint64_t dropped() const;
  // Ids alive (tests).
  size_t ids() const;

  // The ids' states, named as the IB CM's (IBA 12.9.6).
  enum class State : uint8_t {
    kIdle,         // created, or bound (no connection yet)
    kListen,
    kReqSent,      // active: REQ out, waiting for REP (retried)
    kRepRcvd,      // active: CONNECT_RESPONSE delivered, waiting for establish
    kReqRcvd,      // passive: CONNECT_REQUEST delivered, waiting for accept/reject
    kRepSent,      // passive: REP out, waiting for RTU (retried)
    kEstablished,
    kDreqSent,     // waiting for DREP (retried)
    kDreqRcvd,     // DISCONNECTED delivered, waiting for disconnect (DREP)
    kTimewait,     // connection over; TIMEWAIT_EXIT when it ends
    kSidrReqSent,  // active UD: SIDR_REQ out (retried)
    kSidrReqRcvd,  // passive UD: CONNECT_REQUEST delivered
    kClosed,       // rejected, unreachable or refused: nothing more happens
  };

 private:
  struct Id;
  using IdMap = std::map<uint32_t, std::unique_ptr<Id>>;

  struct Device {
    uint64_t node_guid = 0;
    std::vector<DevicePort> ports;
    Wire* wire = nullptr;
    int flushing = 0;  // FlushOnReturn's using the wire; DetachDevice waits for 0
  };

  // Declared before a command's lock, so it runs once the lock is released:
  // waits for the MADs the command queued on `device` to leave, as the
  // kernel's CM has them on their way before rdma_reject(3) and the rest
  // return. A program that exits right after one (a forked Python worker
  // _exits, skipping atexit) would otherwise take its MAD with it.
  struct FlushOnReturn {
    explicit FlushOnReturn(Manager& m) : manager(m) {}
    ~FlushOnReturn();
    Manager& manager;
    int device = -1;
  };

  // All under mu_.
  Id* FindIdLocked(uint32_t id);
  Id* FindByCommIdLocked(uint32_t local_comm_id);
  Status CheckPortFreeLocked(const Id& id, uint32_t ip, uint16_t port) const;
  Result<uint16_t> EphemeralPortLocked(const Id& id, uint32_t ip);
  Id* FindListenerLocked(uint16_t ps, uint16_t port, uint32_t dst_ip, int device);
  // Whether an id is bound to the port but not listening yet (a REQ that
  // arrives then is the program's race, worth a warning).
  bool BoundNotListeningLocked(uint16_t ps, uint16_t port, uint32_t dst_ip) const;
  void DeliverLocked(Id& id, int event, int status, const rdmaemu_cm_param* param = nullptr);
  void SendLocked(const Id& id, const MadBytes& mad);
  void SendToLocked(int device, uint8_t port, uint32_t dst_ip, uint8_t dst_slot, const MadBytes& mad);
  // A new communication ID for an id on `device`: its host slot in the top
  // bits (device/hosts.h), never 0.
  uint32_t NewCommIdLocked(int device);
  // Records a listener at the addresses where this process is not slot 0,
  // so that REQs for it find this process; and forgets it.
  Status RecordListenerLocked(Id& id);
  void ForgetListenerLocked(Id& id);
  // Sends the id's current request MAD and arms its retry timer.
  void SendRetriedLocked(Id& id, MadBytes mad, Clock::duration interval);
  void StopRetryLocked(Id& id);
  void EnterTimewaitLocked(Id& id);
  void RemoveLocked(IdMap::iterator it);
  // Destroys the id, answering its peer (REJ, DREP, DREQ); an established
  // id keeps retrying its DREQ detached unless the process ends.
  void DestroyLocked(IdMap::iterator it, bool process_ends);
  void CountDropLocked(const char* why, uint32_t src_ip);

  // Adds a passive side's new id and delivers its CONNECT_REQUEST; a
  // request the library refuses (handle 0) is rejected.
  void DeliverRequestLocked(std::unique_ptr<Id> child, const rdmaemu_cm_event& e);
  void OnReqLocked(int device, uint8_t port, uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad);
  void OnRepLocked(uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad);
  void OnRtuLocked(std::span<const uint8_t> mad);
  void OnRejLocked(std::span<const uint8_t> mad);
  void OnMraLocked(std::span<const uint8_t> mad);
  void OnDreqLocked(int device, uint8_t port, uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad);
  void OnDrepLocked(std::span<const uint8_t> mad);
  void OnSidrReqLocked(int device, uint8_t port, uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad);
  void OnSidrRepLocked(std::span<const uint8_t> mad);
  void OnTimeoutLocked(Id& id, Clock::time_point now);

  void StartTimerLocked();
  void TimerLoop();

  const Timing timing_;
  mutable std::mutex mu_;
  std::condition_variable timer_cv_;
  std::condition_variable flushed_cv_;  // a FlushOnReturn ended
  rdmaemu_cm_deliver_fn deliver_ = nullptr;
  std::unordered_map<int, Device> devices_;
  IdMap ids_;
  uint32_t next_id_ = 1;
  uint32_t comm_id_seed_;
  uint64_t dropped_ = 0;
  std::thread timer_;
  bool stopping_ = false;
  pid_t owner_pid_ = 0;  // the process that called Init
};

}  // namespace rdmaemu::cm
