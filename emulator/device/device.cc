#include "emulator/device/device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <shared_mutex>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
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

Device::~Device() = default;

Result<std::shared_ptr<Device>> Device::Open(const DeviceConfig& config, int index) {
  std::shared_ptr<Device> dev(new Device(config, index));
  for (size_t i = 0; i < config.ports.size(); ++i) {
    const PortConfig& pc = config.ports[i];
    net::UdpSocketOptions options;
    if (pc.address) options.address = net::ToString(*pc.address);
    options.port = pc.udp_port;
    auto socket = net::UdpSocket::Open(options);
    if (!socket.ok()) {
      return Status::Error(socket.status().code(),
                           fmt::format("{} port {}: {}", config.name, i + 1, socket.status().message()));
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
    if (pc.link_layer == LinkLayer::kInfiniBand && pc.lid == 0) {
      // The emulated subnet manager gives an InfiniBand port the LID of its
      // address's low 16 bits, so a LID-routed packet (no GRH) finds its host
      // as LidAddress() below shows.
      port.attr.lid = static_cast<uint16_t>(ntohl(port.bound.sin_addr.s_addr) & 0xffff);
      if (port.attr.lid == 0 || port.attr.lid >= 0xc000) {
        return InvalidArgument(fmt::format(
            "{} port {}: address {} gives no unicast LID; set lid= or another address",
            config.name, i + 1, net::ToString(port.bound.sin_addr)));
      }
    }
    port.attr.sm_lid = pc.link_layer == LinkLayer::kInfiniBand ? 1 : 0;
    port.gids[0] = Gid::FromIpv4(port.bound.sin_addr);
    Log().info("{} port {}: bound {}", config.name, i + 1, net::ToString(port.bound));
    dev->ports_.push_back(std::move(port));
  }
  return dev;
}

sockaddr_in Device::PortAddress(int port) const { return ports_.at(port - 1).bound; }

uint32_t Device::LidAddress(int port, uint16_t lid) const {
  uint32_t own = ntohl(ports_.at(port - 1).bound.sin_addr.s_addr);
  return htonl((own & 0xffff0000u) | lid);
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

PortAttr Device::QueryPort(int port) const {
  std::lock_guard lock(mu_);
  return ports_.at(port - 1).attr;
}

Status Device::SetPortState(int port, PortState state) {
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

}  // namespace rdmaemu::device
