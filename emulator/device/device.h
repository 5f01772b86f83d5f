// Device: one emulated RDMA device as one process sees it.
//
// All contexts a process opens on a device share one Device (and so one UDP
// socket and, later, one engine thread). Devices are found through the
// Registry, which keeps a Device alive while any context holds it.
//
// Thread safety: identity and configuration are constant after Open; port
// attributes and the GID table are guarded by mu_ (the control plane changes
// them while the application queries them); what the data path reads per
// packet (port up, P_Key table, dead) is atomic.
//
// The mutators are what a subnet manager, a cable or the firmware does to a
// real port: each checks everything first, then applies, then raises its
// async event to every context of the device (no event when nothing
// changed). After Fatal() the device is dead for good.
#pragma once

#include <netinet/in.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/device/attributes.h"
#include "emulator/device/config.h"
#include "emulator/net/udp_socket.h"
#include "emulator/objects/device_memory.h"
#include "emulator/objects/directory.h"
#include "emulator/objects/mr.h"
#include "emulator/objects/mw.h"
#include "emulator/objects/xrcd.h"

namespace rdmaemu::device {

struct Gid {
  std::array<uint8_t, 16> raw{};
  bool empty() const;
  static Gid FromIpv4(in_addr address);  // ::ffff:a.b.c.d
  bool operator==(const Gid&) const = default;
};

enum class PortState : uint8_t { kDown = 1, kInit = 2, kArmed = 3, kActive = 4 };

// Async event types with the IBTA / libibverbs numbering, so the provider
// hands them on unchanged.
enum class AsyncEventType : uint8_t {
  kCqErr = 0, kQpFatal = 1, kQpReqErr = 2, kQpAccessErr = 3, kCommEst = 4,
  kSqDrained = 5, kPathMig = 6, kPathMigErr = 7, kDeviceFatal = 8,
  kPortActive = 9, kPortErr = 10, kLidChange = 11, kPkeyChange = 12,
  kSmChange = 13, kSrqErr = 14, kSrqLimitReached = 15, kQpLastWqeReached = 16,
  kClientReregister = 17, kGidChange = 18, kWqFatal = 19, kDeviceSpeedChange = 20,
};

// An event for an object carries the handle its creator gave it (the
// provider's pointer, as the kernel's user_handle); a port or device event
// carries the port number (0 for the device).
struct AsyncEvent {
  AsyncEventType type;
  uint64_t handle = 0;
  uint8_t port = 0;
};

// IBA 10.9.3: two P_Keys match when their low 15 bits are equal and at least
// one of them is a full member (bit 15); a key whose low 15 bits are 0 is
// invalid and matches nothing.
bool PkeysMatch(uint16_t a, uint16_t b);

struct PortAttr {
  PortState state = PortState::kActive;
  LinkLayer link_layer = LinkLayer::kEthernet;
  uint32_t max_mtu = 4096;
  uint32_t active_mtu = 4096;
  uint8_t width = 2;
  uint8_t speed = 32;
  uint16_t lid = 0;
  uint16_t sm_lid = 0;
  uint16_t pkey_table_len = 1;  // kMaxPkeys on InfiniBand ports, 1 on RoCE ports
  uint32_t bad_pkey_count = 0;
  uint32_t qkey_violation_count = 0;
};

class Device {
 public:
  // Opens the device: binds each port's UDP socket. `index` is the device's
  // position in the configuration.
  static Result<std::shared_ptr<Device>> Open(const DeviceConfig& config, int index);
  ~Device();

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::string& name() const { return config_.name; }
  int index() const { return index_; }
  uint64_t node_guid() const { return node_guid_; }  // host order
  int num_ports() const { return static_cast<int>(config_.ports.size()); }
  bool ValidPort(int port) const { return port >= 1 && port <= num_ports(); }

  // The address a port's socket is bound to (network order inside in_addr).
  sockaddr_in PortAddress(int port) const;
  // Whether that address was fixed before the port opened (configured,
  // RDMAEMU_ADDRESS, or claimed by rdma_bind_addr) rather than the first
  // free one of 127.0.0.0/8, which differs from process to process.
  bool PortAddressFixed(int port) const { return config_.ports[port - 1].address.has_value(); }
  // The UDP port peers of this address send to when they mean slot 0 (the
  // configured one, 4791 by default), and this process's host slot at its
  // addresses (hosts.h): 0 unless another process held the address first.
  uint16_t ServicePort(int port) const { return config_.ports[port - 1].udp_port; }
  uint8_t host_slot() const { return host_slot_; }
  // Where a LID-routed packet (InfiniBand link layer, no GRH) goes, in
  // network order: the port the emulated subnet knows by that LID
  // (subnet.h), or 0 when no port has it.
  uint32_t LidAddress(int port, uint16_t lid) const;

  PortAttr QueryPort(int port) const;

  // The object kinds whose number ibv_query_device limits (max_pd, max_qp,
  // max_cq, max_srq, max_ah), counted over every context of the device, as
  // a NIC's firmware counts them. TakeObject is false once all are in use.
  enum class Limited { kPd, kQp, kCq, kSrq, kAh };
  static int LimitOf(Limited kind);
  static const char* LimitName(Limited kind);  // "max_qp", ...
  bool TakeObject(Limited kind);
  void ReturnObject(Limited kind);
  // Lock-free, for the data path: fixed when the device opens.
  uint32_t ActiveMtu(int port) const { return ports_.at(port - 1).attr.active_mtu; }
  // Takes a port down or up and raises PORT_ERR / PORT_ACTIVE when the
  // state changes. EINVAL for a bad port.
  Status SetPortState(int port, PortState state);
  // Lock-free, for the data path: packets neither leave nor enter a port
  // that is not ACTIVE.
  bool PortUp(int port) const { return port_up_[(port - 1) & 1].load(std::memory_order_relaxed); }
  // LID change (LID_CHANGE), SM LID change (SM_CHANGE) and a client
  // reregister request (CLIENT_REREGISTER), as a subnet manager makes them.
  // InfiniBand link layer ports only: EINVAL on a RoCE port, for a bad port
  // or for a value that is not a unicast LID (1..0xBFFF). A LID already used
  // by another live port of the emulated subnet is EADDRINUSE (subnet.h).
  Status SetLid(int port, uint16_t lid);
  Status SetSmLid(int port, uint16_t sm_lid);
  Status ClientReregister(int port);
  // Writes one P_Key table entry (PKEY_CHANGE); 0 empties it. InfiniBand
  // ports only (a RoCE port has the one default P_Key). EINVAL for a bad
  // port, index or the invalid P_Key 0x8000.
  Status SetPkey(int port, int index, uint16_t pkey);
  // EINVAL for a bad port or index; an empty entry reads as 0.
  Result<uint16_t> QueryPkey(int port, int index) const;
  // Lock-free, for the data path: the P_Key at `index` (0 if out of range).
  uint16_t PkeyAt(int port, int index) const;
  // A received packet's P_Key did not match: counted in the port's
  // bad_pkey_cntr (ibv_query_port).
  void CountBadPkey(int port);
  // Changes the active link speed and width (DEVICE_SPEED_CHANGE), IBA
  // encodings (speed SDR=1 .. NDR=128, width 1x=1 4x=2 8x=4 12x=8 2x=16).
  Status SetLinkSpeed(int port, uint8_t speed, uint8_t width);
  // Sets or clears one GID table entry (GID_CHANGE). Entry 0 is the port's
  // own address: it can be neither set nor cleared (EBUSY). EINVAL for a bad
  // port or index, the zero GID or a multicast GID; EEXIST for a GID the
  // table holds at another index.
  Status SetGid(int port, int index, const Gid& gid);
  Status ClearGid(int port, int index);

  // A fatal device error (one-way): the fatal handler (the engine) runs
  // first, then every context gets DEVICE_FATAL. Afterwards dead() is true
  // and every mutator fails with EIO. A second call changes nothing.
  void Fatal(std::string_view why);
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // What the engine does at Fatal (moves every QP to ERR and flushes it).
  // nullptr removes it; waits for a call in progress.
  void SetFatalHandler(std::function<void()> handler);

  // ENODATA for an empty entry, EINVAL for a bad port or index.
  Result<Gid> QueryGid(int port, int index) const;
  // Index of a GID in the port's table, or ENOENT.
  Result<int> FindGid(int port, const Gid& gid) const;

  // Async events go to every registered listener (the provider registers one
  // per open context). Returns an id for RemoveListener.
  using Listener = std::function<void(const AsyncEvent&)>;
  int AddListener(Listener listener);
  void RemoveListener(int id);
  void Raise(const AsyncEvent& event);

  // Hands a port's socket to the engine (once).
  Result<net::UdpSocket> TakeSocket(int port);

  objects::MrTable& mrs() { return mrs_; }
  objects::MwTable& mws() { return mws_; }
  // The device's own memory (ibv_alloc_dm), max_dm_size bytes for all its
  // contexts together.
  objects::DeviceMemory& dm() { return dm_; }
  // The device's QPs, CQs, SRQs and WQs by number, for the control plane.
  objects::Directory& directory() { return directory_; }
  // Its XRC domains, shared by the contexts of the process through a file.
  objects::XrcdTable& xrcds() { return xrcds_; }

 private:
  struct Port {
    PortAttr attr;
    std::array<Gid, 16> gids{};
    std::optional<net::UdpSocket> socket;
    sockaddr_in bound{};
  };

  Device(DeviceConfig config, int index);
  // Under mu_: the checks every port mutator makes first.
  Status CheckPortLocked(int port, std::string_view what) const;
  Status CheckInfiniBandLocked(int port, std::string_view what) const;
  void RaisePortEvent(AsyncEventType type, int port);

  const DeviceConfig config_;
  const int index_;
  const uint64_t node_guid_;
  uint8_t host_slot_ = 0;  // constant after Open
  std::vector<std::pair<in_addr, uint8_t>> slots_;  // held (hosts.h), released when closed
  std::array<std::atomic<int>, 5> live_objects_{};  // by Limited

  mutable std::mutex mu_;
  std::vector<Port> ports_;  // guarded by mu_ (attr, gids); fd/bound constant after Open
  std::vector<std::pair<int, Listener>> listeners_;  // guarded by mu_
  std::shared_mutex dispatch_mu_;  // held shared while listeners run
  std::atomic<bool> port_up_[2] = {true, true};
  std::atomic<uint16_t> pkeys_[2][kMaxPkeys] = {};  // written under mu_, read lock-free
  std::atomic<uint32_t> bad_pkeys_[2] = {0, 0};
  std::atomic<bool> dead_{false};
  std::function<void()> fatal_handler_;  // guarded by dispatch_mu_ (unique to change)
  int next_listener_id_ = 1;

  objects::MrTable mrs_;
  objects::MwTable mws_;
  objects::DeviceMemory dm_{kMaxDmSize};
  objects::Directory directory_;
  objects::XrcdTable xrcds_;
};

// The devices of this process: the configuration, read once, and the Device
// each open entry is shared through.
class Registry {
 public:
  static Registry& Get();

  // The configuration; an invalid one is an error every caller reports.
  Result<const Config*> config();
  // Node GUID of a configured device, known before it is opened.
  static uint64_t GuidFor(const std::string& name, int index);
  // Opens (or shares) configured device `index`.
  Result<std::shared_ptr<Device>> Acquire(int index);
  // Makes configured device `index`, not open yet, take `address` on its
  // first port when it opens (an address of auto only: rdma_bind_addr to a
  // 127/8 address picks the process's emulated host). EBUSY if it is open,
  // EINVAL if its address is configured or the index is bad.
  Status ClaimAddress(int index, in_addr address);
  // The devices open in this process now, in configuration order.
  std::vector<std::shared_ptr<Device>> OpenDevices();

  // fork(): a child is a new host. Its copy of the parent's devices (their
  // sockets, their engine threads, which a fork does not copy) is not its
  // own, so the next open there opens afresh. The engine's fork handler
  // calls these, in its lock order.
  void PrepareFork();
  void AfterFork(bool child);

 private:
  std::mutex mu_;
  bool loaded_ = false;
  Result<Config> config_ = Config{};
  std::vector<std::weak_ptr<Device>> open_;
};

}  // namespace rdmaemu::device
