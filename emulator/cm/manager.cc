#include "emulator/cm/manager.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/device/hosts.h"

namespace rdmaemu::cm {

namespace hosts = device::hosts;

namespace {

// rdma_cm's port spaces (uapi.h has rdma_cma.h's numbers).
constexpr uint16_t kPsIpoib = RDMAEMU_CM_PS_IPOIB;
constexpr uint16_t kPsTcp = RDMAEMU_CM_PS_TCP;
constexpr uint16_t kPsUdp = RDMAEMU_CM_PS_UDP;
constexpr uint16_t kPsIb = RDMAEMU_CM_PS_IB;

// IB CM REJ reasons (IBA 12.6.7.2, the kernel's ib_cm_rej_reason).
constexpr uint16_t kRejTimeout = 4;
constexpr uint16_t kRejInvalidServiceId = 8;
constexpr uint16_t kRejInvalidTransportType = 9;
constexpr uint16_t kRejStaleConn = 10;
constexpr uint16_t kRejConsumerDefined = 28;

// SIDR_REP statuses (IBA 12.11.2).
constexpr uint8_t kSidrSuccess = 0;
constexpr uint8_t kSidrUnsupported = 1;
constexpr uint8_t kSidrReject = 2;

// The REQ's transport for the active side's QP type, and back: the QP type
// each side of it has (XRC: an initiator connects, a target accepts).
TransportServiceType TransportOf(uint8_t qp_type) {
  switch (qp_type) {
    case RDMAEMU_CM_QPT_UC: return TransportServiceType::kUc;
    case RDMAEMU_CM_QPT_XRC_SEND: return TransportServiceType::kXrc;
    default: return TransportServiceType::kRc;
  }
}
uint8_t QpTypeOf(TransportServiceType t, bool passive) {
  switch (t) {
    case TransportServiceType::kUc: return RDMAEMU_CM_QPT_UC;
    case TransportServiceType::kXrc: return passive ? RDMAEMU_CM_QPT_XRC_RECV : RDMAEMU_CM_QPT_XRC_SEND;
    default: return RDMAEMU_CM_QPT_RC;
  }
}

// The default backlog of rdma_listen (the kernel's net.rdma_ucm.max_backlog).
constexpr int kMaxBacklog = 1024;
// The ephemeral range (the kernel's default ip_local_port_range).
constexpr uint16_t kEphemeralLow = 32768;
constexpr uint16_t kEphemeralHigh = 60999;
// The target ACK delay we advertise in REP (the device's local_ca_ack_delay).
constexpr uint8_t kTargetAckDelay = 15;

uint64_t ServiceId(uint16_t ps, uint16_t port) { return (uint64_t{ps} << 16) | port; }

std::string Ip(uint32_t ip_be) {
  in_addr a{ip_be};
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, buf, sizeof buf) ? buf : "?";
}

GidBytes GidOf(uint32_t ip_be) {
  GidBytes g{};
  g[10] = g[11] = 0xff;
  std::memcpy(&g[12], &ip_be, 4);
  return g;
}

std::string_view StateName(Manager::State s) {
  switch (s) {
    case Manager::State::kIdle: return "idle";
    case Manager::State::kListen: return "listen";
    case Manager::State::kReqSent: return "REQ sent";
    case Manager::State::kRepRcvd: return "REP received";
    case Manager::State::kReqRcvd: return "REQ received";
    case Manager::State::kRepSent: return "REP sent";
    case Manager::State::kEstablished: return "established";
    case Manager::State::kDreqSent: return "DREQ sent";
    case Manager::State::kDreqRcvd: return "DREQ received";
    case Manager::State::kTimewait: return "timewait";
    case Manager::State::kSidrReqSent: return "SIDR_REQ sent";
    case Manager::State::kSidrReqRcvd: return "SIDR_REQ received";
    case Manager::State::kClosed: return "closed";
  }
  return "?";
}

void CopyPrivate(rdmaemu_cm_param& p, std::span<const uint8_t> data) {
  const size_t n = std::min(data.size(), sizeof p.private_data);
  std::memcpy(p.private_data, data.data(), n);
  p.private_data_len = static_cast<uint8_t>(n);
}

}  // namespace

Clock::duration FromIbTime(uint8_t t) {
  return std::chrono::milliseconds(uint64_t{1} << (t > 8 ? std::min<uint8_t>(t, 31) - 8 : 0));
}

struct Manager::Id {
  uint32_t num = 0;
  uint64_t handle = 0;
  uint16_t ps = 0;
  State state = State::kIdle;
  // Destroyed by the library while a DREQ still owes its peer an answer:
  // the manager finishes the exchange and delivers nothing.
  bool detached = false;

  // Binding: a port of the port space on an address (0: any) of a device
  // (-1: every device).
  bool bound = false;
  int device = -1;
  uint8_t port = 1;
  uint32_t ip = 0;          // network order
  uint16_t local_port = 0;  // host order
  uint16_t peer_port = 0;   // host order: the service a REQ of ours asks for
  bool reuseaddr = false;
  uint8_t tos = 0;
  std::optional<uint8_t> ack_timeout;

  // A listener's backlog, and the requests it has delivered that are not
  // answered yet; a child knows its listener.
  int backlog = kMaxBacklog;
  int pending = 0;
  uint32_t listener = 0;
  // The addresses (network order) where it is recorded as listening
  // (RecordListenerLocked).
  std::vector<uint32_t> listen_records;

  // The connection.
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t peer_ip = 0;  // network order: where its MADs go
  uint8_t peer_slot = 0;  // and which process there (device/hosts.h)
  uint32_t local_qpn = 0;
  uint32_t remote_qpn = 0;
  uint64_t tid = 0;  // of the request this id answers, or of its own
  uint8_t local_ack_timeout = 19;
  uint8_t peer_response_timeout = 16;  // how long the peer may take to answer us
  uint8_t peer_max_retries = 15;
  // The connection's transport: RC, UC, or XRC (the active side's QP an
  // XRC initiator, the passive side's an XRC target).
  TransportServiceType transport = TransportServiceType::kRc;

  // The MAD the retry timer resends, and the reply a duplicate gets again.
  std::optional<MadBytes> retry_mad;
  Clock::duration retry_interval{};
  int retries_left = 0;
  std::optional<MadBytes> last_reply;
  std::optional<Clock::time_point> deadline;
};

Manager& Manager::Get() {
  static Manager* const manager = new Manager();
  return *manager;
}

Manager::Manager(Timing timing) : timing_(timing), comm_id_seed_(std::random_device{}()) {}

Manager::~Manager() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

void Manager::AttachDevice(int index, uint64_t node_guid, std::vector<DevicePort> ports, Wire* wire) {
  std::lock_guard lock(mu_);
  devices_[index] = Device{node_guid, std::move(ports), wire};
}

void Manager::DetachDevice(int index) {
  std::unique_lock lock(mu_);
  // A command's flush may be using the device's wire (FlushOnReturn).
  flushed_cv_.wait(lock, [&] {
    auto d = devices_.find(index);
    return d == devices_.end() || d->second.flushing == 0;
  });
  devices_.erase(index);
}

uint64_t Manager::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

size_t Manager::ids() const {
  std::lock_guard lock(mu_);
  return ids_.size();
}

Status Manager::Init(uint32_t abi_version, rdmaemu_cm_deliver_fn deliver) {
  if (abi_version != RDMAEMU_CM_ABI_VERSION) {
    return Status::Error(EPROTO, fmt::format("librdmacm speaks CM ABI {}, the device {}: the two "
                                             "libraries come from different builds",
                                             abi_version, RDMAEMU_CM_ABI_VERSION));
  }
  if (deliver == nullptr) return InvalidArgument("no event function");
  std::lock_guard lock(mu_);
  if (deliver_ != nullptr && deliver_ != deliver) return Busy("another librdmacm registered first");
  if (deliver_ == nullptr) {
    // The kernel destroys a process's ids when its rdma_cm file closes, so a
    // peer hears at once that a program ended with connections open (DREQ,
    // DREP, REJ). The process's end is the file's close here.
    owner_pid_ = getpid();
    if (this == &Get()) std::atexit([] { Get().CloseForExit(); });
  }
  deliver_ = deliver;
  return Status::Ok();
}

Result<uint32_t> Manager::CreateId(uint64_t handle, uint16_t ps) {
  if (ps != kPsTcp && ps != kPsUdp && ps != kPsIb && ps != kPsIpoib) {
    return InvalidArgument(fmt::format("port space {:#x} is none of RDMA_PS_TCP, _UDP, _IB, _IPOIB", ps));
  }
  std::lock_guard lock(mu_);
  if (deliver_ == nullptr) return Status::Error(EPROTO, "rdmaemu_cm_init was not called");
  auto id = std::make_unique<Id>();
  id->num = next_id_++;
  id->handle = handle;
  id->ps = ps;
  const uint32_t num = id->num;
  ids_.emplace(num, std::move(id));
  StartTimerLocked();
  return num;
}

Manager::Id* Manager::FindIdLocked(uint32_t id) {
  auto it = ids_.find(id);
  return it == ids_.end() || it->second->detached ? nullptr : it->second.get();
}

Manager::Id* Manager::FindByCommIdLocked(uint32_t local_comm_id) {
  if (local_comm_id == 0) return nullptr;
  for (auto& [num, id] : ids_) {
    if (id->local_comm_id == local_comm_id) return id.get();
  }
  return nullptr;
}

void Manager::RemoveLocked(IdMap::iterator it) {
  Id& id = *it->second;
  ForgetListenerLocked(id);
  if (id.listener != 0 && (id.state == State::kReqRcvd || id.state == State::kSidrReqRcvd)) {
    if (auto l = ids_.find(id.listener); l != ids_.end()) --l->second->pending;
  }
  ids_.erase(it);
}

Status Manager::DestroyId(uint32_t num) {
  FlushOnReturn flush(*this);
  std::lock_guard lock(mu_);
  auto it = ids_.find(num);
  if (it == ids_.end() || it->second->detached) return NotFound(fmt::format("cm id {} does not exist", num));
  flush.device = it->second->device;
  DestroyLocked(it, /*process_ends=*/false);
  return Status::Ok();
}

void Manager::DestroyLocked(IdMap::iterator it, bool process_ends) {
  Id& id = *it->second;
  switch (id.state) {
    case State::kReqRcvd:
    case State::kRepSent:
    case State::kRepRcvd: {
      // Answer the peer instead of leaving it to time out (the kernel's
      // cm_destroy_id does the same).
      // Message REJected: the REQ we hold, the REP we hold, or (REP sent)
      // the connection as a whole.
      const uint8_t which = id.state == State::kReqRcvd ? 0 : id.state == State::kRepRcvd ? 1 : 2;
      SendLocked(id, Encode(Rej{id.local_comm_id, id.remote_comm_id, which, kRejConsumerDefined, {}}, id.tid));
      break;
    }
    case State::kReqSent:
      SendLocked(id, Encode(Rej{id.local_comm_id, id.remote_comm_id, 2, kRejTimeout, {}}, id.tid));
      break;
    case State::kSidrReqRcvd:
      SendLocked(id, Encode(SidrRep{id.remote_comm_id, kSidrReject, 0, ServiceId(id.ps, id.local_port), 0, {}},
                            id.tid));
      break;
    case State::kDreqRcvd:
      SendLocked(id, EncodeDrep({id.local_comm_id, id.remote_comm_id}, id.tid));
      break;
    case State::kEstablished: {
      // The peer still has a connection: end it.
      id.tid = (uint64_t{comm_id_seed_} << 32) | id.local_comm_id;
      MadBytes dreq = Encode(Dreq{id.local_comm_id, id.remote_comm_id, id.remote_qpn}, id.tid);
      if (process_ends) {
        // Nobody is left to retry: one DREQ, as the kernel's cm_destroy_id
        // sends before it enters timewait.
        SendLocked(id, dreq);
        break;
      }
      // Finish the DREQ's retries without the library.
      SendRetriedLocked(id, std::move(dreq),
                        2 * FromIbTime(timing_.packet_life_time) + FromIbTime(id.peer_response_timeout));
      id.retries_left = id.peer_max_retries;
      id.state = State::kDreqSent;
      id.detached = true;
      id.bound = false;
      return;
    }
    case State::kDreqSent:
      if (process_ends) break;
      id.detached = true;
      id.bound = false;
      return;
    default:
      break;
  }
  RemoveLocked(it);
}

Manager::FlushOnReturn::~FlushOnReturn() {
  if (device < 0) return;
  Wire* wire = nullptr;
  {
    std::lock_guard lock(manager.mu_);
    auto d = manager.devices_.find(device);
    if (d == manager.devices_.end() || d->second.wire == nullptr) return;
    wire = d->second.wire;
    ++d->second.flushing;
  }
  // The bound is for an engine thread a loaded machine has not scheduled
  // (Flush drives the loop itself when it can); normally it is at once.
  wire->Flush(Clock::now() + std::chrono::milliseconds(200));
  std::lock_guard lock(manager.mu_);
  if (auto d = manager.devices_.find(device); d != manager.devices_.end()) --d->second.flushing;
  manager.flushed_cv_.notify_all();
}

void Manager::CloseForExit() {
  std::vector<Wire*> wires;
  {
    std::lock_guard lock(mu_);
    if (owner_pid_ != getpid()) return;  // a forked child: the ids are its parent's
    if (!ids_.empty()) Log().debug("cm: the process ends: ending its {} cm id(s)", ids_.size());
    while (!ids_.empty()) DestroyLocked(ids_.begin(), /*process_ends=*/true);
    for (auto& [index, d] : devices_) {
      if (d.wire != nullptr) wires.push_back(d.wire);
    }
  }
  // What the ids owed their peers is queued: let the engines send it before
  // the process is gone, or peers wait out their retries for an answer. Sent
  // at once normally; the bound is for an engine thread a loaded machine
  // has not scheduled yet (200 ms lost the DREQ under two compiler jobs).
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  for (Wire* w : wires) w->Flush(deadline);
}

Status Manager::CheckPortFreeLocked(const Id& self, uint32_t ip, uint16_t port) const {
  for (const auto& [num, other] : ids_) {
    if (other.get() == &self || !other->bound || other->ps != self.ps || other->local_port != port) continue;
    if (other->ip != 0 && ip != 0 && other->ip != ip) continue;
    // Sockets' rule: two ids share a port only when both asked to and
    // neither listens.
    if (self.reuseaddr && other->reuseaddr && other->state != State::kListen) continue;
    return Status::Error(EADDRINUSE, fmt::format("port {} of port space {:#x} is in use by cm id {}{}", port,
                                                 self.ps, num, other->state == State::kListen ? " (listening)" : ""));
  }
  return Status::Ok();
}

Result<uint16_t> Manager::EphemeralPortLocked(const Id& id, uint32_t ip) {
  const uint32_t span = kEphemeralHigh - kEphemeralLow + 1;
  const uint32_t start = (comm_id_seed_ ^ (next_id_ * 2654435761u)) % span;
  for (uint32_t i = 0; i < span; ++i) {
    const uint16_t port = static_cast<uint16_t>(kEphemeralLow + (start + i) % span);
    if (CheckPortFreeLocked(id, ip, port).ok()) return port;
  }
  return Status::Error(EADDRNOTAVAIL, "no free ephemeral port");
}

Status Manager::Bind(uint32_t num, int device, uint8_t port, sockaddr_in* addr) {
  if (addr == nullptr || addr->sin_family != AF_INET) {
    return Status::Error(EAFNOSUPPORT, "only IPv4 addresses (AF_INET) can be bound: every emulated GID is IPv4-mapped");
  }
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  if (id->bound || id->state != State::kIdle) return InvalidArgument(fmt::format("cm id {} is bound already", num));
  const uint32_t ip = addr->sin_addr.s_addr;
  if (device >= 0) {
    auto d = devices_.find(device);
    if (d == devices_.end()) return Status::Error(ENODEV, fmt::format("device {} is not open", device));
    if (port < 1 || port > d->second.ports.size()) return InvalidArgument(fmt::format("device {} has no port {}", device, port));
    if (ip != 0 && ip != d->second.ports[port - 1].ip) {
      return Status::Error(EADDRNOTAVAIL, fmt::format("{} is not the address of device {} port {} ({})", Ip(ip),
                                                      device, port, Ip(d->second.ports[port - 1].ip)));
    }
  } else if (ip != 0) {
    return InvalidArgument("a bind to every device must use INADDR_ANY");
  }
  uint16_t local_port = ntohs(addr->sin_port);
  if (local_port == 0) {
    auto p = EphemeralPortLocked(*id, ip);
    if (!p.ok()) return p.status();
    local_port = *p;
  } else if (Status s = CheckPortFreeLocked(*id, ip, local_port); !s.ok()) {
    return s;
  }
  id->bound = true;
  id->device = device;
  id->port = device >= 0 ? port : 1;
  id->ip = ip;
  id->local_port = local_port;
  addr->sin_port = htons(local_port);
  return Status::Ok();
}

Status Manager::Listen(uint32_t num, int backlog) {
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  if (!id->bound) return InvalidArgument(fmt::format("cm id {} is not bound: bind before listen", num));
  if (id->state != State::kIdle) {
    return InvalidArgument(fmt::format("cm id {} cannot listen: it is {}", num, StateName(id->state)));
  }
  // A port shared with REUSEADDR cannot be listened on while others hold it.
  const bool reuse = id->reuseaddr;
  id->reuseaddr = false;
  if (Status s = CheckPortFreeLocked(*id, id->ip, id->local_port); !s.ok()) {
    id->reuseaddr = reuse;
    return s;
  }
  if (Status s = RecordListenerLocked(*id); !s.ok()) {
    id->reuseaddr = reuse;
    return s;
  }
  id->backlog = backlog <= 0 || backlog > kMaxBacklog ? kMaxBacklog : backlog;
  id->state = State::kListen;
  return Status::Ok();
}

Status Manager::Connect(uint32_t num, const sockaddr_in& dst, const rdmaemu_cm_param& p) {
  if (dst.sin_family != AF_INET) return Status::Error(EAFNOSUPPORT, "only IPv4 destinations");
  FlushOnReturn flush(*this);
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  flush.device = id->device;
  if (!id->bound || id->device < 0) {
    return InvalidArgument(fmt::format("cm id {} has no device: resolve the address first", num));
  }
  if (id->state != State::kIdle) {
    return InvalidArgument(fmt::format("cm id {} cannot connect: it is {}", num, StateName(id->state)));
  }
  auto dev = devices_.find(id->device);
  if (dev == devices_.end()) return Status::Error(ENODEV, "the id's device is closed");
  const DevicePort& dp = dev->second.ports[id->port - 1];
  const uint32_t src_ip = id->ip != 0 ? id->ip : dp.ip;
  id->local_comm_id = NewCommIdLocked(id->device);
  id->peer_ip = dst.sin_addr.s_addr;
  // A REQ names a service, not a process: where the destination's address
  // is shared, the process recorded as listening there gets it.
  id->peer_port = ntohs(dst.sin_port);
  id->peer_slot = hosts::ListenerSlot(dst.sin_addr, id->ps, id->peer_port);
  id->tid = (uint64_t{comm_id_seed_ * 2654435761u} << 32) | id->local_comm_id;
  id->local_qpn = p.qp_num;
  const IpHeader ip{id->local_port, src_ip, dst.sin_addr.s_addr};
  const Clock::duration interval =
      2 * FromIbTime(timing_.packet_life_time) + FromIbTime(timing_.cm_response_timeout);
  const std::span<const uint8_t> data(p.private_data, p.private_data_len);
  if (p.qp_type == RDMAEMU_CM_QPT_UD) {
    if (data.size() > kSidrReqUserPrivateDataBytes) {
      return InvalidArgument(fmt::format("{} bytes of private data: a SIDR_REQ carries at most {}", data.size(),
                                         kSidrReqUserPrivateDataBytes));
    }
    SidrReq m{id->local_comm_id, 0xffff, ServiceId(id->ps, ntohs(dst.sin_port)), ip, {data.begin(), data.end()}};
    SendRetriedLocked(*id, Encode(m, id->tid), interval);
    id->state = State::kSidrReqSent;
    return Status::Ok();
  }
  if (p.qp_type != RDMAEMU_CM_QPT_RC && p.qp_type != RDMAEMU_CM_QPT_UC && p.qp_type != RDMAEMU_CM_QPT_XRC_SEND) {
    return InvalidArgument(fmt::format("QP type {} cannot be connected (an XRC target's side only listens)",
                                       p.qp_type));
  }
  if (data.size() > kReqUserPrivateDataBytes) {
    return InvalidArgument(
        fmt::format("{} bytes of private data: a REQ carries at most {}", data.size(), kReqUserPrivateDataBytes));
  }
  Req m;
  m.local_comm_id = id->local_comm_id;
  m.service_id = ServiceId(id->ps, ntohs(dst.sin_port));
  m.ca_guid = dev->second.node_guid;
  m.qpn = p.qp_num;
  m.responder_resources = p.responder_resources;
  m.initiator_depth = p.initiator_depth;
  m.remote_cm_response_timeout = timing_.cm_response_timeout;
  const TransportServiceType transport = TransportOf(p.qp_type);
  m.transport = static_cast<uint8_t>(transport);
  // XRC is Transport Service Type 3 with Extended Transport Type 1 (the
  // kernel's cm_req_set_qp_type).
  m.extended_transport = transport == TransportServiceType::kXrc ? 1 : 0;
  m.flow_control = p.flow_control != 0;
  m.starting_psn = p.starting_psn & 0xffffff;
  m.local_cm_response_timeout = timing_.cm_response_timeout;
  m.retry_count = std::min<uint8_t>(p.retry_count, 7);
  m.path_mtu = std::clamp<uint8_t>(std::min(p.path_mtu, dp.path_mtu), 1, 5);
  m.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
  m.max_cm_retries = timing_.max_cm_retries;
  m.srq = p.srq != 0;
  m.local_gid = GidOf(src_ip);
  m.remote_gid = GidOf(dst.sin_addr.s_addr);
  m.traffic_class = id->tos;
  m.hop_limit = 64;
  m.local_ack_timeout = id->ack_timeout.value_or(p.local_ack_timeout != 0 ? p.local_ack_timeout : 19);
  m.ip = ip;
  m.private_data.assign(data.begin(), data.end());
  id->local_ack_timeout = m.local_ack_timeout;
  id->transport = transport;
  SendRetriedLocked(*id, Encode(m, id->tid), interval);
  id->retries_left = timing_.max_cm_retries;
  id->state = State::kReqSent;
  return Status::Ok();
}

Status Manager::Accept(uint32_t num, const rdmaemu_cm_param& p) {
  FlushOnReturn flush(*this);
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  flush.device = id->device;
  const std::span<const uint8_t> data(p.private_data, p.private_data_len);
  auto answered = [&] {
    if (auto l = ids_.find(id->listener); l != ids_.end()) --l->second->pending;
  };
  if (id->state == State::kSidrReqRcvd) {
    if (data.size() > kSidrRepPrivateDataBytes) {
      return InvalidArgument(fmt::format("{} bytes of private data: a SIDR_REP carries at most {}", data.size(),
                                         kSidrRepPrivateDataBytes));
    }
    const MadBytes rep = Encode(SidrRep{id->remote_comm_id, kSidrSuccess, p.qp_num & 0xffffff,
                                        ServiceId(id->ps, id->local_port), p.qkey, {data.begin(), data.end()}},
                                id->tid);
    SendLocked(*id, rep);
    id->last_reply = rep;
    answered();
    id->state = State::kClosed;
    return Status::Ok();
  }
  if (id->state != State::kReqRcvd) {
    return InvalidArgument(fmt::format("cm id {} has no connection request to accept (it is {})", num,
                                       StateName(id->state)));
  }
  if (data.size() > kRepPrivateDataBytes) {
    return InvalidArgument(
        fmt::format("{} bytes of private data: a REP carries at most {}", data.size(), kRepPrivateDataBytes));
  }
  auto dev = devices_.find(id->device);
  Rep m;
  m.local_comm_id = id->local_comm_id;
  m.remote_comm_id = id->remote_comm_id;
  if (id->transport == TransportServiceType::kXrc) {
    // An XRC target answers with its QPN as the EECN and always an SRQ
    // (the kernel's cm_format_rep); its receives are the XRC SRQs'.
    m.eecn = p.qp_num & 0xffffff;
    m.srq = true;
  } else {
    m.qpn = p.qp_num & 0xffffff;
    m.srq = p.srq != 0;
  }
  m.starting_psn = p.starting_psn & 0xffffff;
  m.responder_resources = p.responder_resources;
  m.initiator_depth = p.initiator_depth;
  m.target_ack_delay = kTargetAckDelay;
  m.flow_control = p.flow_control != 0;
  m.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
  m.ca_guid = dev != devices_.end() ? dev->second.node_guid : 0;
  m.private_data.assign(data.begin(), data.end());
  id->local_qpn = p.qp_num & 0xffffff;
  answered();
  SendRetriedLocked(*id, Encode(m, id->tid),
                    2 * FromIbTime(timing_.packet_life_time) + FromIbTime(id->peer_response_timeout));
  id->retries_left = id->peer_max_retries;
  id->last_reply = *id->retry_mad;
  id->state = State::kRepSent;
  return Status::Ok();
}

Status Manager::Reject(uint32_t num, uint16_t reason, std::span<const uint8_t> data) {
  FlushOnReturn flush(*this);
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  flush.device = id->device;
  auto answered = [&] {
    if (auto l = ids_.find(id->listener); l != ids_.end()) --l->second->pending;
  };
  if (id->state == State::kSidrReqRcvd) {
    if (data.size() > kSidrRepPrivateDataBytes) return InvalidArgument("too much private data for a SIDR_REP");
    const MadBytes rep = Encode(
        SidrRep{id->remote_comm_id, kSidrReject, 0, ServiceId(id->ps, id->local_port), 0, {data.begin(), data.end()}},
        id->tid);
    SendLocked(*id, rep);
    id->last_reply = rep;
    answered();
    id->state = State::kClosed;
    return Status::Ok();
  }
  if (id->state != State::kReqRcvd && id->state != State::kRepRcvd) {
    return InvalidArgument(fmt::format("cm id {} has nothing to reject (it is {})", num, StateName(id->state)));
  }
  if (data.size() > kRejPrivateDataBytes) {
    return InvalidArgument(
        fmt::format("{} bytes of private data: a REJ carries at most {}", data.size(), kRejPrivateDataBytes));
  }
  const uint8_t which = id->state == State::kReqRcvd ? 0 : 1;
  if (id->state == State::kReqRcvd) answered();
  const MadBytes rej = Encode(Rej{id->local_comm_id, id->remote_comm_id, which, reason, {data.begin(), data.end()}},
                              id->tid);
  SendLocked(*id, rej);
  id->last_reply = rej;
  StopRetryLocked(*id);
  id->state = State::kClosed;
  return Status::Ok();
}

Status Manager::Establish(uint32_t num) {
  FlushOnReturn flush(*this);
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  flush.device = id->device;
  if (id->state == State::kRepRcvd) {
    const MadBytes rtu = EncodeRtu({id->local_comm_id, id->remote_comm_id}, id->tid);
    SendLocked(*id, rtu);
    id->last_reply = rtu;
    id->state = State::kEstablished;
    return Status::Ok();
  }
  if (id->state == State::kRepSent) {
    // Communication established before the RTU (IBA 12.9.6: COMM_EST).
    StopRetryLocked(*id);
    id->state = State::kEstablished;
    DeliverLocked(*id, RDMAEMU_CM_EVENT_ESTABLISHED, 0);
    return Status::Ok();
  }
  if (id->state == State::kEstablished) return Status::Ok();
  return InvalidArgument(fmt::format("cm id {} cannot be established: it is {}", num, StateName(id->state)));
}

Status Manager::Disconnect(uint32_t num) {
  FlushOnReturn flush(*this);
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  flush.device = id->device;
  switch (id->state) {
    case State::kEstablished:
    case State::kRepSent:
    case State::kRepRcvd:
      StopRetryLocked(*id);
      id->tid = (uint64_t{comm_id_seed_ * 40503u} << 32) | id->local_comm_id;
      SendRetriedLocked(*id, Encode(Dreq{id->local_comm_id, id->remote_comm_id, id->remote_qpn}, id->tid),
                        2 * FromIbTime(timing_.packet_life_time) + FromIbTime(id->peer_response_timeout));
      id->retries_left = id->peer_max_retries;
      id->state = State::kDreqSent;
      return Status::Ok();
    case State::kDreqRcvd:
      SendLocked(*id, EncodeDrep({id->local_comm_id, id->remote_comm_id}, id->tid));
      EnterTimewaitLocked(*id);
      return Status::Ok();
    case State::kDreqSent:
    case State::kTimewait:
      // Ended already (by us, or by the peer's DREQ): as the kernel's
      // rdma_disconnect, a second call is no error.
      return Status::Ok();
    case State::kClosed:
      if (id->local_comm_id != 0) return Status::Ok();
      [[fallthrough]];
    default:
      return InvalidArgument(fmt::format("cm id {} has no connection to end (it is {})", num, StateName(id->state)));
  }
}

Status Manager::SetOption(uint32_t num, int name, uint32_t value) {
  std::lock_guard lock(mu_);
  Id* id = FindIdLocked(num);
  if (id == nullptr) return NotFound(fmt::format("cm id {} does not exist", num));
  switch (name) {
    case RDMAEMU_CM_OPT_TOS:
      if (value > 0xff) return InvalidArgument(fmt::format("TOS {} is not a byte", value));
      id->tos = static_cast<uint8_t>(value);
      return Status::Ok();
    case RDMAEMU_CM_OPT_REUSEADDR:
      if (id->bound) return InvalidArgument("REUSEADDR must be set before the id is bound");
      id->reuseaddr = value != 0;
      return Status::Ok();
    case RDMAEMU_CM_OPT_AFONLY:
      return Status::Ok();
    case RDMAEMU_CM_OPT_ACK_TIMEOUT:
      if (value > 31) return InvalidArgument(fmt::format("ACK timeout {} is over 31", value));
      id->ack_timeout = static_cast<uint8_t>(value);
      return Status::Ok();
    default:
      return InvalidArgument(fmt::format("unknown option {}", name));
  }
}

void Manager::DeliverLocked(Id& id, int event, int status, const rdmaemu_cm_param* param) {
  if (id.detached || deliver_ == nullptr) return;
  rdmaemu_cm_event e{};
  e.handle = id.handle;
  e.id = id.num;
  e.event = event;
  e.status = status;
  e.device_index = id.device;
  e.port_num = id.port;
  if (param != nullptr) e.param = *param;
  deliver_(&e);
}

void Manager::SendToLocked(int device, uint8_t port, uint32_t dst_ip, uint8_t dst_slot, const MadBytes& mad) {
  auto d = devices_.find(device);
  if (d == devices_.end() || d->second.wire == nullptr) return;
  d->second.wire->SendMad(port, dst_ip, dst_slot, 0, mad);
}

void Manager::SendLocked(const Id& id, const MadBytes& mad) {
  auto d = devices_.find(id.device);
  if (d == devices_.end() || d->second.wire == nullptr) return;
  d->second.wire->SendMad(id.port, id.peer_ip, id.peer_slot, id.tos, mad);
}

uint32_t Manager::NewCommIdLocked(int device) {
  uint8_t slot = 0;
  if (auto d = devices_.find(device); d != devices_.end() && !d->second.ports.empty()) slot = d->second.ports[0].slot;
  uint32_t index;
  do {
    index = ++comm_id_seed_ & hosts::kCommIdIndexMask;
  } while (index == 0);
  return (uint32_t{slot} << hosts::kCommIdSlotShift) | index;
}

Status Manager::RecordListenerLocked(Id& id) {
  for (const auto& [index, dev] : devices_) {
    if (id.device >= 0 && index != id.device) continue;
    for (size_t p = 0; p < dev.ports.size(); ++p) {
      const DevicePort& dp = dev.ports[p];
      if (dp.slot == 0 || (id.device >= 0 && p + 1 != id.port) || (id.ip != 0 && id.ip != dp.ip)) continue;
      if (Status s = hosts::Listen(in_addr{dp.ip}, id.ps, id.local_port, dp.slot); !s.ok()) {
        ForgetListenerLocked(id);
        return Status::Error(EADDRINUSE, fmt::format("port {} of port space {:#x} at {} is in use by another "
                                                     "process at that address ({})",
                                                     id.local_port, id.ps, Ip(dp.ip), s.message()));
      }
      id.listen_records.push_back(dp.ip);
    }
  }
  return Status::Ok();
}

void Manager::ForgetListenerLocked(Id& id) {
  for (uint32_t ip : id.listen_records) hosts::StopListening(in_addr{ip}, id.ps, id.local_port);
  id.listen_records.clear();
}

void Manager::SendRetriedLocked(Id& id, MadBytes mad, Clock::duration interval) {
  SendLocked(id, mad);
  id.retry_mad = mad;
  id.retry_interval = interval;
  id.retries_left = timing_.max_cm_retries;
  id.deadline = Clock::now() + interval;
  timer_cv_.notify_all();
}

void Manager::StopRetryLocked(Id& id) {
  id.retry_mad.reset();
  id.deadline.reset();
}

void Manager::EnterTimewaitLocked(Id& id) {
  StopRetryLocked(id);
  id.state = State::kTimewait;
  id.deadline = Clock::now() + FromIbTime(id.local_ack_timeout);
  timer_cv_.notify_all();
}

void Manager::CountDropLocked(const char* why, uint32_t src_ip) {
  ++dropped_;
  RDMAEMU_WARN_LIMITED("cm: dropped a MAD from {}: {}", Ip(src_ip), why);
}

Manager::Id* Manager::FindListenerLocked(uint16_t ps, uint16_t port, uint32_t dst_ip, int device) {
  Id* any = nullptr;
  for (auto& [num, id] : ids_) {
    if (id->detached || id->state != State::kListen || id->ps != ps || id->local_port != port) continue;
    if (id->ip == dst_ip && id->ip != 0) return id.get();
    if (id->ip == 0 && (id->device < 0 || id->device == device)) any = id.get();
  }
  return any;
}

bool Manager::BoundNotListeningLocked(uint16_t ps, uint16_t port, uint32_t dst_ip) const {
  for (const auto& [num, id] : ids_) {
    if (!id->detached && id->bound && id->state == State::kIdle && id->ps == ps && id->local_port == port &&
        (id->ip == 0 || id->ip == dst_ip)) {
      return true;
    }
  }
  return false;
}

bool Manager::OnMad(int device, uint8_t port, uint32_t src_ip, std::span<const uint8_t> mad) {
  std::lock_guard lock(mu_);
  if (devices_.find(device) == devices_.end()) return false;
  const uint64_t dropped_before = dropped_;
  auto head = DecodeHead(mad);
  if (!head.ok()) {
    CountDropLocked(head.status().message().c_str(), src_ip);
    return false;
  }
  RDMAEMU_LOG_LIMITED(spdlog::level::debug, "cm: {} from {} on device {} port {}", ToString(head->kind),
                      Ip(src_ip), device, port);
  switch (head->kind) {
    case Kind::kReq: OnReqLocked(device, port, src_ip, head->tid, mad); break;
    case Kind::kRep: OnRepLocked(src_ip, head->tid, mad); break;
    case Kind::kRtu: OnRtuLocked(mad); break;
    case Kind::kRej: OnRejLocked(mad); break;
    case Kind::kMra: OnMraLocked(mad); break;
    case Kind::kDreq: OnDreqLocked(device, port, src_ip, head->tid, mad); break;
    case Kind::kDrep: OnDrepLocked(mad); break;
    case Kind::kSidrReq: OnSidrReqLocked(device, port, src_ip, head->tid, mad); break;
    case Kind::kSidrRep: OnSidrRepLocked(mad); break;
    case Kind::kLap:
    case Kind::kApr:
      // Alternate paths through the CM do not exist on RoCE (the kernel's
      // cm_lap_handler refuses them too).
      CountDropLocked("LAP/APR: no alternate path exchange on RoCE", src_ip);
      break;
  }
  return dropped_ == dropped_before;
}

void Manager::OnReqLocked(int device, uint8_t port, uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad) {
  auto req = DecodeReq(mad);
  if (!req.ok()) {
    CountDropLocked(req.status().message().c_str(), src_ip);
    return;
  }
  // A retransmitted REQ: the answer we gave, again.
  for (auto& [num, id] : ids_) {
    if (id->remote_comm_id != req->local_comm_id || id->peer_ip != src_ip || id->listener == 0) continue;
    switch (id->state) {
      case State::kReqRcvd:
        SendLocked(*id, Encode(Mra{id->local_comm_id, id->remote_comm_id, 0, timing_.mra_service_timeout}, tid));
        break;
      case State::kRepSent:
        if (id->last_reply) SendLocked(*id, *id->last_reply);
        break;
      case State::kTimewait:
        SendLocked(*id, Encode(Rej{id->local_comm_id, id->remote_comm_id, 0, kRejStaleConn, {}}, tid));
        break;
      default:
        if (id->state == State::kClosed && id->last_reply) SendLocked(*id, *id->last_reply);
        break;
    }
    return;
  }
  auto reject = [&](uint16_t reason, std::string why) {
    RDMAEMU_WARN_LIMITED("cm: rejected a connection request from {}: {}", Ip(src_ip), why);
    SendToLocked(device, port, src_ip, hosts::SlotOfCommId(req->local_comm_id),
                 Encode(Rej{0, req->local_comm_id, 0, reason, {}}, tid));
  };
  if ((req->service_id >> 32) != 0) {
    reject(kRejInvalidServiceId, fmt::format("service ID {:#x} is no rdma_cm port", req->service_id));
    return;
  }
  const uint16_t ps = static_cast<uint16_t>(req->service_id >> 16);
  const uint16_t lport = static_cast<uint16_t>(req->service_id);
  const bool xrc = req->transport == static_cast<uint8_t>(TransportServiceType::kXrc) &&
                   req->extended_transport == 1;
  if (req->transport > 1 && !xrc) {
    reject(kRejInvalidTransportType,
           fmt::format("transport type {} (extended {}) is not RC, UC or XRC", req->transport,
                       req->extended_transport));
    return;
  }
  const Device& dev = devices_.at(device);
  if (req->ip.dst_ip != dev.ports[port - 1].ip) {
    reject(kRejConsumerDefined, fmt::format("it is for {}, which is not this device's address {}", Ip(req->ip.dst_ip),
                                            Ip(dev.ports[port - 1].ip)));
    return;
  }
  Id* listener = FindListenerLocked(ps, lport, req->ip.dst_ip, device);
  if (listener == nullptr) {
    // Nobody listens: REJ at once, so the client gets REJECTED and not a
    // timeout (IBA 12.6.7: invalid service ID).
    // A program that tells its peer the port before it calls rdma_listen
    // (Debian's qperf 0.4.11 does) loses this race now and then on real
    // hardware too: the kernel's CM rejects the same way. Say so.
    if (BoundNotListeningLocked(ps, lport, req->ip.dst_ip)) {
      RDMAEMU_WARN_LIMITED("cm: a connection request from {} for {}:{} arrived before the id bound there "
                           "called rdma_listen: REJ (invalid service ID). Listen before telling the peer the port.",
                           Ip(src_ip), Ip(req->ip.dst_ip), lport);
    } else {
      Log().debug("cm: nobody listens on {}:{} (port space {:#x}): REJ", Ip(req->ip.dst_ip), lport, ps);
    }
    SendToLocked(device, port, src_ip, hosts::SlotOfCommId(req->local_comm_id),
                 Encode(Rej{0, req->local_comm_id, 0, kRejInvalidServiceId, {}}, tid));
    return;
  }
  if (listener->pending >= listener->backlog) {
    // As the kernel does: the client's retries come back once the backlog
    // has room.
    CountDropLocked("the listener's backlog is full", src_ip);
    return;
  }
  auto child = std::make_unique<Id>();
  child->num = next_id_++;
  child->ps = ps;
  child->state = State::kReqRcvd;
  child->device = device;
  child->port = port;
  child->ip = req->ip.dst_ip;
  child->local_port = lport;
  child->listener = listener->num;
  child->local_comm_id = NewCommIdLocked(device);
  child->remote_comm_id = req->local_comm_id;
  child->peer_ip = src_ip;
  child->peer_slot = hosts::SlotOfCommId(req->local_comm_id);
  child->remote_qpn = req->qpn;
  child->tid = tid;
  child->local_ack_timeout = req->local_ack_timeout;
  child->peer_response_timeout = req->local_cm_response_timeout;
  child->peer_max_retries = req->max_cm_retries;
  child->transport = static_cast<TransportServiceType>(req->transport);
  child->tos = req->traffic_class;
  ++listener->pending;

  rdmaemu_cm_event e{};
  e.handle = listener->handle;
  e.id = listener->num;
  e.event = RDMAEMU_CM_EVENT_CONNECT_REQUEST;
  e.child = child->num;
  e.device_index = device;
  e.port_num = port;
  e.src.sin_family = AF_INET;
  e.src.sin_addr.s_addr = req->ip.dst_ip;
  e.src.sin_port = htons(lport);
  e.dst.sin_family = AF_INET;
  e.dst.sin_addr.s_addr = req->ip.src_ip;
  e.dst.sin_port = htons(req->ip.src_port);
  rdmaemu_cm_param& p = e.param;
  p.qp_num = req->qpn;
  p.starting_psn = req->starting_psn;
  p.qp_type = QpTypeOf(child->transport, /*passive=*/true);
  p.responder_resources = req->responder_resources;
  p.initiator_depth = req->initiator_depth;
  p.flow_control = req->flow_control;
  p.retry_count = req->retry_count;
  p.rnr_retry_count = req->rnr_retry_count;
  p.srq = req->srq;
  p.path_mtu = std::min(req->path_mtu, dev.ports[port - 1].path_mtu);
  p.local_ack_timeout = req->local_ack_timeout;
  CopyPrivate(p, req->private_data);
  DeliverRequestLocked(std::move(child), e);
}

void Manager::DeliverRequestLocked(std::unique_ptr<Id> child, const rdmaemu_cm_event& e) {
  Id& c = *child;
  const uint32_t num = c.num;
  ids_.emplace(num, std::move(child));
  c.handle = deliver_(&e);
  if (c.handle == 0) {
    // The library refused it (a listener of another QP type, or no memory):
    // the kernel's CM then rejects the request (REJ, or SIDR_REP reject).
    Log().debug("cm: cm id {}: the library refused the request from {}", num, Ip(c.peer_ip));
    DestroyLocked(ids_.find(num), /*process_ends=*/false);
  }
}

void Manager::OnRepLocked(uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad) {
  const Rep rep = DecodeRep(mad);
  Id* id = FindByCommIdLocked(rep.remote_comm_id);
  if (id == nullptr || id->peer_ip != src_ip) {
    CountDropLocked("REP for no connection of ours", src_ip);
    return;
  }
  if (id->state == State::kEstablished) {
    // Our RTU was lost: the peer retries its REP.
    if (id->last_reply) SendLocked(*id, *id->last_reply);
    return;
  }
  if (id->state != State::kReqSent) return;  // a duplicate while the library decides
  StopRetryLocked(*id);
  id->remote_comm_id = rep.local_comm_id;
  id->peer_slot = hosts::SlotOfCommId(rep.local_comm_id);
  // An XRC target's QPN is in the EECN field.
  id->remote_qpn = id->transport == TransportServiceType::kXrc ? rep.eecn : rep.qpn;
  id->state = State::kRepRcvd;
  rdmaemu_cm_param p{};
  p.qp_num = id->remote_qpn;
  p.qkey = rep.qkey;
  p.starting_psn = rep.starting_psn;
  p.qp_type = QpTypeOf(id->transport, /*passive=*/false);
  p.responder_resources = rep.responder_resources;
  p.initiator_depth = rep.initiator_depth;
  p.flow_control = rep.flow_control;
  p.rnr_retry_count = rep.rnr_retry_count;
  p.srq = rep.srq;
  p.local_ack_timeout = id->local_ack_timeout;
  CopyPrivate(p, rep.private_data);
  DeliverLocked(*id, RDMAEMU_CM_EVENT_CONNECT_RESPONSE, 0, &p);
}

void Manager::OnRtuLocked(std::span<const uint8_t> mad) {
  const CommIds ids = DecodeCommIds(mad);
  Id* id = FindByCommIdLocked(ids.remote_comm_id);
  if (id == nullptr || id->state != State::kRepSent || id->remote_comm_id != ids.local_comm_id) return;
  StopRetryLocked(*id);
  id->state = State::kEstablished;
  DeliverLocked(*id, RDMAEMU_CM_EVENT_ESTABLISHED, 0);
}

void Manager::OnRejLocked(std::span<const uint8_t> mad) {
  const Rej rej = DecodeRej(mad);
  Id* id = FindByCommIdLocked(rej.remote_comm_id);
  if (id == nullptr) return;
  if (id->state != State::kReqSent && id->state != State::kRepRcvd && id->state != State::kRepSent) return;
  StopRetryLocked(*id);
  id->state = State::kClosed;
  rdmaemu_cm_param p{};
  CopyPrivate(p, rej.private_data);
  // On the passive side (REP sent) this is the active side giving up.
  DeliverLocked(*id, RDMAEMU_CM_EVENT_REJECTED, rej.reason, &p);
}

void Manager::OnMraLocked(std::span<const uint8_t> mad) {
  const Mra mra = DecodeMra(mad);
  Id* id = FindByCommIdLocked(mra.remote_comm_id);
  if (id == nullptr || id->state != State::kReqSent || mra.message_mraed != 0) return;
  // The peer needs longer to decide: wait that long before retrying.
  id->deadline = Clock::now() + FromIbTime(mra.service_timeout) + 2 * FromIbTime(timing_.packet_life_time);
  timer_cv_.notify_all();
}

void Manager::OnDreqLocked(int device, uint8_t port, uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad) {
  const Dreq dreq = DecodeDreq(mad);
  Id* id = FindByCommIdLocked(dreq.remote_comm_id);
  if (id == nullptr || id->remote_comm_id != dreq.local_comm_id) {
    // A DREQ for a connection we no longer have still gets its DREP, so
    // the peer's retries end (the kernel's cm_dreq_handler does the same).
    SendToLocked(device, port, src_ip, hosts::SlotOfCommId(dreq.local_comm_id),
                 EncodeDrep({dreq.remote_comm_id, dreq.local_comm_id}, tid));
    return;
  }
  if (dreq.remote_qpn != id->local_qpn) {
    CountDropLocked("DREQ names another QP than the connection's", src_ip);
    return;
  }
  switch (id->state) {
    case State::kEstablished:
    case State::kRepSent:
    case State::kRepRcvd:
      StopRetryLocked(*id);
      id->tid = tid;
      id->state = State::kDreqRcvd;
      DeliverLocked(*id, RDMAEMU_CM_EVENT_DISCONNECTED, 0);
      break;
    case State::kDreqSent: {
      // Both sides disconnected at once: answer theirs, and ours is over.
      SendLocked(*id, EncodeDrep({id->local_comm_id, id->remote_comm_id}, tid));
      const bool detached = id->detached;
      EnterTimewaitLocked(*id);
      if (!detached) DeliverLocked(*id, RDMAEMU_CM_EVENT_DISCONNECTED, 0);
      break;
    }
    case State::kDreqRcvd:
      break;  // a retry: the library's disconnect answers it
    default:
      // Over already (timewait, closed): the DREP again, so the peer's
      // retries end.
      SendLocked(*id, EncodeDrep({id->local_comm_id, id->remote_comm_id}, tid));
      break;
  }
}

void Manager::OnDrepLocked(std::span<const uint8_t> mad) {
  const CommIds ids = DecodeCommIds(mad);
  Id* id = nullptr;
  for (auto& [num, candidate] : ids_) {
    if (candidate->local_comm_id == ids.remote_comm_id && ids.remote_comm_id != 0) id = candidate.get();
  }
  if (id == nullptr || id->state != State::kDreqSent) return;
  if (id->detached) {
    ids_.erase(id->num);
    return;
  }
  EnterTimewaitLocked(*id);
  DeliverLocked(*id, RDMAEMU_CM_EVENT_DISCONNECTED, 0);
}

void Manager::OnSidrReqLocked(int device, uint8_t port, uint32_t src_ip, uint64_t tid, std::span<const uint8_t> mad) {
  auto req = DecodeSidrReq(mad);
  if (!req.ok()) {
    CountDropLocked(req.status().message().c_str(), src_ip);
    return;
  }
  for (auto& [num, id] : ids_) {
    if (id->remote_comm_id == req->request_id && id->peer_ip == src_ip && id->listener != 0 &&
        (id->state == State::kSidrReqRcvd || (id->state == State::kClosed && id->ps == kPsUdp))) {
      if (id->last_reply) SendLocked(*id, *id->last_reply);
      return;
    }
  }
  const uint16_t ps = static_cast<uint16_t>(req->service_id >> 16);
  const uint16_t lport = static_cast<uint16_t>(req->service_id);
  const Device& dev = devices_.at(device);
  Id* listener = (req->service_id >> 32) == 0 && req->ip.dst_ip == dev.ports[port - 1].ip
                     ? FindListenerLocked(ps, lport, req->ip.dst_ip, device)
                     : nullptr;
  if (listener == nullptr) {
    SendToLocked(device, port, src_ip, hosts::SlotOfCommId(req->request_id),
                 Encode(SidrRep{req->request_id, kSidrUnsupported, 0, req->service_id, 0, {}}, tid));
    return;
  }
  auto child = std::make_unique<Id>();
  child->num = next_id_++;
  child->ps = ps;
  child->state = State::kSidrReqRcvd;
  child->device = device;
  child->port = port;
  child->ip = req->ip.dst_ip;
  child->local_port = lport;
  child->listener = listener->num;
  child->remote_comm_id = req->request_id;
  child->peer_ip = src_ip;
  child->peer_slot = hosts::SlotOfCommId(req->request_id);
  child->tid = tid;
  ++listener->pending;
  rdmaemu_cm_event e{};
  e.handle = listener->handle;
  e.id = listener->num;
  e.event = RDMAEMU_CM_EVENT_CONNECT_REQUEST;
  e.child = child->num;
  e.device_index = device;
  e.port_num = port;
  e.src.sin_family = AF_INET;
  e.src.sin_addr.s_addr = req->ip.dst_ip;
  e.src.sin_port = htons(lport);
  e.dst.sin_family = AF_INET;
  e.dst.sin_addr.s_addr = req->ip.src_ip;
  e.dst.sin_port = htons(req->ip.src_port);
  e.param.qp_type = RDMAEMU_CM_QPT_UD;
  CopyPrivate(e.param, req->private_data);
  DeliverRequestLocked(std::move(child), e);
}

void Manager::OnSidrRepLocked(std::span<const uint8_t> mad) {
  const SidrRep rep = DecodeSidrRep(mad);
  Id* id = FindByCommIdLocked(rep.request_id);
  if (id == nullptr || id->state != State::kSidrReqSent) return;
  StopRetryLocked(*id);
  id->state = State::kClosed;
  rdmaemu_cm_param p{};
  p.qp_num = rep.qpn;
  p.qkey = rep.qkey;
  p.qp_type = RDMAEMU_CM_QPT_UD;
  CopyPrivate(p, rep.private_data);
  if (rep.status == kSidrSuccess) {
    DeliverLocked(*id, RDMAEMU_CM_EVENT_ESTABLISHED, 0, &p);
  } else {
    DeliverLocked(*id, RDMAEMU_CM_EVENT_UNREACHABLE, rep.status, &p);
  }
}

void Manager::OnTimeoutLocked(Id& id, Clock::time_point now) {
  if (id.state == State::kTimewait) {
    id.deadline.reset();
    id.state = State::kClosed;
    if (id.detached) {
      ids_.erase(id.num);
      return;
    }
    DeliverLocked(id, RDMAEMU_CM_EVENT_TIMEWAIT_EXIT, 0);
    return;
  }
  if (!id.retry_mad) {
    id.deadline.reset();
    return;
  }
  if (id.retries_left > 0) {
    --id.retries_left;
    if (id.state == State::kReqSent) {
      // Where the service is may have changed since the last try: a server
      // that sent us its port before listening records its listener (at a
      // host slot > 0) only then.
      id.peer_slot = hosts::ListenerSlot(in_addr{id.peer_ip}, id.ps, id.peer_port);
    }
    SendLocked(id, *id.retry_mad);
    id.deadline = now + id.retry_interval;
    return;
  }
  // Every retry went unanswered.
  StopRetryLocked(id);
  Log().info("cm: cm id {} to {}: no answer after {} retries ({}): giving up", id.num, Ip(id.peer_ip),
             timing_.max_cm_retries, StateName(id.state));
  if (id.detached) {
    ids_.erase(id.num);
    return;
  }
  switch (id.state) {
    case State::kDreqSent:
      EnterTimewaitLocked(id);
      DeliverLocked(id, RDMAEMU_CM_EVENT_DISCONNECTED, -ETIMEDOUT);
      break;
    case State::kReqSent:
      SendLocked(id, Encode(Rej{id.local_comm_id, id.remote_comm_id, 0, kRejTimeout, {}}, id.tid));
      [[fallthrough]];
    default:
      id.state = State::kClosed;
      DeliverLocked(id, RDMAEMU_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      break;
  }
}

void Manager::PrepareFork() { mu_.lock(); }

void Manager::AfterFork(bool child) {
  if (child) {
    // The parent's ids are the parent's connections: acting on them here
    // would answer its peers twice. The timer thread and whatever waited
    // on the condition variable do not exist in the child, so both objects
    // are made anew in place (a joinable std::thread may not be assigned).
    ids_.clear();
    devices_.clear();
    new (&timer_) std::thread();
    new (&timer_cv_) std::condition_variable();
    new (&flushed_cv_) std::condition_variable();
    comm_id_seed_ ^= std::random_device{}();
    if (deliver_ != nullptr) owner_pid_ = getpid();  // the atexit close is inherited
  }
  mu_.unlock();
}

void Manager::StartTimerLocked() {
  if (timer_.joinable()) return;
  timer_ = std::thread([this] { TimerLoop(); });
}

void Manager::TimerLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    std::optional<Clock::time_point> next;
    for (const auto& [num, id] : ids_) {
      if (id->deadline && (!next || *id->deadline < *next)) next = id->deadline;
    }
    if (!next) {
      timer_cv_.wait(lock);
      continue;
    }
    if (timer_cv_.wait_until(lock, *next) == std::cv_status::no_timeout && Clock::now() < *next) continue;
    const auto now = Clock::now();
    std::vector<uint32_t> due;
    for (const auto& [num, id] : ids_) {
      if (id->deadline && *id->deadline <= now) due.push_back(num);
    }
    for (uint32_t num : due) {
      auto it = ids_.find(num);
      if (it != ids_.end()) OnTimeoutLocked(*it->second, now);
    }
  }
}

}  // namespace rdmaemu::cm
