// Devices, binding, address and route resolution: rdma_bind_addr,
// rdma_resolve_addr, rdma_resolve_route.
//
// A device's address is its port's GID 0 (::ffff:a.b.c.d). Contexts are
// opened lazily: binding an IPv4 address no open device has makes a device
// not opened yet take it (rdmaemu_cm_claim_address, then ibv_open_device),
// which is how `rping -s -a 127.0.0.9` picks its emulated host.
#include "verbs/rdmacm/address.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "verbs/rdmacm/check.h"
#include "verbs/rdmacm/library.h"

namespace rdmaemu::rdmacm {
namespace {

std::mutex g_mu;                   // guards opening devices
std::vector<Device*>* g_devices;   // filled once by SetDevices, never shrinks

// Per-lane rate in Mb/s of IBV_SPEED_* and lanes of IBV_WIDTH_*.
int LaneMbps(uint8_t speed) {
  switch (speed) {
    case 1: return 2500;
    case 2: return 5000;
    case 4: return 10000;
    case 8: return 10000;
    case 16: return 14000;
    case 32: return 25000;
    case 64: return 50000;
    case 128: return 100000;
    default: return 2500;
  }
}
int Lanes(uint8_t width) {
  switch (width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 1;
  }
}

// Opens the device; g_mu held.
int OpenLocked(Device* device) {
  if (device->context.load(std::memory_order_acquire) != nullptr) return 0;
  ibv_context* context = ibv_open_device(device->device);
  if (context == nullptr) {
    int error = errno != 0 ? errno : ENODEV;
    Log().warn("rdma cm: cannot open device {}: {}", ibv_get_device_name(device->device),
               std::strerror(error));
    return error;
  }
  ibv_device_attr attr{};
  if (int error = ibv_query_device(context, &attr); error != 0) {
    Log().warn("rdma cm: ibv_query_device on {} failed: {}", ibv_get_device_name(device->device),
               std::strerror(error));
    ibv_close_device(context);
    return error;
  }
  device->max_initiator_depth = static_cast<uint8_t>(std::min(attr.max_qp_init_rd_atom, 255));
  device->max_responder_resources = static_cast<uint8_t>(std::min(attr.max_qp_rd_atom, 255));
  device->ports.clear();
  for (uint8_t num = 1; num <= attr.phys_port_cnt; ++num) {
    Port port;
    port.num = num;
    ibv_port_attr port_attr{};
    if (ibv_query_port(context, num, &port_attr) == 0) {
      port.active_mtu = port_attr.active_mtu;
      port.rate = static_cast<uint8_t>(
          mbps_to_ibv_rate(LaneMbps(port_attr.active_speed) * Lanes(port_attr.active_width)));
    }
    ibv_gid gid{};
    if (ibv_query_gid(context, num, 0, &gid) == 0) {
      port.has_address = GidToAddress(gid, &port.address);
    }
    device->ports.push_back(port);
  }
  device->pd = ibv_alloc_pd(context);
  if (device->pd == nullptr) {
    int error = errno != 0 ? errno : ENOMEM;
    ibv_close_device(context);
    return error;
  }
  device->index = ibv_get_device_index(device->device);
  // Kept for the process's life, as rdma-core's librdmacm keeps them: the
  // checker must not call them the program's leaks.
  CheckLibraryObject(context);
  CheckLibraryObject(device->pd);
  device->context.store(context, std::memory_order_release);
  Log().debug("rdma cm: opened {} ({})", ibv_get_device_name(device->device), DeviceAddresses());
  return 0;
}

bool FindOpenLocked(in_addr addr, Device** device, const Port** port) {
  for (Device* d : *g_devices) {
    if (d->context.load(std::memory_order_acquire) == nullptr) continue;
    for (const Port& p : d->ports) {
      if (p.has_address && p.address.s_addr == addr.s_addr) {
        *device = d;
        *port = &p;
        return true;
      }
    }
  }
  return false;
}

// Binds the id on (device, port) at `addr` (its port 0 picks one).
int BindToPort(Id* id, Device* device, const Port& port, sockaddr_in addr) {
  addr.sin_family = AF_INET;
  addr.sin_addr = port.address;
  int error = rdmaemu_cm_bind(id->handle, device->context.load(), port.num, &addr);
  if (error != 0) {
    Log().warn("rdma cm: binding id {} to {} failed: {}", id->handle, AddressString(addr),
               std::strerror(error));
    return Fail(error);
  }
  AttachToDevice(id, device, port);
  std::memcpy(&id->id.route.addr.src_sin, &addr, sizeof addr);
  id->bound = true;
  id->state = State::kBound;
  return 0;
}

// The source address the kernel's routing picks for `dst`: 0 or an errno.
int RoutedSource(in_addr dst, in_addr* src) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr = dst;
  to.sin_port = htons(4791);
  int error = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    error = errno;
  } else {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      error = errno;
    } else {
      *src = local.sin_addr;
    }
  }
  ::close(fd);
  return error;
}

// The first port of any device (opening them in order) that has an IPv4
// address; g_mu held.
bool FirstAddressedPortLocked(Device** device, const Port** port) {
  for (Device* d : *g_devices) {
    if (OpenLocked(d) != 0) continue;
    for (const Port& p : d->ports) {
      if (p.has_address) {
        *device = d;
        *port = &p;
        return true;
      }
    }
  }
  return false;
}

// The port a group is joined from when the application names no source:
// the device of the source address the routing picks for the group, as the
// kernel's; else (the routing picks an interface no emulated device is on,
// or has no route for multicast at all) the first device on 127/8, else the
// first device with an address: the emulated hosts live on loopback, where
// no multicast route leads.
bool MulticastSourcePort(in_addr group, Device** device, const Port** port) {
  in_addr source{};
  if (RoutedSource(group, &source) == 0 && !IsLoopback(source) &&
      PortWithAddress(source, device, port)) {
    return true;
  }
  if (FirstLoopbackPort(device, port)) return true;
  std::lock_guard lock(g_mu);
  return FirstAddressedPortLocked(device, port);
}

void FillPath(Id* id, const Port& port, uint8_t mtu) {
  ibv_sa_path_rec& path = id->path;
  path = {};
  std::memcpy(path.dgid.raw, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
  std::memcpy(path.sgid.raw, id->id.route.addr.addr.ibaddr.sgid.raw, 16);
  path.hop_limit = kHopLimit;
  path.traffic_class = id->tos;
  path.reversible = 1;
  path.numb_path = 1;
  path.pkey = htons(0xffff);
  path.sl = 0;
  path.mtu_selector = 2;  // exactly
  path.mtu = mtu;
  path.rate_selector = 2;
  path.rate = port.rate;
  path.packet_life_time_selector = 2;
  path.packet_life_time = kPacketLifeTime;
  id->id.route.path_rec = &id->path;
  id->id.route.num_paths = 1;
}

}  // namespace

std::string AddressString(in_addr addr) {
  char text[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &addr, text, sizeof text);
  return text;
}

std::string AddressString(const sockaddr_in& addr) {
  return AddressString(addr.sin_addr) + ":" + std::to_string(ntohs(addr.sin_port));
}

void SetDevices(ibv_device** list, int count) {
  g_devices = new std::vector<Device*>;
  for (int i = 0; i < count; ++i) {
    auto* device = new Device;
    device->device = list[i];
    g_devices->push_back(device);
  }
}

size_t DeviceCount() { return g_devices == nullptr ? 0 : g_devices->size(); }

int OpenDevice(Device* device) {
  std::lock_guard lock(g_mu);
  return OpenLocked(device);
}

ibv_xrcd* DeviceXrcd(Device* device) {
  std::lock_guard lock(g_mu);
  if (device->xrcd != nullptr) return device->xrcd;
  ibv_context* context = device->context.load(std::memory_order_acquire);
  if (context == nullptr) {
    errno = ENODEV;
    return nullptr;
  }
  // No file: a domain of this process alone.
  ibv_xrcd_init_attr attr{};
  attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  attr.fd = -1;
  attr.oflags = O_CREAT;
  device->xrcd = ibv_open_xrcd(context, &attr);
  if (device->xrcd == nullptr) {
    Log().warn("rdma cm: cannot open an XRC domain on {}: {}", ibv_get_device_name(device->device),
               std::strerror(errno));
    return nullptr;
  }
  CheckLibraryObject(device->xrcd);
  return device->xrcd;
}

size_t OpenAllDevices() {
  std::lock_guard lock(g_mu);
  size_t open = 0;
  for (Device* device : *g_devices) {
    if (OpenLocked(device) == 0) ++open;
  }
  return open;
}

std::vector<Device*> OpenDevices() {
  std::vector<Device*> open;
  for (Device* device : *g_devices) {
    if (device->context.load(std::memory_order_acquire) != nullptr) open.push_back(device);
  }
  return open;
}

Device* DeviceOf(const ibv_context* context) {
  if (context == nullptr || g_devices == nullptr) return nullptr;
  for (Device* device : *g_devices) {
    if (device->context.load(std::memory_order_acquire) == context) return device;
  }
  return nullptr;
}

Device* DeviceByIndex(int index) {
  if (g_devices == nullptr) return nullptr;
  for (Device* device : *g_devices) {
    if (device->context.load(std::memory_order_acquire) != nullptr && device->index == index) {
      return device;
    }
  }
  return nullptr;
}

const Port* FindPort(const Device* device, uint8_t port_num) {
  if (device == nullptr) return nullptr;
  for (const Port& port : device->ports) {
    if (port.num == port_num) return &port;
  }
  return nullptr;
}

void AttachToDevice(Id* id, Device* device, const Port& port) {
  id->device = device;
  id->id.verbs = device->context.load(std::memory_order_acquire);
  id->id.port_num = port.num;
  if (id->id.pd == nullptr) id->id.pd = device->pd;
  ibv_gid sgid = MappedGid(port.address);
  std::memcpy(id->id.route.addr.addr.ibaddr.sgid.raw, sgid.raw, 16);
  id->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
}

bool FirstLoopbackPort(Device** device, const Port** port) {
  std::lock_guard lock(g_mu);
  // Open devices first, then open the others in order.
  for (int pass = 0; pass < 2; ++pass) {
    for (Device* d : *g_devices) {
      if (pass == 1 && OpenLocked(d) != 0) continue;
      if (d->context.load(std::memory_order_acquire) == nullptr) continue;
      for (const Port& p : d->ports) {
        if (p.has_address && IsLoopback(p.address)) {
          *device = d;
          *port = &p;
          return true;
        }
      }
    }
  }
  return false;
}

bool PortWithAddress(in_addr addr, Device** device, const Port** port) {
  std::lock_guard lock(g_mu);
  if (FindOpenLocked(addr, device, port)) return true;
  for (Device* d : *g_devices) {
    if (d->context.load(std::memory_order_acquire) != nullptr) continue;
    if (OpenLocked(d) == 0 && FindOpenLocked(addr, device, port)) return true;
  }
  return false;
}

std::string DeviceAddresses() {
  std::string text;
  for (Device* d : *g_devices) {
    if (!text.empty()) text += ", ";
    text += ibv_get_device_name(d->device);
    if (d->context.load(std::memory_order_acquire) == nullptr) {
      text += " (not open)";
      continue;
    }
    for (const Port& p : d->ports) {
      text += " " + (p.has_address ? AddressString(p.address) : std::string("(no IPv4 GID)"));
    }
  }
  return text.empty() ? "no devices" : text;
}

bool ToIpv4(const sockaddr* addr, sockaddr_in* out) {
  *out = {};
  out->sin_family = AF_INET;
  if (addr->sa_family == AF_INET) {
    std::memcpy(out, addr, sizeof *out);
    return true;
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    out->sin_port = in6->sin6_port;
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      std::memcpy(&out->sin_addr, &in6->sin6_addr.s6_addr[12], 4);
      return true;
    }
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
      out->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return true;
    }
  }
  errno = EAFNOSUPPORT;
  return false;
}

int BindIpv4(Id* id, const sockaddr_in& addr) {
  if (id->bound) {
    Log().warn("rdma_bind_addr: id {} is bound already (to {})", id->handle,
               AddressString(id->id.route.addr.src_sin));
    return Fail(EINVAL);
  }
  if (addr.sin_addr.s_addr == htonl(INADDR_ANY)) {
    // A listener on every device: the device's any-address bind.
    OpenAllDevices();
    sockaddr_in any = addr;
    any.sin_family = AF_INET;
    int error = rdmaemu_cm_bind(id->handle, nullptr, 0, &any);
    if (error != 0) {
      Log().warn("rdma_bind_addr: binding id {} to {} failed: {}", id->handle,
                 AddressString(any), std::strerror(error));
      return Fail(error);
    }
    std::memcpy(&id->id.route.addr.src_sin, &any, sizeof any);
    id->bound = true;
    id->state = State::kBound;
    return 0;
  }
  Device* device = nullptr;
  const Port* port = nullptr;
  {
    std::lock_guard lock(g_mu);
    bool found = FindOpenLocked(addr.sin_addr, &device, &port);
    // A device not opened yet takes the address (if its address is
    // configured, opening it tells whether it is this one).
    for (size_t i = 0; !found && i < g_devices->size(); ++i) {
      Device* d = (*g_devices)[i];
      if (d->context.load(std::memory_order_acquire) != nullptr) continue;
      int claim = rdmaemu_cm_claim_address(d->device, &addr.sin_addr);
      if (claim != 0 && claim != EINVAL) continue;
      if (OpenLocked(d) != 0) continue;
      found = FindOpenLocked(addr.sin_addr, &device, &port);
    }
    if (!found) {
      Log().warn(
          "rdma_bind_addr: no emulated device has address {} (devices: {}): bind to it before "
          "the device is opened (a device not open yet takes the address it is bound to), or "
          "run with `rdmaemu run --address {}`",
          AddressString(addr.sin_addr), DeviceAddresses(), AddressString(addr.sin_addr));
      return Fail(EADDRNOTAVAIL);
    }
  }
  return BindToPort(id, device, *port, addr);
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr == nullptr) {
    Log().warn("rdma_bind_addr: {} is NULL", id == nullptr ? "the id" : "the address");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_bind_addr")) return Fail(EINVAL);
  sockaddr_in in;
  if (!ToIpv4(addr, &in)) {
    Log().warn("rdma_bind_addr: address family {} is not supported (IPv4 only)", addr->sa_family);
    return Fail(EAFNOSUPPORT);
  }
  Id* p = ToId(id);
  if (p->state != State::kIdle) {
    Log().warn("rdma_bind_addr: id {} is {}, not idle", p->handle, StateName(p->state));
    return Fail(EINVAL);
  }
  return BindIpv4(p, in);
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  if (id == nullptr || dst_addr == nullptr) {
    Log().warn("rdma_resolve_addr: {} is NULL", id == nullptr ? "the id" : "the destination");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_resolve_addr")) return Fail(EINVAL);
  Id* p = ToId(id);
  sockaddr_in dst, src{};
  if (!ToIpv4(dst_addr, &dst) || (src_addr != nullptr && !ToIpv4(src_addr, &src))) {
    Log().warn("rdma_resolve_addr: only IPv4 addresses are supported");
    return Fail(EAFNOSUPPORT);
  }
  if (p->state != State::kIdle && p->state != State::kBound &&
      p->state != State::kAddrResolved) {
    Log().warn("rdma_resolve_addr: id {} is {}: resolve an idle or bound id", p->handle,
               StateName(p->state));
    return Fail(EINVAL);
  }
  if (p->bound && p->device == nullptr) {
    Log().warn("rdma_resolve_addr: id {} is bound to the any-address; bind it to a device's "
               "address (or not at all) before resolving", p->handle);
    return Fail(EINVAL);
  }
  if (!p->bound) {
    if (src_addr != nullptr && src.sin_addr.s_addr != htonl(INADDR_ANY)) {
      if (BindIpv4(p, src) != 0) return -1;
    } else {
      Device* device = nullptr;
      const Port* port = nullptr;
      in_addr source{};
      int error = 0;
      bool found = false;
      if (dst.sin_addr.s_addr == htonl(INADDR_ANY) || IsLoopback(dst.sin_addr)) {
        found = FirstLoopbackPort(&device, &port);
        if (!found) error = ENODEV;
      } else if (IN_MULTICAST(ntohl(dst.sin_addr.s_addr))) {
        found = MulticastSourcePort(dst.sin_addr, &device, &port);
        if (!found) error = ENODEV;
      } else if ((error = RoutedSource(dst.sin_addr, &source)) == 0) {
        found = IsLoopback(source) ? FirstLoopbackPort(&device, &port)
                                   : PortWithAddress(source, &device, &port);
        if (!found) error = ENODEV;
      }
      if (!found) {
        Log().warn("rdma_resolve_addr: no emulated device reaches {}{} (devices: {}){}",
                   AddressString(dst.sin_addr),
                   error == ENODEV && source.s_addr != 0
                       ? " from " + AddressString(source)
                       : std::string(),
                   DeviceAddresses(), error != ENODEV ? ": " + std::string(std::strerror(error))
                                                      : std::string());
        if (int qerr = QueueLibraryEvent(p, RDMA_CM_EVENT_ADDR_ERROR, -error); qerr != 0) {
          return Fail(qerr);
        }
        return Complete(p);
      }
      sockaddr_in local{};
      local.sin_port = src_addr != nullptr ? src.sin_port : 0;
      if (BindToPort(p, device, *port, local) != 0) return -1;
    }
  }
  if (dst.sin_addr.s_addr == htonl(INADDR_ANY)) dst.sin_addr = id->route.addr.src_sin.sin_addr;
  dst.sin_family = AF_INET;
  std::memset(&id->route.addr.dst_storage, 0, sizeof id->route.addr.dst_storage);
  std::memcpy(&id->route.addr.dst_sin, &dst, sizeof dst);
  ibv_gid dgid = MappedGid(dst.sin_addr);
  std::memcpy(id->route.addr.addr.ibaddr.dgid.raw, dgid.raw, 16);
  p->state = State::kAddrResolved;
  if (int error = QueueLibraryEvent(p, RDMA_CM_EVENT_ADDR_RESOLVED, 0); error != 0) {
    return Fail(error);
  }
  return Complete(p);
}

int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (id == nullptr) {
    Log().warn("rdma_resolve_route: the id is NULL");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_resolve_route")) return Fail(EINVAL);
  Id* p = ToId(id);
  if (p->state != State::kAddrResolved) {
    Log().warn("rdma_resolve_route: id {} is {}: call it after rdma_resolve_addr's "
               "ADDR_RESOLVED", p->handle, StateName(p->state));
    return Fail(EINVAL);
  }
  const Port* port = FindPort(p->device, id->port_num);
  if (port == nullptr) return Fail(EINVAL);
  FillPath(p, *port, port->active_mtu);
  p->path_mtu = port->active_mtu;
  p->state = State::kRouteResolved;
  if (int error = QueueLibraryEvent(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 0); error != 0) {
    return Fail(error);
  }
  return Complete(p);
}

}  // extern "C"

namespace rdmaemu::rdmacm {
// Used by id.cc for a CONNECT_REQUEST's child and by cma.cc for
// RDMA_OPTION_IB_PATH.
void FillChildPath(Id* id, uint8_t mtu) {
  const Port* port = FindPort(id->device, id->id.port_num);
  Port none;
  FillPath(id, port != nullptr ? *port : none, mtu);
}
}  // namespace rdmaemu::rdmacm
