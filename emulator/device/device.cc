#include "emulator/device/device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <shared_mutex>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
#include "emulator/device/hosts.h"
#include "emulator/device/subnet.h"
#include "emulator/net/udp_socket.h"

namespace rdmaemu::device {

bool Gid::empty() const {
  return std::all_of(raw.begin(), raw.end(), [](uint8_t b) { return b == 0; });
}

Gid Gid::FromIpv4(in_addr address) {
  Gid g;
  g.raw[10] = 0xff;
  g.raw[11] = 0xff;
  std::memcpy(&g.raw[12], &address.s_addr, 4);
  return g;
}

namespace {

// The MTU of the interface that owns `address` (0 if none does).
int InterfaceMtu(in_addr address) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return 0;
  int mtu = 0;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    uint32_t a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    uint32_t m = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
    if ((a & m) != (address.s_addr & m)) continue;
    int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof req.ifr_name, "%s", i->ifa_name);
    if (::ioctl(fd, SIOCGIFMTU, &req) == 0) mtu = req.ifr_mtu;
    ::close(fd);
    break;
  }
  ::freeifaddrs(list);
  return mtu;
}

// As on a real RoCE NIC (and Linux's soft-RoCE), the active MTU is the
// largest IB MTU whose packets, with every header, fit the link's MTU.
uint32_t RoceMtuFor(int link_mtu) {
  constexpr int kHeaders = 80;  // IPv4/IPv6 + UDP + BTH + extension headers + ICRC, rounded up
  for (uint32_t ib : {4096u, 2048u, 1024u, 512u, 256u}) {
    if (static_cast<int>(ib) + kHeaders <= link_mtu) return ib;
  }
  return 256;
}

}  // namespace

Device::Device(DeviceConfig config, int index)
    : config_(std::move(config)),
      index_(index),
      node_guid_(Registry::GuidFor(config_.name, index)) {}

Device::~Device() {
  for (const auto& [address, slot] : slots_) hosts::Release(address, slot);
  for (const Port& p : ports_) {
    if (p.attr.link_layer == LinkLayer::kInfiniBand) subnet::Release(p.bound.sin_addr, p.attr.lid);
  }
}

Result<std::shared_ptr<Device>> Device::Open(const DeviceConfig& config, int index) {
  std::shared_ptr<Device> dev(new Device(config, index));
  for (size_t i = 0; i < config.ports.size(); ++i) {
    const PortConfig& pc = config.ports[i];
    net::UdpSocketOptions options;
    if (pc.address) options.address = net::ToString(*pc.address);
    options.port = pc.udp_port;
    auto socket = net::UdpSocket::Open(options);
    uint8_t slot = 0;
    if (!socket.ok() && socket.status().code() == EADDRINUSE && pc.address) {
      // Another process is at this address: this one shares it, as a
      // second process on a real host does (hosts.h).
      options.port = 0;
      socket = net::UdpSocket::Open(options);
      if (socket.ok()) {
        auto claimed = hosts::Claim(*pc.address, ntohs(socket->address().sin_port));
        if (!claimed.ok()) {
          return Status::Error(claimed.status().code(), fmt::format("{} port {}: {} is held by another process, "
                                                                    "and it cannot be shared: {}",
                                                                    config.name, i + 1, net::ToString(*pc.address),
                                                                    claimed.status().message()));
        }
        slot = *claimed;
        dev->slots_.push_back({*pc.address, slot});
        Log().info("{} port {}: {} is another process's too; this process is host slot {} there, on UDP port {}",
                   config.name, i + 1, net::ToString(*pc.address), slot, ntohs(socket->address().sin_port));
      }
    }
    if (!socket.ok()) {
      return Status::Error(socket.status().code(),
                           fmt::format("{} port {}: {}", config.name, i + 1, socket.status().message()));
    }
    if (i == 0) {
      dev->host_slot_ = slot;
    } else if (slot != dev->host_slot_) {
      // QPNs carry one slot, so every port of a device must be at it.
      return Status::Error(EADDRINUSE, fmt::format("{} port {}: its address {} makes this process host slot {} there, "
                                                   "but port 1's address makes it slot {}; a device's ports share "
                                                   "one slot: give port {} an address no other process holds",
                                                   config.name, i + 1, net::ToString(socket->address().sin_addr),
                                                   slot, dev->host_slot_, i + 1));
    }
    Port port;
    port.bound = socket->address();
    port.socket.emplace(std::move(socket).value());
    port.attr.state = pc.active ? PortState::kActive : PortState::kDown;
    dev->port_up_[i].store(pc.active);
    port.attr.link_layer = pc.link_layer;
    port.attr.max_mtu = pc.max_mtu;
    port.attr.active_mtu = pc.active_mtu;
    if (int link = InterfaceMtu(port.bound.sin_addr); link > 0 && RoceMtuFor(link) < pc.active_mtu) {
      port.attr.active_mtu = RoceMtuFor(link);
      Log().info("{} port {}: the interface MTU is {}, so the active MTU is {}", config.name, i + 1,
                 link, port.attr.active_mtu);
    }
    port.attr.width = pc.width;
    port.attr.speed = pc.speed;
    port.attr.lid = pc.lid;
    if (pc.link_layer == LinkLayer::kInfiniBand && pc.lid != 0) {
      // A configured LID is recorded in the emulated subnet so that LID-routed
      // peers in every process find the port by it (subnet.h).
      if (Status s = subnet::Assign(port.bound.sin_addr, subnet::DefaultLid(port.bound.sin_addr), pc.lid);
          !s.ok()) {
        return Status::Error(s.code(), fmt::format("{} port {}: lid={}: {}", config.name, i + 1, pc.lid, s.message()));
      }
    }
    if (pc.link_layer == LinkLayer::kInfiniBand && pc.lid == 0) {
      // The emulated subnet manager gives an InfiniBand port the LID of its
      // address's low 16 bits, so a LID-routed packet (no GRH) finds its host
      // as LidAddress() below shows.
      port.attr.lid = subnet::DefaultLid(port.bound.sin_addr);
      if (port.attr.lid == 0 || port.attr.lid >= 0xc000) {
        return InvalidArgument(fmt::format(
            "{} port {}: address {} gives no unicast LID; set lid= or another address",
            config.name, i + 1, net::ToString(port.bound.sin_addr)));
      }
    }
    port.attr.sm_lid = pc.link_layer == LinkLayer::kInfiniBand ? 1 : 0;
    // Both link layers start with the default P_Key (full member of the
    // default partition) at index 0; only InfiniBand ports have more entries.
    port.attr.pkey_table_len = pc.link_layer == LinkLayer::kInfiniBand ? kMaxPkeys : 1;
    dev->pkeys_[i][0].store(kDefaultPkey);
    port.gids[0] = Gid::FromIpv4(port.bound.sin_addr);
    Log().info("{} port {}: bound {}", config.name, i + 1, net::ToString(port.bound));
    dev->ports_.push_back(std::move(port));
  }
  return dev;
}

sockaddr_in Device::PortAddress(int port) const { return ports_.at(port - 1).bound; }

uint32_t Device::LidAddress(int port, uint16_t lid) const {
  return subnet::Resolve(ports_.at(port - 1).bound.sin_addr, lid);
}

Result<net::UdpSocket> Device::TakeSocket(int port) {
  std::lock_guard lock(mu_);
  if (!ValidPort(port)) return InvalidArgument(fmt::format("{} has no port {}", name(), port));
  auto& socket = ports_[port - 1].socket;
  if (!socket) return Busy(fmt::format("{} port {}: the socket is already in use", name(), port));
  net::UdpSocket out = std::move(*socket);
  socket.reset();
  return out;
}

int Device::LimitOf(Limited kind) {
  switch (kind) {
    case Limited::kPd: return kMaxPd;
    case Limited::kQp: return kMaxQp;
    case Limited::kCq: return kMaxCq;
    case Limited::kSrq: return kMaxSrq;
    case Limited::kAh: return kMaxAh;
  }
  return 0;
}

const char* Device::LimitName(Limited kind) {
  switch (kind) {
    case Limited::kPd: return "max_pd";
    case Limited::kQp: return "max_qp";
    case Limited::kCq: return "max_cq";
    case Limited::kSrq: return "max_srq";
    case Limited::kAh: return "max_ah";
  }
  return "?";
}

bool Device::TakeObject(Limited kind) {
  std::atomic<int>& live = live_objects_[static_cast<size_t>(kind)];
  if (live.fetch_add(1) < LimitOf(kind)) return true;
  live.fetch_sub(1);
  return false;
}

void Device::ReturnObject(Limited kind) { live_objects_[static_cast<size_t>(kind)].fetch_sub(1); }

PortAttr Device::QueryPort(int port) const {
  std::lock_guard lock(mu_);
  PortAttr a = ports_.at(port - 1).attr;
  a.bad_pkey_count = bad_pkeys_[port - 1].load(std::memory_order_relaxed);
  return a;
}

Status Device::SetPortState(int port, PortState state) {
  if (dead()) return Status::Error(EIO, fmt::format("{} had a fatal error; its ports can no longer change", name()));
  if (!ValidPort(port)) return InvalidArgument(fmt::format("{} has no port {}", name(), port));
  if (state != PortState::kDown && state != PortState::kActive) {
    return InvalidArgument("a port can be set DOWN or ACTIVE");
  }
  bool changed;
  {
    std::lock_guard lock(mu_);
    changed = ports_[port - 1].attr.state != state;
    ports_[port - 1].attr.state = state;
    port_up_[port - 1].store(state == PortState::kActive);
  }
  if (changed) {
    Log().info("{} port {}: {}", name(), port, state == PortState::kActive ? "ACTIVE" : "DOWN");
    Raise({state == PortState::kActive ? AsyncEventType::kPortActive : AsyncEventType::kPortErr, 0,
           static_cast<uint8_t>(port)});
  }
  return Status::Ok();
}

namespace {

// IBA 4.1.1 (LID space): 0 is reserved, 0xC000..0xFFFE are multicast LIDs
// and 0xFFFF is the permissive LID; unicast LIDs are 1..0xBFFF.
Status CheckUnicastLid(uint16_t lid, std::string_view what) {
  if (lid == 0) return InvalidArgument(fmt::format("{} 0 is reserved (it means no LID is assigned)", what));
  if (lid == 0xffff) return InvalidArgument(fmt::format("{} 0xffff is the permissive LID, not a port's LID", what));
  if (lid >= 0xc000) {
    return InvalidArgument(fmt::format("{} {:#x} is a multicast LID (0xc000..0xfffe); a unicast LID is "
                                       "1..0xbfff", what, lid));
  }
  return Status::Ok();
}

bool ValidSpeed(uint8_t s) { return SpeedName(s) != "invalid"; }
bool ValidWidth(uint8_t w) { return WidthName(w) != "invalid"; }

std::string GidText(const Gid& g) {
  char text[INET6_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET6, g.raw.data(), text, sizeof text);
  return text;
}

}  // namespace

bool PkeysMatch(uint16_t a, uint16_t b) {
  if ((a & 0x7fff) == 0 || (b & 0x7fff) == 0) return false;
  return (a & 0x7fff) == (b & 0x7fff) && ((a | b) & 0x8000) != 0;
}

Status Device::CheckPortLocked(int port, std::string_view what) const {
  if (dead()) return Status::Error(EIO, fmt::format("{}: {} had a fatal error; it can no longer change", what, name()));
  if (!ValidPort(port)) {
    return InvalidArgument(fmt::format("{}: {} has no port {} (ports are 1..{})", what, name(), port, num_ports()));
  }
  return Status::Ok();
}

Status Device::CheckInfiniBandLocked(int port, std::string_view what) const {
  if (Status s = CheckPortLocked(port, what); !s.ok()) return s;
  if (ports_[port - 1].attr.link_layer != LinkLayer::kInfiniBand) {
    return InvalidArgument(fmt::format(
        "{}: {} port {} has the Ethernet link layer (RoCE), which has no LIDs, subnet manager or "
        "P_Key table; configure the port with link_layer=infiniband", what, name(), port));
  }
  return Status::Ok();
}

void Device::RaisePortEvent(AsyncEventType type, int port) {
  Raise({type, 0, static_cast<uint8_t>(port)});
}

Status Device::SetLid(int port, uint16_t lid) {
  uint16_t old;
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckInfiniBandLocked(port, "set LID"); !s.ok()) return s;
    if (Status s = CheckUnicastLid(lid, "LID"); !s.ok()) {
      return InvalidArgument(fmt::format("set LID: {} port {}: {}", name(), port, s.message()));
    }
    old = ports_[port - 1].attr.lid;
    if (old == lid) return Status::Ok();
    if (Status s = subnet::Assign(ports_[port - 1].bound.sin_addr, old, lid); !s.ok()) {
      return Status::Error(s.code(), fmt::format("set LID: {} port {}: {}", name(), port, s.message()));
    }
    ports_[port - 1].attr.lid = lid;
  }
  Log().info("{} port {}: LID {:#x} -> {:#x} (LID_CHANGE)", name(), port, old, lid);
  RaisePortEvent(AsyncEventType::kLidChange, port);
  return Status::Ok();
}

Status Device::SetSmLid(int port, uint16_t sm_lid) {
  uint16_t old;
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckInfiniBandLocked(port, "set SM LID"); !s.ok()) return s;
    if (Status s = CheckUnicastLid(sm_lid, "SM LID"); !s.ok()) {
      return InvalidArgument(fmt::format("set SM LID: {} port {}: {}", name(), port, s.message()));
    }
    old = ports_[port - 1].attr.sm_lid;
    if (old == sm_lid) return Status::Ok();
    ports_[port - 1].attr.sm_lid = sm_lid;
  }
  Log().info("{} port {}: SM LID {:#x} -> {:#x} (SM_CHANGE)", name(), port, old, sm_lid);
  RaisePortEvent(AsyncEventType::kSmChange, port);
  return Status::Ok();
}

Status Device::ClientReregister(int port) {
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckInfiniBandLocked(port, "client reregister"); !s.ok()) return s;
  }
  // The SM asks every client of the port to register again (IBA 14.4.11):
  // nothing in the port changes, so the event is all there is.
  Log().info("{} port {}: the subnet manager asks clients to reregister (CLIENT_REREGISTER)", name(), port);
  RaisePortEvent(AsyncEventType::kClientReregister, port);
  return Status::Ok();
}

Status Device::SetPkey(int port, int index, uint16_t pkey) {
  uint16_t old;
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckInfiniBandLocked(port, "set P_Key"); !s.ok()) return s;
    if (index < 0 || index >= ports_[port - 1].attr.pkey_table_len) {
      return InvalidArgument(fmt::format("set P_Key: index {} is outside {} port {}'s P_Key table (0..{})",
                                         index, name(), port, ports_[port - 1].attr.pkey_table_len - 1));
    }
    if (pkey == 0x8000) {
      return InvalidArgument("set P_Key: 0x8000 is the invalid P_Key (IBA 10.9.1.2); write 0 to empty an entry");
    }
    old = pkeys_[port - 1][index].load();
    if (old == pkey) return Status::Ok();
    pkeys_[port - 1][index].store(pkey, std::memory_order_release);
  }
  Log().info("{} port {}: P_Key[{}] {:#06x} -> {:#06x} (PKEY_CHANGE)", name(), port, index, old, pkey);
  RaisePortEvent(AsyncEventType::kPkeyChange, port);
  return Status::Ok();
}

Result<uint16_t> Device::QueryPkey(int port, int index) const {
  std::lock_guard lock(mu_);
  if (!ValidPort(port)) return InvalidArgument(fmt::format("{} has no port {}", name(), port));
  if (index < 0 || index >= ports_[port - 1].attr.pkey_table_len) {
    return InvalidArgument(fmt::format("P_Key index {} is outside the table (0..{})", index,
                                       ports_[port - 1].attr.pkey_table_len - 1));
  }
  return pkeys_[port - 1][index].load();
}

uint16_t Device::PkeyAt(int port, int index) const {
  if (port < 1 || port > 2 || index < 0 || index >= kMaxPkeys) return 0;
  return pkeys_[port - 1][index].load(std::memory_order_acquire);
}

void Device::CountBadPkey(int port) {
  if (port >= 1 && port <= 2) bad_pkeys_[port - 1].fetch_add(1, std::memory_order_relaxed);
}

Status Device::SetLinkSpeed(int port, uint8_t speed, uint8_t width) {
  PortAttr before;
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckPortLocked(port, "set link speed"); !s.ok()) return s;
    if (!ValidSpeed(speed)) {
      return InvalidArgument(fmt::format("set link speed: {} is not an IB speed (SDR=1, DDR=2, QDR=4, FDR10=8, "
                                         "FDR=16, EDR=32, HDR=64, NDR=128)", speed));
    }
    if (!ValidWidth(width)) {
      return InvalidArgument(fmt::format("set link speed: {} is not an IB link width (1x=1, 4x=2, 8x=4, "
                                         "12x=8, 2x=16)", width));
    }
    before = ports_[port - 1].attr;
    if (before.speed == speed && before.width == width) return Status::Ok();
    ports_[port - 1].attr.speed = speed;
    ports_[port - 1].attr.width = width;
  }
  Log().info("{} port {}: link {} {} -> {} {} (DEVICE_SPEED_CHANGE)", name(), port, WidthName(before.width),
             SpeedName(before.speed), WidthName(width), SpeedName(speed));
  RaisePortEvent(AsyncEventType::kDeviceSpeedChange, port);
  return Status::Ok();
}

Status Device::SetGid(int port, int index, const Gid& gid) {
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckPortLocked(port, "set GID"); !s.ok()) return s;
    if (index < 0 || index >= kGidTableLength) {
      return InvalidArgument(fmt::format("set GID: index {} is outside the GID table (0..{})", index,
                                         kGidTableLength - 1));
    }
    if (index == 0) {
      return Busy(fmt::format("set GID: {} port {} GID[0] is the port's own address ({}); like the "
                              "reserved default GID of a real port it cannot change (use index 1..{})",
                              name(), port, GidText(ports_[port - 1].gids[0]), kGidTableLength - 1));
    }
    if (gid.empty()) return InvalidArgument("set GID: the zero GID is no address; clear the entry instead");
    if (gid.raw[0] == 0xff) {
      return InvalidArgument(fmt::format("set GID: {} is a multicast GID, not a port address", GidText(gid)));
    }
    auto& gids = ports_[port - 1].gids;
    if (gids[index] == gid) return Status::Ok();
    for (int i = 0; i < kGidTableLength; ++i) {
      if (i != index && gids[i] == gid) {
        return Status::Error(EEXIST, fmt::format("set GID: {} is already {} port {} GID[{}]", GidText(gid),
                                                 name(), port, i));
      }
    }
    gids[index] = gid;
  }
  Log().info("{} port {}: GID[{}] = {} (GID_CHANGE)", name(), port, index, GidText(gid));
  RaisePortEvent(AsyncEventType::kGidChange, port);
  return Status::Ok();
}

Status Device::ClearGid(int port, int index) {
  {
    std::lock_guard lock(mu_);
    if (Status s = CheckPortLocked(port, "clear GID"); !s.ok()) return s;
    if (index < 0 || index >= kGidTableLength) {
      return InvalidArgument(fmt::format("clear GID: index {} is outside the GID table (0..{})", index,
                                         kGidTableLength - 1));
    }
    if (index == 0) {
      return Busy(fmt::format("clear GID: {} port {} GID[0] is the port's own address; without it the port "
                              "could not be reached, so it cannot be removed", name(), port));
    }
    auto& entry = ports_[port - 1].gids[index];
    if (entry.empty()) return Status::Ok();
    entry = Gid{};
  }
  Log().info("{} port {}: GID[{}] cleared (GID_CHANGE)", name(), port, index);
  RaisePortEvent(AsyncEventType::kGidChange, port);
  return Status::Ok();
}

void Device::Fatal(std::string_view why) {
  if (dead_.exchange(true, std::memory_order_acq_rel)) {
    Log().info("{}: already dead after a fatal error; nothing more happens", name());
    return;
  }
  Log().error("{}: fatal device error ({}): every QP goes to ERR with its work flushed, nothing is sent or "
              "received, and verbs other than destroy/close/poll fail with EIO (DEVICE_FATAL)",
              name(), why);
  {
    std::shared_lock dispatch(dispatch_mu_);
    if (fatal_handler_) fatal_handler_();
  }
  Raise({AsyncEventType::kDeviceFatal, 0, 0});
}

void Device::SetFatalHandler(std::function<void()> handler) {
  std::unique_lock dispatch(dispatch_mu_);
  fatal_handler_ = std::move(handler);
}

Result<Gid> Device::QueryGid(int port, int index) const {
  if (!ValidPort(port)) return InvalidArgument(fmt::format("{} has no port {}", name(), port));
  if (index < 0 || index >= kGidTableLength) {
    return InvalidArgument(fmt::format("GID index {} is outside the table (0..{})", index, kGidTableLength - 1));
  }
  std::lock_guard lock(mu_);
  const Gid& g = ports_[port - 1].gids[index];
  if (g.empty()) return Status::Error(ENODATA, fmt::format("GID index {} is empty", index));
  return g;
}

Result<int> Device::FindGid(int port, const Gid& gid) const {
  if (!ValidPort(port)) return InvalidArgument(fmt::format("{} has no port {}", name(), port));
  std::lock_guard lock(mu_);
  const auto& gids = ports_[port - 1].gids;
  for (int i = 0; i < kGidTableLength; ++i) {
    if (!gids[i].empty() && gids[i] == gid) return i;
  }
  return NotFound("GID not in the table");
}

int Device::AddListener(Listener listener) {
  std::lock_guard lock(mu_);
  int id = next_listener_id_++;
  listeners_.emplace_back(id, std::move(listener));
  return id;
}

void Device::RemoveListener(int id) {
  // Waits for deliveries in progress: after this returns the listener is
  // never called again, so its owner may be freed.
  std::unique_lock dispatch(dispatch_mu_);
  std::lock_guard lock(mu_);
  std::erase_if(listeners_, [id](const auto& l) { return l.first == id; });
}

void Device::Raise(const AsyncEvent& event) {
  // Copy so that listeners run without mu_ (they take their own locks).
  std::shared_lock dispatch(dispatch_mu_);
  std::vector<Listener> targets;
  {
    std::lock_guard lock(mu_);
    for (const auto& l : listeners_) targets.push_back(l.second);
  }
  for (const auto& t : targets) t(event);
}

Registry& Registry::Get() {
  static Registry* registry = new Registry();  // never destroyed: used from atexit paths
  return *registry;
}

uint64_t Registry::GuidFor(const std::string& name, int index) {
  // Locally administered EUI-64 built from the process id and device index:
  // two processes are two hosts here, so they must not share a node GUID.
  uint64_t pid = static_cast<uint64_t>(::getpid()) & 0xffffff;
  uint64_t h = 0;
  for (char c : name) h = h * 131 + static_cast<unsigned char>(c);
  return (uint64_t{0x02} << 56) | (uint64_t{0x5e} << 48) | ((h & 0xff) << 40) |
         (uint64_t{0xfe} << 32) | (pid << 8) | (static_cast<uint64_t>(index) & 0xff);
}

Result<const Config*> Registry::config() {
  std::lock_guard lock(mu_);
  if (!loaded_) {
    config_ = LoadConfigFromEnvironment();
    loaded_ = true;
    if (!config_.ok()) Log().error("configuration: {}", config_.status().message());
    else open_.resize(config_->devices.size());
  }
  if (!config_.ok()) return config_.status();
  return &config_.value();
}

Result<std::shared_ptr<Device>> Registry::Acquire(int index) {
  auto cfg = config();
  if (!cfg.ok()) return cfg.status();
  std::lock_guard lock(mu_);
  if (index < 0 || index >= static_cast<int>(open_.size())) {
    return InvalidArgument(fmt::format("no device with index {}", index));
  }
  if (auto existing = open_[index].lock()) return existing;
  auto dev = Device::Open((*cfg)->devices[index], index);
  if (!dev.ok()) return dev.status();
  open_[index] = *dev;
  return dev;
}

Status Registry::ClaimAddress(int index, in_addr address) {
  auto cfg = config();
  if (!cfg.ok()) return cfg.status();
  std::lock_guard lock(mu_);
  if (index < 0 || index >= static_cast<int>(open_.size())) {
    return InvalidArgument(fmt::format("no device with index {}", index));
  }
  DeviceConfig& device = config_->devices[index];
  if (auto open = open_[index].lock()) {
    if (open->PortAddress(1).sin_addr.s_addr == address.s_addr) return Status::Ok();
    return Busy(fmt::format("{} is open already, at {}", device.name, net::ToString(open->PortAddress(1).sin_addr)));
  }
  if (device.ports.empty()) return InvalidArgument(fmt::format("{} has no port", device.name));
  PortConfig& port = device.ports[0];
  if (port.address && port.address->s_addr != address.s_addr) {
    return InvalidArgument(fmt::format("{} port 1 is configured at {}", device.name, net::ToString(*port.address)));
  }
  port.address = address;
  return Status::Ok();
}

void Registry::PrepareFork() { mu_.lock(); }

void Registry::AfterFork(bool child) {
  // The parent's Device objects stay allocated in the child (its contexts
  // may still point at them) but are forgotten here.
  if (child) {
    for (auto& weak : open_) weak.reset();
  }
  mu_.unlock();
}

std::vector<std::shared_ptr<Device>> Registry::OpenDevices() {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Device>> out;
  for (const auto& weak : open_) {
    if (auto dev = weak.lock()) out.push_back(std::move(dev));
  }
  return out;
}

}  // namespace rdmaemu::device
