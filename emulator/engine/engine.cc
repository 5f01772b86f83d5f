#include "emulator/engine/engine.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "emulator/base/endian.h"
#include "emulator/base/log.h"
#include "emulator/capture/capture.h"
#include "emulator/device/config.h"
#include "emulator/device/hosts.h"
#include "emulator/engine/internal.h"
#include "emulator/engine/rss.h"
#include "emulator/engine/trace.h"
#include "emulator/fault/parse.h"
#include "emulator/cm/mad.h"
#include "emulator/fault/shaper.h"
#include "emulator/objects/mr.h"
#include "emulator/wire/ethernet.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/psn.h"

namespace rdmaemu::engine {
namespace {

// Transmit places a packet in packet_ so that its payload starts on one.
constexpr size_t kCacheLine = 64;

constexpr size_t kGrhBytes = 40;

// The IB encoding of an MTU in bytes (1 = 256 .. 5 = 4096), as a REQ carries it.
uint8_t IbMtuOf(uint32_t bytes) {
  uint8_t code = 1;
  for (uint32_t m = 256; m < bytes && code < 5; m <<= 1) ++code;
  return code;
}

Result<net::Backend> BackendFromEnvironment() {
  const char* v = std::getenv("RDMAEMU_ENGINE");
  if (v == nullptr || *v == '\0') return net::Backend::kAuto;
  auto b = net::ParseBackend(v);
  if (!b.ok()) return InvalidArgument(fmt::format("RDMAEMU_ENGINE: {}", b.status().message()));
  return b;
}

// RDMAEMU_WAIT_SPIN_US: microseconds, 0 to kMaxWaitSpin.
Result<std::chrono::microseconds> WaitSpinFromEnvironment() {
  const char* v = std::getenv("RDMAEMU_WAIT_SPIN_US");
  if (v == nullptr || *v == '\0') return kDefaultWaitSpin;
  auto us = device::ParseUnsigned(v, static_cast<uint64_t>(kMaxWaitSpin.count()), "");
  if (!us.ok()) {
    return InvalidArgument(fmt::format(
        "RDMAEMU_WAIT_SPIN_US: '{}' is not a number of microseconds from 0 to {}", v,
        kMaxWaitSpin.count()));
  }
  return std::chrono::microseconds(*us);
}

// The 40-byte GRH area of a UD receive holds the network header: for IPv4,
// 20 zero bytes and then the IPv4 header (as Linux's soft-RoCE writes it).
void WriteGrh(uint8_t* grh, uint32_t src_ip, uint32_t dst_ip, size_t udp_payload, uint8_t tos) {
  std::memset(grh, 0, kGrhBytes);
  uint8_t* ip = grh + 20;
  ip[0] = 0x45;
  ip[1] = tos;  // the sender's traffic class (ibv_init_ah_from_wc reads it back)
  StoreBe16(ip + 2, static_cast<uint16_t>(20 + 8 + udp_payload));
  StoreBe16(ip + 6, 0x4000);  // DF
  ip[8] = 64;
  ip[9] = 17;
  StoreBe32(ip + 12, src_ip);
  StoreBe32(ip + 16, dst_ip);
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += LoadBe16(ip + i);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  StoreBe16(ip + 10, static_cast<uint16_t>(~sum));
}

// Each port's rate for the fault rule rate=auto: its speed x width.
std::vector<uint64_t> AutoRates(const device::Device& device) {
  std::vector<uint64_t> rates;
  for (int port = 1; port <= device.num_ports(); ++port) {
    const device::PortAttr attr = device.QueryPort(port);
    rates.push_back(fault::PortRateBps(attr.width, attr.speed));
  }
  return rates;
}

// Reads RDMAEMU_FAULTS into the injector. A device named in a rule must be
// one the configuration has (a typo would silently match nothing).
Status FaultsFromEnvironment(fault::Injector& faults) {
  const char* v = std::getenv("RDMAEMU_FAULTS");
  if (v == nullptr || *v == '\0') return Status::Ok();
  auto set = fault::ParseRules(v);
  if (!set.ok()) return InvalidArgument(fmt::format("RDMAEMU_FAULTS: {}", set.status().message()));
  auto config = device::Registry::Get().config();
  if (config.ok()) {
    std::vector<std::string> names;
    for (const auto& d : (*config)->devices) names.push_back(d.name);
    auto known = [&](const std::optional<std::string>& dev) {
      return !dev || std::find(names.begin(), names.end(), *dev) != names.end();
    };
    auto unknown = [&](const std::string& rule, const std::string& dev) {
      return InvalidArgument(fmt::format("RDMAEMU_FAULTS: \"{}\": dev={}: no such device (configured: {})",
                                         rule, dev, fmt::join(names, ", ")));
    };
    for (const auto& r : set->rules) {
      if (!known(r.filter.device)) return unknown(fault::ToString(r), *r.filter.device);
    }
    for (const auto& sh : set->shaping) {
      if (!known(sh.device)) return unknown(fault::ToString(sh), *sh.device);
    }
  }
  if (Status s = faults.Add(v); !s.ok()) {
    return InvalidArgument(fmt::format("RDMAEMU_FAULTS: {}", s.message()));
  }
  if (faults.active()) {
    Log().info("fault rules from RDMAEMU_FAULTS:\n{}", faults.List());
  }
  return Status::Ok();
}

}  // namespace

objects::WcOpcode CompletionOpcode(SendOp op) {
  switch (op) {
    case SendOp::kSend: case SendOp::kSendWithImm: case SendOp::kSendWithInv:
      return objects::WcOpcode::kSend;
    case SendOp::kRdmaWrite: case SendOp::kRdmaWriteWithImm:
      return objects::WcOpcode::kRdmaWrite;
    case SendOp::kRdmaRead:
      return objects::WcOpcode::kRdmaRead;
    case SendOp::kCompareSwap:
      return objects::WcOpcode::kCompSwap;
    case SendOp::kFetchAdd:
      return objects::WcOpcode::kFetchAdd;
    case SendOp::kAtomicWrite:
      return objects::WcOpcode::kAtomicWrite;
    case SendOp::kFlush:
      return objects::WcOpcode::kFlush;
    case SendOp::kBindMw:
      return objects::WcOpcode::kBindMw;
    case SendOp::kLocalInv:
      return objects::WcOpcode::kLocalInv;
  }
  return objects::WcOpcode::kSend;
}

void FlushLocked(Qp& qp, std::vector<std::pair<objects::Cq*, objects::Cqe>>& out) {
  auto flushed_send = [&](const SendWqe& w) {
    objects::Cqe c;
    c.wr_id = w.wr_id;
    c.status = objects::WcStatus::kWrFlushErr;
    c.opcode = CompletionOpcode(w.op);
    c.qp_num = qp.qpn;
    out.emplace_back(qp.send_cq, c);
  };
  // The device's own rendezvous work has no send completion: a READ cut
  // short is its tagged receive's, flushed (tag_matching.cc).
  auto flushed = [&](const SendWqe& w) {
    if (w.device_work == DeviceWork::kNone) {
      flushed_send(w);
    } else if (w.device_work == DeviceWork::kRndvRead) {
      out.emplace_back(qp.srq->cq, FlushedRndv(qp, w));
    }
  };
  for (const auto& f : qp.inflight) flushed(f.wqe);
  for (const auto& w : qp.sq) flushed(w);
  if (qp.in_send && IsMatched(qp.tm)) {
    // A tagged buffer a message was being received into: it was taken off
    // the matching list, so it completes, flushed, rather than go back.
    objects::Cqe c;
    c.wr_id = qp.recv.wr_id;
    c.status = objects::WcStatus::kWrFlushErr;
    c.opcode = objects::WcOpcode::kTmRecv;
    c.qp_num = qp.qpn;
    out.emplace_back(qp.srq->cq, c);
  } else if (qp.in_send) {
    if (qp.srq) {
      // SRQ WQEs are not flushed with the QP (IBA 10.3.1): give it back.
      std::lock_guard lock(qp.srq->mu);
      qp.srq->rq.push_front(std::move(qp.recv));
    } else {
      qp.rq.push_front(std::move(qp.recv));
    }
  }
  for (const auto& w : qp.rq) {
    objects::Cqe c;
    c.wr_id = w.wr_id;
    c.status = objects::WcStatus::kWrFlushErr;
    c.opcode = objects::WcOpcode::kRecv;
    c.qp_num = qp.qpn;
    out.emplace_back(qp.recv_cq, c);
  }
  qp.inflight.clear();
  qp.sq.clear();
  qp.rq.clear();
  qp.sq_outstanding = 0;
  qp.sqd_admit = 0;
  qp.in_send = false;
  qp.in_write = false;
  qp.write_mr.reset();
  qp.rnr_waiting = false;
}

void FlushQp(Qp& qp) {
  std::lock_guard lock(qp.mu);
  std::vector<std::pair<objects::Cq*, objects::Cqe>> cqes;
  FlushLocked(qp, cqes);
  if (!cqes.empty()) Log().debug("qp#{}: {} work requests flushed (IBV_WC_WR_FLUSH_ERR)", qp.qpn, cqes.size());
  for (auto& [cq, c] : cqes) {
    if (!cq->Push(c)) RDMAEMU_WARN_LIMITED("qp#{}: CQ overrun while flushing", qp.qpn);
  }
}

void FlushWqLocked(Wq& wq, std::vector<objects::Cqe>& out) {
  for (const auto& w : wq.rq) {
    objects::Cqe c;
    c.wr_id = w.wr_id;
    c.status = objects::WcStatus::kWrFlushErr;
    c.opcode = objects::WcOpcode::kRecv;
    c.qp_num = wq.wqn;
    out.push_back(c);
  }
  wq.rq.clear();
}

void FlushWq(Wq& wq) {
  std::lock_guard lock(wq.mu);
  std::vector<objects::Cqe> cqes;
  FlushWqLocked(wq, cqes);
  for (auto& c : cqes) {
    if (!wq.cq->Push(c)) RDMAEMU_WARN_LIMITED("wq#{}: CQ overrun while flushing", wq.wqn);
  }
}

Engine::Engine(std::shared_ptr<device::Device> device)
    : device_(std::move(device)),
      faults_(device_->name(), AutoRates(*device_)),
      tracer_(device_->name()) {}

Engine::~Engine() {
  // Before the loop stops: after this the manager sends nothing through us.
  cm::Manager::Get().DetachDevice(device_->index());
  device_->SetFatalHandler(nullptr);
  if (loop_) loop_->Stop();
  // The file is complete once the device is closed.
  capture::Flush();
}

Result<std::shared_ptr<Engine>> Engine::Start(std::shared_ptr<device::Device> device) {
  auto backend = BackendFromEnvironment();
  if (!backend.ok()) return backend.status();
  std::shared_ptr<Engine> engine(new Engine(device));
  auto spin = WaitSpinFromEnvironment();
  if (!spin.ok()) return spin.status();
  engine->wait_spin_ = *spin;
  if (Status s = FaultsFromEnvironment(engine->faults_); !s.ok()) return s;
  if (Status s = capture::StartFromEnvironment(); !s.ok()) return s;
  if (Status s = engine->RawSegmentFromEnvironment(); !s.ok()) return s;
  std::vector<net::UdpSocket> sockets;
  std::string where;
  for (int port = 1; port <= device->num_ports(); ++port) {
    auto socket = device->TakeSocket(port);
    if (!socket.ok()) return socket.status();
    engine->endpoints_.push_back({ntohl(socket->address().sin_addr.s_addr), ntohs(socket->address().sin_port),
                                  device->host_slot() == 0 ? ntohs(socket->address().sin_port)
                                                           : device->ServicePort(port)});
    where += fmt::format("{}port {} {}", port == 1 ? "" : ", ", port,
                         net::ToString(socket->address()));
    sockets.push_back(std::move(socket).value());
  }
  engine->packet_.resize(wire::kMaxPacketBytes + kCacheLine);
  auto loop = net::Loop::Create(*backend, std::move(sockets), engine.get());
  if (!loop.ok()) return loop.status();
  engine->loop_ = std::move(loop).value();
  engine->device_->SetFatalHandler([raw = engine.get()] { raw->FailAllQps(); });
  engine->loop_->Start();
  std::vector<cm::DevicePort> cm_ports;
  for (int port = 1; port <= device->num_ports(); ++port) {
    cm_ports.push_back({htonl(engine->endpoints_[port - 1].ip), IbMtuOf(device->ActiveMtu(port)), device->host_slot()});
  }
  cm::Manager::Get().AttachDevice(device->index(), device->node_guid(), std::move(cm_ports), engine.get());
  Log().info("{}: engine running on {} ({})", engine->device_->name(), where,
             net::ToString(engine->loop_->backend()));
  return engine;
}

Result<uint32_t> Engine::AllocateQpn() {
  std::unique_lock lock(qps_mu_);
  for (int tries = 0; tries < (1 << 24); ++tries) {
    // The host slot rides in bits 20-23, so a peer of a shared address
    // finds this process by the QPN alone (hosts.h).
    uint32_t qpn = next_qpn_ | (uint32_t{device_->host_slot()} << device::hosts::kQpnSlotShift);
    next_qpn_ = next_qpn_ >= device::hosts::kQpnIndexMask ? 0x11 : next_qpn_ + 1;
    if (!qps_.contains(qpn) && !wqs_.contains(qpn)) return qpn;
  }
  return NoMemory("no free QP number");
}

void Engine::AddQp(std::shared_ptr<Qp> qp) {
  std::unique_lock lock(qps_mu_);
  uint32_t qpn = qp->qpn;
  qps_[qpn] = std::move(qp);
}

void Engine::StartPosted(uint32_t qpn) {
  auto qp = FindQp(qpn);
  if (!qp) return;
  const auto give_up = Clock::now() + kStartPostedWait;
  for (;;) {
    {
      std::lock_guard lock(qp->mu);
      const QpState state = qp->attrs.state;
      // A held ACK is due now: the peer is owed it (HoldAck).
      if (qp->ack_held) qp->held_ack_until = Clock::time_point::min();
      if ((qp->sq.empty() && !qp->ack_held) || (state != QpState::kRts && state != QpState::kSqd)) return;
    }
    if (Clock::now() >= give_up) return;
    Doorbell(qpn);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void Engine::RemoveQp(uint32_t qpn) {
  std::shared_ptr<Qp> qp;
  {
    std::unique_lock lock(qps_mu_);
    auto it = qps_.find(qpn);
    if (it == qps_.end()) return;
    qp = std::move(it->second);
    qps_.erase(it);
  }
  // The loop thread works on a QP only under its mu, holding a reference it
  // may have found before we unpublished it: taking mu orders us after a use
  // in progress, and `removed` stops every later one (qp.h). Checking the
  // table again under mu would not do: FindQp and the lock are two steps.
  {
    std::lock_guard lock(qp->mu);
    qp->removed = true;
  }
  if (qp->type == QpType::kRawPacket) {
    std::unique_lock lock(flows_mu_);
    EraseFlowsLocked([qpn](const flow::Rule& r) { return r.qpn == qpn; });
  }
  std::lock_guard lock(mcast_mu_);
  for (auto it = groups_.begin(); it != groups_.end();) {
    auto next = std::next(it);
    const auto [port, group] = it->first;
    if (std::find(it->second.qpns.begin(), it->second.qpns.end(), qpn) != it->second.qpns.end()) {
      LeaveGroupLocked(port, group, qpn);
    }
    it = next;
  }
}

Status Engine::AttachMcast(uint32_t qpn, uint8_t port, uint32_t group) {
  if (!IN_MULTICAST(ntohl(group))) {
    return InvalidArgument(net::ToString(in_addr{group}) + " is not an IPv4 multicast group");
  }
  if (port < 1 || port > endpoints_.size()) return InvalidArgument("no such port");
  std::lock_guard lock(mcast_mu_);
  auto it = groups_.find({port, group});
  if (it != groups_.end()) {
    std::vector<uint32_t>& qpns = it->second.qpns;
    if (std::find(qpns.begin(), qpns.end(), qpn) != qpns.end()) return Status::Ok();
    if (qpns.size() >= static_cast<size_t>(device::kMaxMcastQpAttach)) {
      return NoMemory(fmt::format("group {} has {} QPs attached already (max_mcast_qp_attach)",
                                  net::ToString(in_addr{group}), qpns.size()));
    }
    qpns.push_back(qpn);
  } else {
    if (groups_.size() >= static_cast<size_t>(device::kMaxMcastGrp)) {
      return NoMemory(fmt::format("{} groups are joined already (max_mcast_grp)", groups_.size()));
    }
    const Endpoint& at = endpoints_[port - 1];
    auto socket = net::UdpSocket::OpenGroup(in_addr{group}, at.service_port, in_addr{htonl(at.ip)});
    if (!socket.ok()) return socket.status();
    const uint32_t handle = loop_->AddGroupSocket(port - 1, std::move(socket).value());
    groups_.emplace(std::pair{port, group}, Group{handle, {qpn}});
  }
  Log().debug("{} qp#{} joined multicast group {} on port {}", device_->name(), qpn,
              net::ToString(in_addr{group}), port);
  return Status::Ok();
}

Status Engine::DetachMcast(uint32_t qpn, uint8_t port, uint32_t group) {
  std::lock_guard lock(mcast_mu_);
  auto it = groups_.find({port, group});
  if (it == groups_.end() ||
      std::find(it->second.qpns.begin(), it->second.qpns.end(), qpn) == it->second.qpns.end()) {
    return InvalidArgument(fmt::format("qp#{} is not attached to {} on port {}", qpn,
                                       net::ToString(in_addr{group}), port));
  }
  LeaveGroupLocked(port, group, qpn);
  return Status::Ok();
}

void Engine::LeaveGroupLocked(uint8_t port, uint32_t group, uint32_t qpn) {
  auto it = groups_.find({port, group});
  if (it == groups_.end()) return;
  std::erase(it->second.qpns, qpn);
  Log().debug("{} qp#{} left multicast group {} on port {}", device_->name(), qpn,
              net::ToString(in_addr{group}), port);
  if (it->second.qpns.empty()) {
    loop_->RemoveGroupSocket(it->second.handle);
    groups_.erase(it);
  }
}

void Engine::ReceiveMulticast(const wire::PacketView& packet, const net::Datagram& d,
                              uint8_t port) {
  // IBA 10.5.2.1: a multicast packet is a UD packet to QPN 0xFFFFFF.
  if (packet.info().transport != wire::Transport::kUd || packet.dest_qpn() != wire::kMulticastQpn) {
    CountPort(port, &Counters::dropped_malformed);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                        "{}: dropped a {} to qp#{} sent to group {}: multicast carries UD "
                        "packets to QPN 0xFFFFFF only",
                        device_->name(), packet.info().name, packet.dest_qpn(),
                        net::ToString(d.dst));
    return;
  }
  // Copied out (into a buffer that keeps its capacity) so that delivery,
  // which takes each QP's lock, runs without mcast_mu_.
  std::vector<uint32_t>& qpns = mcast_members_;
  qpns.clear();
  {
    std::lock_guard lock(mcast_mu_);
    auto it = groups_.find({port, d.dst.s_addr});
    if (it != groups_.end()) qpns.assign(it->second.qpns.begin(), it->second.qpns.end());
  }
  if (qpns.empty()) {  // its socket is closing: the last QP left
    CountPort(port, &Counters::dropped_unknown_qpn);
    return;
  }
  for (uint32_t qpn : qpns) {
    auto qp = FindQp(qpn);
    if (!qp) continue;  // being destroyed: RemoveQp detaches it
    CountOnQp(*qp, &Counters::packets_received);
    CountOnQp(*qp, &Counters::bytes_received, d.data.size());
    if (TraceOn()) tracer_.Received(qp->qpn, packet, d.src);
    ReceiveUd(*qp, packet, d, port);
  }
}

void Engine::AddWq(std::shared_ptr<Wq> wq) {
  std::unique_lock lock(qps_mu_);
  uint32_t wqn = wq->wqn;
  wqs_[wqn] = std::move(wq);
}

void Engine::RemoveWq(uint32_t wqn) {
  std::unique_lock lock(qps_mu_);
  wqs_.erase(wqn);
}

std::shared_ptr<Wq> Engine::FindWq(uint32_t wqn) {
  std::shared_lock lock(qps_mu_);
  auto it = wqs_.find(wqn);
  return it == wqs_.end() ? nullptr : it->second;
}

void Engine::AddSrq(std::shared_ptr<Srq> srq) {
  std::unique_lock lock(qps_mu_);
  const uint32_t srqn = srq->srqn;
  srqs_[srqn] = std::move(srq);
}

void Engine::RemoveSrq(uint32_t srqn) {
  std::shared_ptr<Srq> srq;
  {
    std::unique_lock lock(qps_mu_);
    auto it = srqs_.find(srqn);
    if (it == srqs_.end()) return;
    srq = std::move(it->second);
    srqs_.erase(it);
  }
  // As RemoveQp: a target may have found the SRQ just before; `removed`,
  // under mu, stops it from touching the SRQ's CQ after we return.
  std::lock_guard lock(srq->mu);
  srq->removed = true;
}

std::shared_ptr<Srq> Engine::FindSrq(uint32_t srqn) {
  std::shared_lock lock(qps_mu_);
  auto it = srqs_.find(srqn);
  return it == srqs_.end() ? nullptr : it->second;
}

bool Engine::AwaitsNothing() {
  // Every lock only tried, so none is waited for in any order: one that is
  // taken belongs to a thread working on that queue.
  std::shared_lock lock(qps_mu_, std::try_to_lock);
  if (!lock.owns_lock() || qps_.size() + wqs_.size() + srqs_.size() > kIdleScanQueues) return false;
  auto empty = [](auto& queue) {
    std::unique_lock queue_lock(queue.mu, std::try_to_lock);
    return queue_lock.owns_lock() && queue.rq.empty();
  };
  for (const auto& [qpn, qp] : qps_) {
    std::unique_lock qp_lock(qp->mu, std::try_to_lock);
    if (!qp_lock.owns_lock()) return false;
    if (qp->removed) continue;
    if (qp->sq_outstanding > 0 || !qp->sq.empty() || !qp->rq.empty() || qp->in_send) return false;
    if (qp->srq && !empty(*qp->srq)) return false;
  }
  for (const auto& [wqn, wq] : wqs_) {
    if (!empty(*wq)) return false;
  }
  for (const auto& [srqn, srq] : srqs_) {
    if (!empty(*srq)) return false;
  }
  return true;
}

uint64_t Engine::DatagramsReceived() const {
  uint64_t n = 0;
  for (const Counters& port : ports_) n += port.packets_received.load(std::memory_order_relaxed);
  return n;
}

void Engine::TookCompletions(bool took_receive) {
  LearnFromRepoll();  // this poll is the next one too
  if (took_receive) {
    release_when_done_.store(false, std::memory_order_relaxed);
    return;
  }
  if (!AwaitsNothing()) return;
  took_last_received_.store(DatagramsReceived(), std::memory_order_relaxed);
  took_last_waits_.store(event_waits_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  took_last_.store(true, std::memory_order_relaxed);
  if (release_when_done_.load(std::memory_order_relaxed)) Release();
}

std::shared_ptr<Qp> Engine::FindQp(uint32_t qpn) {
  std::shared_lock lock(qps_mu_);
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second;
}

CounterValues Engine::counters() const {
  CounterValues total;
  for (int port = 1; port <= device_->num_ports(); ++port) total += ports_[port - 1].Snapshot();
  return total;
}

Result<CounterValues> Engine::port_counters(int port) const {
  if (!device_->ValidPort(port)) {
    return InvalidArgument(fmt::format("{} has no port {}", device_->name(), port));
  }
  return ports_[port - 1].Snapshot();
}

void Engine::Doorbell(uint32_t qpn, bool streaming) {
  {
    std::lock_guard lock(pending_mu_);
    pending_.push_back(qpn);
  }
  const auto batching = streaming ? net::SendBatching::kWhileStreaming : net::SendBatching::kOff;
  if (!loop_->Drive(/*receive=*/false, batching)) loop_->Ring();
}

namespace {

// When OnWork must look at an active QP again. A timer held back by a
// receive backlog (CheckTimers) is in the past: it is looked at again after
// a millisecond, not on every call while the backlog is read.
std::optional<Clock::time_point> NextDeadline(const Qp& qp, Clock::time_point now) {
  constexpr auto kBacklogRecheck = std::chrono::milliseconds(1);
  if (qp.rnr_waiting) return qp.rnr_until;
  // Work posted but not started: looked at on the next call, as before.
  if (qp.inflight.empty()) return qp.sq.empty() ? std::nullopt : std::optional(now);
  if (qp.attrs.timeout == 0) return std::nullopt;
  return qp.timeout_at > now ? qp.timeout_at : now + kBacklogRecheck;
}

}  // namespace

void Engine::Activate(Qp& qp) {
  active_.insert(qp.qpn);
  // A QP with nothing to time yet is looked at on the next call.
  const Clock::time_point at = NextDeadline(qp, Clock::time_point::min()).value_or(Clock::time_point::min());
  if (!scan_at_ || at < *scan_at_) scan_at_ = at;
}

std::optional<Clock::time_point> Engine::OnWork(Clock::time_point now) {
  std::vector<uint32_t> rung;
  {
    std::lock_guard lock(pending_mu_);
    rung.swap(pending_);
  }
  auto access = device_->mrs().AccessGuard();
  receive_backlog_.reset();
  // Packets the fault rules held back that are due now.
  faults_.Flush(now, *this);
  SendQueuedMads();
  for (uint32_t qpn : rung) {
    if (auto qp = FindQp(qpn)) {
      std::lock_guard lock(qp->mu);
      if (!qp->removed) Progress(*qp, now);
    }
  }
  // Iterate over a snapshot: a QP that fails here (retries exhausted)
  // leaves active_ from inside CheckTimers.
  std::optional<Clock::time_point> next;
  if (!held_acks_.empty()) next = FlushDueAcks(now);
  // Captured packets reach the file within capture::kFlushInterval, even
  // when the engine then goes idle.
  if (capture::FlushIfDue(now) && (!next || now + capture::kFlushInterval < *next)) {
    next = now + capture::kFlushInterval;
  }
  if (scan_at_ && now < *scan_at_) {
    // No timer or RNR wait is due: the QPs in flight need nothing now.
    if (!next || *scan_at_ < *next) next = scan_at_;
    if (auto at = faults_.Flush(Clock::now(), *this); at && (!next || *at < *next)) next = at;
    return next;
  }
  std::optional<Clock::time_point> scan_next;
  const std::vector<uint32_t> active(active_.begin(), active_.end());
  for (uint32_t qpn : active) {
    auto qp = FindQp(qpn);
    if (!qp) {
      active_.erase(qpn);
      continue;
    }
    std::lock_guard lock(qp->mu);
    if (qp->removed) {
      active_.erase(qpn);
      continue;
    }
    CheckTimers(*qp, now);
    Progress(*qp, now);
    if (qp->inflight.empty() && (qp->sq.empty() || qp->attrs.state != QpState::kRts)) {
      active_.erase(qpn);
      continue;
    }
    if (auto at = NextDeadline(*qp, now); at && (!scan_next || *at < *scan_next)) scan_next = at;
  }
  scan_at_ = scan_next;
  if (scan_next && (!next || *scan_next < *next)) next = scan_next;
  // Again, for what the work above sent: it may be held back too.
  if (auto at = faults_.Flush(Clock::now(), *this); at && (!next || *at < *next)) next = at;
  return next;
}

void Engine::Transmit(Qp* qp, const wire::PacketFields& fields_in, wire::Gather payload,
                      uint32_t dst_ip, uint8_t port_override, std::optional<uint8_t> tos_override,
                      uint8_t gsi_slot) {
  if (device_->dead()) {
    Count(qp, &Counters::dropped_device_dead);
    return;
  }
  // The QP's current path picks the port; modify checked it, so a bad one
  // here is a bug: port 1 is the safe answer.
  uint8_t port = port_override != 0 ? port_override : qp != nullptr ? qp->attrs.port : 1;
  if (port < 1 || port > endpoints_.size()) port = 1;
  if (!device_->PortUp(port)) {
    Count(qp, &Counters::dropped_port_down);
    return;
  }
  if (dst_ip == 0) {
    // A DLID that no port of the subnet has (subnet.h): lost, as in a switch.
    Count(qp, &Counters::dropped_no_route);
    return;
  }
  // A held ACK leaves ahead of the QP's other answers: a NAK, READ
  // response or atomic ACK acknowledges what it does.
  if (qp != nullptr && qp->ack_held && wire::InfoOf(fields_in.opcode).Has(wire::kResponseMask)) {
    FlushHeldAck(*qp);
  }
  wire::PacketFields fields = fields_in;
  if (qp != nullptr) fields.bth.pkey = device_->PkeyAt(qp->attrs.port, qp->attrs.pkey_index);
  const Endpoint& from = endpoints_[port - 1];
  // Multicast goes to every process's group socket on the service port;
  // a unicast packet to the process its destination QP (or, for a MAD,
  // the CM's communication ID) names.
  const bool multicast = (ntohl(dst_ip) >> 28) == 0xe;
  const uint8_t dst_slot =
      fields.bth.dest_qpn == cm::kGsiQpn ? gsi_slot : device::hosts::SlotOfQpn(fields.bth.dest_qpn);
  const uint16_t dst_port = multicast ? from.service_port : DestinationPort(from, dst_ip, dst_slot);
  wire::IcrcAddressing addr{from.ip, ntohl(dst_ip), from.udp_port, dst_port};
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = dst_ip;
  to.sin_port = htons(dst_port);
  const uint8_t tos = tos_override ? *tos_override : qp != nullptr ? qp->attrs.traffic_class : 0;
  // Without fault rules or a capture, which need the packet in one piece,
  // it is sent gathered: the payload goes from where it lies (registered
  // memory) straight into the send queue, one copy instead of two.
  if (!faults_.active() && !capture::Active() && payload.size() <= wire::kMaxGatherPieces) {
    std::array<uint8_t, wire::kMaxTrailerBytes> trailer;
    auto g = wire::BuildGatheredPacket(fields, payload, packet_, trailer, addr);
    if (!g.ok()) {
      Log().error("cannot build a {} packet: {}", wire::InfoOf(fields.opcode).name, g.status().message());
      return;
    }
    std::array<iovec, wire::kMaxGatherPieces + 2> iov;
    size_t n = 0;
    iov[n++] = {packet_.data(), g->header_bytes};
    for (const auto& piece : payload) {
      if (!piece.empty()) iov[n++] = {const_cast<uint8_t*>(piece.data()), piece.size()};
    }
    iov[n++] = {trailer.data(), g->trailer_bytes};
    // An RC or XRC request's payload stays in its registered memory, as the
    // verbs require, until the ACK that completes its WQE, which cannot
    // come before the packet has left: the kernel copies it from there.
    // Not a READ response: the responder's program may write its memory
    // meanwhile, which would leave the packet's ICRC behind its bytes (a
    // device reads as it sends). Nor UC or UD, whose sends complete as they
    // are queued: the program may then reuse the buffer.
    const bool borrow = qp != nullptr && IsReliable(qp->type) &&
                        !wire::InfoOf(fields.opcode).Has(wire::kResponseMask);
    Sent(qp, fields, payload, dst_ip, g->length);
    SendDatagram(port, to, std::span<const iovec>(iov.data(), n), g->length, tos,
                 borrow ? net::Gathered::kBorrowPayload : net::Gathered::kCopy);
    return;
  }
  // The payload starts on a cache line of packet_: copying 4 KiB into a
  // destination 12 bytes off one (a BTH) is several times slower with the
  // string instructions memcpy uses at that size.
  const size_t headers = wire::InfoOf(fields.opcode).length;
  const size_t shift = (kCacheLine - (reinterpret_cast<uintptr_t>(packet_.data()) + headers) % kCacheLine) %
                       kCacheLine;
  const std::span<uint8_t> out = std::span<uint8_t>(packet_).subspan(shift);
  auto len = wire::BuildPacket(fields, payload, out, &addr);
  if (!len.ok()) {
    Log().error("cannot build a {} packet: {}", wire::InfoOf(fields.opcode).name, len.status().message());
    return;
  }
  Sent(qp, fields, payload, dst_ip, *len);
  std::span<uint8_t> bytes(out.data(), *len);
  if (!faults_.active()) {
    SendNow(port, to, bytes, tos);
    return;
  }
  fault::PacketMeta meta;
  meta.dir = fault::kTx;
  meta.port = port;
  // A packet of no QP is a CM MAD, sent from QP1 (its DETH says so): rules
  // with qpn=1 must see it as QP1's, as they see the MADs QP1 receives.
  meta.local_qpn = qp != nullptr ? qp->qpn : fields.deth.src_qpn;
  meta.dst_qpn = fields.bth.dest_qpn;
  meta.psn = fields.bth.psn;
  meta.opcode = static_cast<uint8_t>(fields.opcode);
  meta.tos = tos;
  faults_.Egress(meta, bytes, to, Clock::now(), *this);
}

void Engine::Sent(Qp* qp, const wire::PacketFields& fields, wire::Gather payload, uint32_t dst_ip,
                  size_t length) {
  // The QP counts what it transmitted; the port what crossed the socket
  // (SendNow), which fault rules may make more or less.
  if (qp != nullptr) {
    CountOnQp(*qp, &Counters::packets_sent);
    CountOnQp(*qp, &Counters::bytes_sent, length);
  }
  if (TraceOn()) {
    size_t payload_bytes = 0;
    for (const auto& piece : payload) payload_bytes += piece.size();
    tracer_.Sent(qp != nullptr ? qp->qpn : 0, fields, payload_bytes, dst_ip);
  }
}

uint16_t Engine::ArrivalPort(const net::Datagram& d) const {
  // A group's datagrams arrive on the service port, which differs from
  // the port's own at a host slot > 0.
  const Endpoint& at = endpoints_[d.socket];
  return (ntohl(d.dst.s_addr) >> 28) == 0xe ? at.service_port : at.udp_port;
}

uint16_t Engine::DestinationPort(const Endpoint& from, uint32_t dst_ip, uint8_t slot) {
  if (slot == 0) return from.service_port;
  // A slot nobody recorded is slot 0: a peer that is not an emulated
  // process (a kernel's CM draws its communication IDs at random, a NIC
  // its QPNs) has bits there that name no slot, and it receives on 4791.
  // Looked up again after a second, so a slot whose process ended and
  // another took is found within a retry or two.
  constexpr auto kFresh = std::chrono::seconds(1);
  const auto now = Clock::now();
  std::lock_guard lock(slot_ports_mu_);
  auto& [port, when] = slot_ports_[{dst_ip, slot}];
  if (port == 0 || now - when > kFresh) {
    port = device::hosts::PortOf(in_addr{dst_ip}, slot).value_or(from.service_port);
    when = now;
  }
  return port;
}

void Engine::SendNow(uint8_t port, const sockaddr_in& to, std::span<const uint8_t> bytes, uint8_t tos) {
  if (port < 1 || port > endpoints_.size()) return;  // the injector keeps what Transmit gave it
  const iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  SendDatagram(port, to, std::span<const iovec>(&iov, 1), bytes.size(), tos);
}

void Engine::Deliver(const net::Datagram& datagram) { ReceiveDatagram(datagram, Clock::now()); }

void Engine::Counted(fault::FaultEvent what, uint8_t port, uint32_t local_qpn, uint64_t n) {
  // The counter of each fault::FaultEvent, in the enum's order.
  static constexpr std::atomic<uint64_t> Counters::*kCounter[] = {
      &Counters::fault_dropped,   &Counters::fault_duplicated, &Counters::fault_corrupted,
      &Counters::fault_delayed,   &Counters::fault_reordered,  &Counters::fault_shaped,
      &Counters::fault_overflows};
  static_assert(std::size(kCounter) == static_cast<size_t>(fault::FaultEvent::kOverflow) + 1);
  const auto c = kCounter[static_cast<size_t>(what)];
  if (port >= 1 && port <= endpoints_.size()) CountPort(port, c, n);
  // A received packet's local QP is the BTH's destination, which may be no
  // QP of ours (no QP has number 0).
  if (local_qpn == 0) return;
  if (auto qp = FindQp(local_qpn)) CountOnQp(*qp, c, n);
}

void Engine::SendMad(uint8_t port, uint32_t dst_ip, uint8_t dst_slot, uint8_t traffic_class,
                     std::span<const uint8_t> mad) {
  QueuedMad q{port, dst_ip, dst_slot, traffic_class, {}};
  std::copy_n(mad.begin(), std::min(mad.size(), q.mad.size()), q.mad.begin());
  {
    std::lock_guard lock(mads_mu_);
    mads_.push_back(q);
    ++mads_queued_;
  }
  loop_->Ring();
}

void Engine::Flush(std::chrono::steady_clock::time_point deadline) {
  uint64_t target;
  {
    std::lock_guard lock(mads_mu_);
    target = mads_queued_;
  }
  // Counted sent is not yet on the wire: the loop batches its sends and
  // writes them at the end of its round, and a process that exits between
  // the two loses them (the DREQ of an exiting process did, under load).
  // A round of our own ends with that write, and one that finds them
  // counted comes after the round that took them had written them.
  while (std::chrono::steady_clock::now() < deadline) {
    if (loop_->Drive(/*receive=*/false)) {
      std::lock_guard lock(mads_mu_);
      if (mads_sent_ >= target) return;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void Engine::SendQueuedMads() {
  std::vector<QueuedMad> mads;
  {
    std::lock_guard lock(mads_mu_);
    mads.swap(mads_);
  }
  for (const QueuedMad& q : mads) {
    // GSI packets: a UD SEND from QP1 to QP1 with the well-known Q_Key and
    // the default P_Key (IBA 13.5.1), as every CM on RoCE sends them.
    wire::PacketFields f;
    f.opcode = wire::Opcode::UD_SEND_ONLY;
    f.bth.pkey = wire::kDefaultPkey;
    f.bth.dest_qpn = cm::kGsiQpn;
    f.deth.qkey = cm::kGsiQkey;
    f.deth.src_qpn = cm::kGsiQpn;
    const std::span<const uint8_t> payload(q.mad);
    Transmit(nullptr, f, wire::Gather(&payload, 1), q.dst_ip, q.port, q.traffic_class, q.dst_slot);
  }
  if (!mads.empty()) {
    std::lock_guard lock(mads_mu_);
    mads_sent_ += mads.size();
  }
}

void Engine::ReceiveGsi(const wire::PacketView& packet, const net::Datagram& d, uint8_t port) {
  const char* why = nullptr;
  if (packet.opcode() != wire::Opcode::UD_SEND_ONLY) {
    why = "not a UD SEND";
  } else if (packet.deth().qkey() != cm::kGsiQkey) {
    why = "Q_Key is not the GSI's 0x80010000";
  } else if (packet.payload().size() < cm::kMadBytes) {
    why = "shorter than a MAD";
  }
  if (why != nullptr) {
    CountPort(port, &Counters::dropped_malformed);
    RDMAEMU_WARN_LIMITED("{}: dropped a {} for QP1 from {}: {}", device_->name(), packet.info().name,
                         net::ToString(d.src), why);
    return;
  }
  if (!device_->PortUp(port)) {
    CountPort(port, &Counters::dropped_port_down);
    return;
  }
  if (!cm::Manager::Get().OnMad(device_->index(), port, d.src.sin_addr.s_addr,
                                packet.payload().first(cm::kMadBytes))) {
    CountPort(port, &Counters::dropped_malformed);
  }
}

void Engine::SendDatagram(uint8_t port, const sockaddr_in& to, std::span<const iovec> iov, size_t length,
                          uint8_t tos, net::Gathered gathered) {
  // Transmit gathers a packet only while no capture runs, so one that
  // starts meanwhile misses at most the packets already being gathered.
  if (iov.size() == 1) {
    const Endpoint& from = endpoints_[port - 1];
    capture::Record({from.ip, ntohl(to.sin_addr.s_addr), from.udp_port, ntohs(to.sin_port), tos},
                    {static_cast<const uint8_t*>(iov[0].iov_base), iov[0].iov_len});
  }
  loop_->Send(port - 1, to, iov, tos, gathered);
  CountPort(port, &Counters::packets_sent);
  CountPort(port, &Counters::bytes_sent, length);
}

bool Engine::PkeyAccepted(Qp& qp, const wire::PacketView& packet) {
  const uint16_t mine = device_->PkeyAt(qp.attrs.port, qp.attrs.pkey_index);
  const uint16_t theirs = packet.bth().pkey();
  if (device::PkeysMatch(theirs, mine)) return true;
  Count(&qp, &Counters::dropped_pkey);
  device_->CountBadPkey(qp.attrs.port);
  RDMAEMU_WARN_LIMITED("qp#{}: dropped a {} packet with P_Key {:#06x}: the QP's P_Key (index {}) is {:#06x} "
                       "(P_Key violation, counted in bad_pkey_cntr)",
                       qp.qpn, packet.info().name, theirs, qp.attrs.pkey_index, mine);
  return false;
}

void Engine::FailAllQps() {
  std::vector<std::shared_ptr<Qp>> all;
  {
    std::shared_lock lock(qps_mu_);
    for (const auto& [qpn, qp] : qps_) all.push_back(qp);
  }
  // As FlushQp, but the state changes in the same critical section: the
  // loop thread sees either the old QP or an empty one in ERR. Per-QP
  // events are not raised: a dead device reports only DEVICE_FATAL.
  for (const auto& qp : all) {
    std::lock_guard lock(qp->mu);
    if (qp->removed) continue;
    qp->attrs.state = QpState::kErr;
    std::vector<std::pair<objects::Cq*, objects::Cqe>> cqes;
    FlushLocked(*qp, cqes);
    for (auto& [cq, c] : cqes) {
      if (!cq->Push(c)) RDMAEMU_WARN_LIMITED("qp#{}: CQ overrun while flushing", qp->qpn);
    }
  }
  Log().info("{}: {} QP(s) moved to ERR and flushed after the fatal error", device_->name(), all.size());
}

objects::WcStatus Engine::CheckSges(const Qp& qp, const std::vector<Sge>& sges, bool write) {
  return CheckSges(qp.pd, qp.qpn, sges, write);
}

objects::WcStatus Engine::CheckSges(uint32_t pd, uint32_t num, const std::vector<Sge>& sges,
                                    bool write) {
  for (const Sge& sge : sges) {
    if (sge.length == 0) continue;
    auto mr = device_->mrs().FindByLkey(sge.lkey);
    if (!mr || mr->pd != pd || !mr->Contains(sge.addr, sge.length) ||
        (write && !(mr->access & objects::kLocalWrite))) {
      RDMAEMU_WARN_LIMITED("queue #{}: SGE [{:#x}, +{}) lkey {:#x} is not inside a memory region of "
                           "the queue's PD{}: local protection error",
                           num, sge.addr, sge.length, sge.lkey,
                           write ? " with IBV_ACCESS_LOCAL_WRITE" : "");
      return objects::WcStatus::kLocProtErr;
    }
    // An on-demand region's pages are faulted in now, before the first
    // byte moves; one that cannot be is this WR's protection error.
    if (Status s = mr->FaultIn(sge.addr, sge.length, write); !s.ok()) {
      RDMAEMU_WARN_LIMITED("queue #{}: SGE [{:#x}, +{}) lkey {:#x} of an on-demand region: {}: local "
                           "protection error",
                           num, sge.addr, sge.length, sge.lkey, s.message());
      return objects::WcStatus::kLocProtErr;
    }
  }
  return objects::WcStatus::kSuccess;
}

void Engine::GatherRange(const SendWqe& wqe, uint64_t offset, size_t len, std::vector<uint8_t>& out) {
  out.resize(len);
  uint8_t* at = out.data();
  for (const auto& piece : GatherSpans(wqe, offset, len)) {
    std::memcpy(at, piece.data(), piece.size());
    at += piece.size();
  }
  gather_mrs_.clear();
}

wire::Gather Engine::GatherSpans(const SendWqe& wqe, uint64_t offset, size_t len) {
  // Checked at admission; a region deregistered since then reads as zeros
  // rather than touching memory the program gave back.
  static const std::array<uint8_t, 4096> kZeros{};
  gather_.clear();
  gather_mrs_.clear();
  if (wqe.is_inline) {
    gather_.emplace_back(wqe.inline_data.data() + offset, len);
    return gather_;
  }
  size_t done = 0;
  uint64_t skip = offset;
  for (const Sge& sge : wqe.sges) {
    if (done == len) break;
    if (skip >= sge.length) {
      skip -= sge.length;
      continue;
    }
    const size_t n = std::min<uint64_t>(sge.length - skip, len - done);
    auto mr = device_->mrs().FindByLkey(sge.lkey);
    if (mr && mr->Contains(sge.addr + skip, n)) {
      gather_.emplace_back(static_cast<const uint8_t*>(mr->HostAddress(sge.addr + skip)), n);
      gather_mrs_.push_back(std::move(mr));
    } else {
      for (size_t z = 0; z < n; z += kZeros.size()) {
        gather_.emplace_back(kZeros.data(), std::min(kZeros.size(), n - z));
      }
    }
    done += n;
    skip = 0;
  }
  return gather_;
}

void Engine::ScatterRange(const std::vector<Sge>& sges, uint64_t offset, std::span<const uint8_t> data) {
  size_t done = 0;
  uint64_t skip = offset;
  for (const Sge& sge : sges) {
    if (done == data.size()) break;
    if (skip >= sge.length) {
      skip -= sge.length;
      continue;
    }
    size_t n = std::min<uint64_t>(sge.length - skip, data.size() - done);
    auto mr = device_->mrs().FindByLkey(sge.lkey);
    if (mr && mr->Contains(sge.addr + skip, n)) {
      std::memcpy(mr->HostAddress(sge.addr + skip), data.data() + done, n);
    }
    done += n;
    skip = 0;
  }
}

void Engine::RaiseQpEvent(Qp& qp, device::AsyncEventType type) {
  device_->Raise({type, qp.handle, 0});
}

void Engine::EnterError(Qp& qp) {
  if (qp.attrs.state == QpState::kErr) return;
  qp.attrs.state = QpState::kErr;
  std::vector<std::pair<objects::Cq*, objects::Cqe>> cqes;
  FlushLocked(qp, cqes);
  for (auto& [cq, c] : cqes) PushCqe(qp, cq, c);
  active_.erase(qp.qpn);
  // An XRC target is attached to no SRQ (qp.srq is only its last message's).
  if (qp.srq && qp.type != QpType::kXrcRecv) {
    RaiseQpEvent(qp, device::AsyncEventType::kQpLastWqeReached);
  }
}

void Engine::PushRecvCqe(Qp& qp, const objects::Cqe& cqe) {
  // A TM SRQ's messages complete on its CQ, as an XRC SRQ's do.
  if (qp.type == QpType::kXrcRecv || (qp.srq && qp.srq->tags)) {
    PushXrcRecvCqe(qp, cqe);
  } else {
    PushCqe(qp, qp.recv_cq, cqe);
  }
}

void Engine::PushXrcRecvCqe(Qp& qp, const objects::Cqe& cqe) {
  Srq& srq = *qp.srq;
  bool lost = false;
  bool first_error = false;
  std::optional<uint64_t> cq_err;
  {
    // Under the SRQ's mu, so that its CQ stays (RemoveSrq).
    std::lock_guard lock(srq.mu);
    if (srq.removed) {
      RDMAEMU_WARN_LIMITED("{} qp#{}: XRC SRQ {} was destroyed while it received WR {}: the "
                           "completion has nowhere to go",
                           device_->name(), qp.qpn, srq.srqn, cqe.wr_id);
      return;
    }
    if (DebugOn()) {
      Log().debug("{} qp#{} completion WR {} {} {}, {} bytes (XRC SRQ {})", device_->name(),
                  qp.qpn, cqe.wr_id, WcOpcodeName(cqe.opcode), WcStatusName(cqe.status),
                  cqe.byte_len, srq.srqn);
    }
    if (!srq.cq->Push(cqe)) {
      lost = true;
      if (srq.cq->TakeOverrunNotice()) cq_err = srq.cq->handle();
      first_error = !srq.error;
      srq.error = true;
    }
  }
  if (!lost) return;
  RDMAEMU_WARN_LIMITED("qp#{}: the CQ of XRC SRQ {} overran: the completion of WR {} is lost; "
                       "the SRQ is in error (SRQ_ERR) and the target QP goes to ERR",
                       qp.qpn, srq.srqn, cqe.wr_id);
  if (cq_err) device_->Raise({device::AsyncEventType::kCqErr, *cq_err, 0});
  if (first_error) device_->Raise({device::AsyncEventType::kSrqErr, srq.handle, 0});
  EnterError(qp);
}

void Engine::PushCqe(Qp& qp, objects::Cq* cq, const objects::Cqe& cqe) {
  if (DebugOn()) {
    Log().debug("{} qp#{} completion WR {} {} {}, {} bytes", device_->name(), qp.qpn, cqe.wr_id,
                WcOpcodeName(cqe.opcode), WcStatusName(cqe.status), cqe.byte_len);
  }
  if (cq->Push(cqe)) return;
  RDMAEMU_WARN_LIMITED("qp#{}: CQ overrun: the completion of WR {} is lost; the CQ is in error "
                       "(poll it faster or create it with more entries)",
                       qp.qpn, cqe.wr_id);
  if (cq->TakeOverrunNotice()) device_->Raise({device::AsyncEventType::kCqErr, cq->handle(), 0});
  // A receive from an SRQ whose completion is lost leaves the SRQ with a
  // WQE consumed that no one will ever hear of: the SRQ is in error (our
  // cause of SRQ_ERR, docs/events-wq.md) and gives out no more WQEs.
  const bool receive = static_cast<uint8_t>(cqe.opcode) & static_cast<uint8_t>(objects::WcOpcode::kRecv);
  if (receive && qp.srq) {
    bool first = false;
    {
      std::lock_guard lock(qp.srq->mu);
      first = !qp.srq->error;
      qp.srq->error = true;
    }
    if (first) {
      Log().warn("qp#{}: a receive taken from its SRQ lost its completion to the CQ overrun: the "
                 "SRQ is in error (SRQ_ERR) and gives out no more receives; destroy it",
                 qp.qpn);
      device_->Raise({device::AsyncEventType::kSrqErr, qp.srq->handle, 0});
    }
  }
  EnterError(qp);
}

void Engine::PushWqCqe(Wq& wq, const objects::Cqe& cqe) {
  if (wq.cq->Push(cqe)) return;
  RDMAEMU_WARN_LIMITED("wq#{}: CQ overrun: the completion of WR {} is lost; the CQ and the WQ are "
                       "in error (poll it faster or create it with more entries)",
                       wq.wqn, cqe.wr_id);
  if (wq.cq->TakeOverrunNotice()) {
    device_->Raise({device::AsyncEventType::kCqErr, wq.cq->handle(), 0});
  }
  if (wq.state == WqState::kErr) return;
  wq.state = WqState::kErr;
  std::vector<objects::Cqe> flushed;
  FlushWqLocked(wq, flushed);
  for (auto& c : flushed) (void)wq.cq->Push(c);  // the CQ is overrun: lost too
  device_->Raise({device::AsyncEventType::kWqFatal, wq.handle, 0});
}

bool Engine::TakeRecv(Qp& qp, RecvWqe* out) {
  if (!qp.srq) {
    if (qp.rq.empty()) return false;
    *out = std::move(qp.rq.front());
    qp.rq.pop_front();
    return true;
  }
  bool limit_reached = false;
  {
    std::lock_guard lock(qp.srq->mu);
    if (qp.srq->removed) return false;  // an XRC SRQ destroyed since the lookup
    if (qp.srq->error) {
      RDMAEMU_WARN_LIMITED("qp#{}: its SRQ is in error (SRQ_ERR): no receive is taken from it",
                           qp.qpn);
      return false;
    }
    if (qp.srq->rq.empty()) return false;
    *out = std::move(qp.srq->rq.front());
    qp.srq->rq.pop_front();
    if (qp.srq->limit != 0 && qp.srq->rq.size() < qp.srq->limit) {
      qp.srq->limit = 0;  // one-shot: the application re-arms with ibv_modify_srq
      limit_reached = true;
    }
  }
  if (limit_reached) {
    device_->Raise({device::AsyncEventType::kSrqLimitReached, qp.srq->handle, 0});
  }
  return true;
}

void Engine::ReturnRecv(Qp& qp, RecvWqe&& wqe) {
  if (!qp.srq) {
    qp.rq.push_front(std::move(wqe));
    return;
  }
  std::lock_guard lock(qp.srq->mu);
  qp.srq->rq.push_front(std::move(wqe));
}

void Engine::CompleteUnackedSend(Qp& qp, const SendWqe& wqe, objects::WcStatus status) {
  if (qp.sq_outstanding > 0) --qp.sq_outstanding;
  if (!wqe.signaled && status == objects::WcStatus::kSuccess) return;
  objects::Cqe cqe;
  cqe.wr_id = wqe.wr_id;
  cqe.status = status;
  cqe.opcode = objects::WcOpcode::kSend;
  cqe.qp_num = qp.qpn;
  cqe.byte_len = static_cast<uint32_t>(wqe.length);
  PushCqe(qp, qp.send_cq, cqe);
}

void Engine::ExecuteUdSend(Qp& qp, const SendWqe& wqe) {
  auto complete = [&](objects::WcStatus status) { CompleteUnackedSend(qp, wqe, status); };
  uint32_t mtu = device_->ActiveMtu(qp.attrs.port);
  if (wqe.length > mtu) {
    RDMAEMU_WARN_LIMITED("qp#{} WR {}: UD message of {} bytes exceeds the port MTU {}: local length error",
                         qp.qpn, wqe.wr_id, wqe.length, mtu);
    complete(objects::WcStatus::kLocLenErr);
    return;
  }
  if (auto s = CheckSges(qp, wqe.sges, false); s != objects::WcStatus::kSuccess) {
    complete(s);
    return;
  }
  if (DebugOn()) {
    Log().debug("{} qp#{} WR {} {} {} bytes → {} qp#{}", device_->name(), qp.qpn, wqe.wr_id,
                SendOpName(wqe.op), wqe.length, net::ToString(in_addr{wqe.ud.dst_ip}),
                wqe.ud.remote_qpn);
  }
  const wire::Gather payload = GatherSpans(wqe, 0, wqe.length);
  wire::PacketFields f;
  f.opcode = wqe.op == SendOp::kSendWithImm ? wire::Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                                            : wire::Opcode::UD_SEND_ONLY;
  f.bth.solicited = wqe.solicited;
  f.bth.dest_qpn = wqe.ud.remote_qpn;
  f.bth.psn = qp.next_send_psn;
  qp.next_send_psn = wire::PsnNext(qp.next_send_psn);
  // A Q_Key with the high bit set means "use the QP's own" (IBA 10.2.4.3).
  f.deth.qkey = (wqe.ud.remote_qkey & 0x80000000u) ? qp.attrs.qkey : wqe.ud.remote_qkey;
  f.deth.src_qpn = qp.qpn;
  f.imm = ntohl(wqe.imm_data);
  Transmit(&qp, f, payload, wqe.ud.dst_ip, 0, wqe.ud.traffic_class);
  complete(objects::WcStatus::kSuccess);
}

namespace {

bool IsResponse(const net::Datagram& d) {
  if (d.data.size() < wire::kBthBytes || wire::IsRawFrameDatagram(d.data)) return false;
  const wire::OpcodeInfo* info = wire::FindOpcode(d.data[0]);
  return info != nullptr && info->Has(wire::kResponseMask);
}

}  // namespace

void Engine::OnDatagrams(std::span<const net::Datagram> batch) {
  const Clock::time_point now = Clock::now();
  last_datagram_ns_.store(net::NanosOf(now), std::memory_order_relaxed);
  auto access = device_->mrs().AccessGuard();
  for (const net::Datagram& d : batch) {
    // Port p's socket is the loop's socket p-1 (Start).
    if (d.socket < 0 || static_cast<size_t>(d.socket) >= endpoints_.size()) continue;
    const uint8_t port = static_cast<uint8_t>(d.socket + 1);
    capture::Record({ntohl(d.src.sin_addr.s_addr), ntohl(d.dst.s_addr), ntohs(d.src.sin_port),
                     ArrivalPort(d), d.tos},
                    d.data);
    CountPort(port, &Counters::packets_received);
    CountPort(port, &Counters::bytes_received, d.data.size());
    if (device_->dead()) {
      CountPort(port, &Counters::dropped_device_dead);
      continue;
    }
    if (!device_->PortUp(port)) {
      CountPort(port, &Counters::dropped_port_down);
      continue;
    }
    // A batch's responses go first: an ACK that left right behind a
    // request of the same peer (HoldAck) completes the WQE it answers
    // before the request's own completion comes, as a NIC's ACK ahead of
    // the answer would (rping reuses its send buffer once the answer is in,
    // perftest's rdma_cm exchange receives the answer into it).
    if (IsResponse(d)) {
      Admit(d, port, now);
    } else {
      deferred_.push_back(static_cast<uint32_t>(&d - batch.data()));
    }
  }
  for (uint32_t i : deferred_) Admit(batch[i], static_cast<uint8_t>(batch[i].socket + 1), now);
  deferred_.clear();
}

void Engine::Admit(const net::Datagram& d, uint8_t port, Clock::time_point now) {
  // Fault rules see what the BTH says; anything shorter goes on to be
  // dropped as malformed.
  // Raw frames have no BTH for a rule to look at: they pass untouched.
  if (!faults_.active() || d.data.size() < wire::kBthBytes || wire::IsRawFrameDatagram(d.data)) {
    ReceiveDatagram(d, now);
    return;
  }
  const wire::ConstBthView bth(d.data);
  fault::PacketMeta meta;
  meta.dir = fault::kRx;
  meta.port = port;
  meta.local_qpn = meta.dst_qpn = bth.dest_qpn();
  meta.psn = bth.psn();
  meta.opcode = bth.opcode();
  faults_.Ingress(meta, d, now, *this);
}

void Engine::ReceiveDatagram(const net::Datagram& d, Clock::time_point now) {
  // OnDatagrams checked the socket; the fault injector gives it back as it was.
  if (d.socket < 0 || static_cast<size_t>(d.socket) >= endpoints_.size()) return;
  const uint8_t port = static_cast<uint8_t>(d.socket + 1);
  // Checked before anything is read as RoCE: a raw frame is never a packet.
  if (wire::IsRawFrameDatagram(d.data)) {
    ReceiveRawFrame(d, port);
    return;
  }
  auto packet = wire::ParsePacket(d.data);
  if (!packet.ok()) {
    CountPort(port, &Counters::dropped_malformed);
    RDMAEMU_WARN_LIMITED("dropped a malformed packet from {}: {}", net::ToString(d.src),
                         packet.status().message());
    return;
  }
  wire::IcrcAddressing addr{ntohl(d.src.sin_addr.s_addr), ntohl(d.dst.s_addr),
                            ntohs(d.src.sin_port), ArrivalPort(d)};
  if (Status s = wire::CheckIcrc(addr, d.data); !s.ok()) {
    CountPort(port, &Counters::dropped_icrc);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{}: dropped a packet from {}: {}", device_->name(),
                        net::ToString(d.src), s.message());
    return;
  }
  if (packet->dest_qpn() == cm::kGsiQpn) {
    ReceiveGsi(*packet, d, port);
    return;
  }
  if (IN_MULTICAST(ntohl(d.dst.s_addr))) {
    ReceiveMulticast(*packet, d, port);
    return;
  }
  auto qp = FindQp(packet->dest_qpn());
  if (!qp) {
    CountPort(port, &Counters::dropped_unknown_qpn);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{}: dropped a {} for unknown qp#{} from {}",
                        device_->name(), packet->info().name, packet->dest_qpn(),
                        net::ToString(d.src));
    return;
  }
  // From here on the packet is the QP's.
  qp->last_heard_ns.store(net::NanosOf(now), std::memory_order_relaxed);
  CountOnQp(*qp, &Counters::packets_received);
  CountOnQp(*qp, &Counters::bytes_received, d.data.size());
  if (TraceOn()) tracer_.Received(qp->qpn, *packet, d.src);
  const wire::Transport t = packet->info().transport;
  // An XRC initiator hears only responses, a target only requests.
  const bool type_ok =
      (t == wire::Transport::kUd && qp->type == QpType::kUd) ||
      (t == wire::Transport::kRc && qp->type == QpType::kRc) ||
      (t == wire::Transport::kUc && qp->type == QpType::kUc) ||
      (t == wire::Transport::kXrc && qp->type == QpType::kXrcSend && packet->Has(wire::kResponseMask)) ||
      (t == wire::Transport::kXrc && qp->type == QpType::kXrcRecv && packet->Has(wire::kRequestMask));
  if (!type_ok) {
    // Counted on the receiving port: the QP's path (attrs) needs qp->mu.
    CountPort(port, &Counters::dropped_bad_state);
    CountOnQp(*qp, &Counters::dropped_bad_state);
    RDMAEMU_WARN_LIMITED("{} qp#{}: dropped a {} packet from {}: not one a {} QP receives",
                         device_->name(), qp->qpn, packet->info().name, net::ToString(d.src),
                         QpTypeName(qp->type));
    return;
  }
  if (qp->type == QpType::kUd) {
    ReceiveUd(*qp, *packet, d, port);
    return;
  }
  std::lock_guard lock(qp->mu);
  if (qp->removed) {  // destroyed since FindQp: as if it had not been found
    CountPort(port, &Counters::dropped_unknown_qpn);
    return;
  }
  if (!PkeyAccepted(*qp, *packet)) return;
  const QpState state = qp->attrs.state;
  // RC/UC packets come only from the connected peer, on the QP's port (or
  // on its alternate path, path.cc). Counted on the port that received it.
  if (!AcceptPath(*qp, *packet, d.src.sin_addr.s_addr, port)) {
    CountPort(port, &Counters::dropped_bad_state);
    CountOnQp(*qp, &Counters::dropped_bad_state);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                        "{} qp#{}: dropped a {} from {}: not the connected peer on its path",
                        device_->name(), qp->qpn, packet->info().name, net::ToString(d.src));
    return;
  }
  if (packet->Has(wire::kRequestMask)) {
    if (state != QpState::kRtr && state != QpState::kRts && state != QpState::kSqd &&
        state != QpState::kSqe) {
      Count(qp.get(), &Counters::dropped_bad_state);
      RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{} qp#{}: dropped a {} request in state {}",
                          device_->name(), qp->qpn, packet->info().name, QpStateName(state));
      return;
    }
    // The first packet a QP receives in RTR establishes communication.
    if (state == QpState::kRtr && !qp->comm_est) {
      qp->comm_est = true;
      RaiseQpEvent(*qp, device::AsyncEventType::kCommEst);
    }
    if (ForcedError(*qp, *packet)) return;
    OnRequest(*qp, *packet);
    // A matched rendezvous queues the device's own READ (tag_matching.cc).
    if (!qp->sq.empty()) Progress(*qp, now);
  } else {
    if (state != QpState::kRts && state != QpState::kSqd && state != QpState::kSqe) {
      Count(qp.get(), &Counters::dropped_bad_state);
      RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{} qp#{}: dropped a {} response in state {}",
                          device_->name(), qp->qpn, packet->info().name, QpStateName(state));
      return;
    }
    if (ForcedError(*qp, *packet)) return;
    OnResponse(*qp, *packet, now);
    Progress(*qp, now);
  }
}

void Engine::ReceiveUd(Qp& qp, const wire::PacketView& packet, const net::Datagram& d,
                       uint8_t port) {
  std::lock_guard lock(qp.mu);
  if (qp.removed) {  // destroyed since FindQp: as if it had not been found
    CountPort(port, &Counters::dropped_unknown_qpn);
    return;
  }
  QpState state = qp.attrs.state;
  // A UD QP is bound to one port and hears only what arrives there.
  if (port != qp.attrs.port) {
    CountPort(port, &Counters::dropped_bad_state);
    CountOnQp(qp, &Counters::dropped_bad_state);
    return;
  }
  if (state != QpState::kRtr && state != QpState::kRts && state != QpState::kSqd) {
    Count(&qp, &Counters::dropped_bad_state);
    return;
  }
  if (ForcedError(qp, packet)) return;
  if (!PkeyAccepted(qp, packet)) return;
  if (packet.deth().qkey() != qp.attrs.qkey) {
    Count(&qp, &Counters::dropped_qkey);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{} qp#{}: dropped a UD packet with Q_Key {:#x} (QP's is {:#x})",
                        device_->name(), qp.qpn, packet.deth().qkey(), qp.attrs.qkey);
    return;
  }
  if (qp.rss) {
    ReceiveUdRss(qp, packet, d);
    return;
  }
  RecvWqe wqe;
  if (!TakeRecv(qp, &wqe)) {
    Count(&qp, &Counters::dropped_no_receive);
    return;
  }
  objects::Cqe cqe;
  cqe.wr_id = wqe.wr_id;
  cqe.qp_num = qp.qpn;
  DeliverUd(wqe, RecvPd(qp), qp.qpn, packet, d, cqe);
  PushCqe(qp, qp.recv_cq, cqe);
}

void Engine::ReceiveUdRss(Qp& qp, const wire::PacketView& packet, const net::Datagram& d) {
  const uint32_t hash = RxHash(qp.rx_hash.key, qp.rx_hash.fields, ntohl(d.src.sin_addr.s_addr),
                               ntohl(d.dst.s_addr), ntohs(d.src.sin_port), ArrivalPort(d));
  const auto& entries = qp.rss->entries;
  Wq& wq = *entries[hash & (entries.size() - 1)];
  std::lock_guard lock(wq.mu);
  if (wq.state != WqState::kRdy) {
    Count(&qp, &Counters::dropped_bad_state);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug,
                        "{} qp#{}: dropped a UD message steered to wq#{}, which is not RDY",
                        device_->name(), qp.qpn, wq.wqn);
    return;
  }
  if (wq.rq.empty()) {
    Count(&qp, &Counters::dropped_no_receive);
    return;
  }
  RecvWqe wqe = std::move(wq.rq.front());
  wq.rq.pop_front();
  objects::Cqe cqe;
  cqe.wr_id = wqe.wr_id;
  // As on mlx5, whose receive CQEs name the RQ that held the WQE: wq_num.
  cqe.qp_num = wq.wqn;
  DeliverUd(wqe, wq.pd, wq.wqn, packet, d, cqe);
  PushWqCqe(wq, cqe);
}

void Engine::DeliverUd(const RecvWqe& wqe, uint32_t pd, uint32_t num, const wire::PacketView& packet,
                       const net::Datagram& d, objects::Cqe& cqe) {
  cqe.opcode = objects::WcOpcode::kRecv;
  cqe.src_qp = packet.deth().src_qpn();
  cqe.wc_flags = objects::kWcGrh;
  cqe.solicited = packet.bth().solicited();
  if (packet.Has(wire::kImmDtMask)) {
    cqe.wc_flags |= objects::kWcWithImm;
    cqe.imm_data = htonl(packet.imm_dt().imm());
  }
  std::span<const uint8_t> payload = packet.payload();
  size_t total = kGrhBytes + payload.size();
  cqe.byte_len = static_cast<uint32_t>(total);
  if (total > wqe.length) {
    cqe.status = objects::WcStatus::kLocLenErr;
  } else if (auto s = CheckSges(pd, num, wqe.sges, true); s != objects::WcStatus::kSuccess) {
    cqe.status = s;
  } else {
    uint8_t grh[kGrhBytes];
    WriteGrh(grh, ntohl(d.src.sin_addr.s_addr), ntohl(d.dst.s_addr), d.data.size(), d.tos);
    ScatterRange(wqe.sges, 0, std::span<const uint8_t>(grh, kGrhBytes));
    ScatterRange(wqe.sges, kGrhBytes, payload);
  }
}

namespace {

fault::PacketMeta ReceivedMeta(const Qp& qp, const wire::PacketView& packet) {
  fault::PacketMeta meta;
  meta.dir = fault::kRx;
  meta.port = qp.attrs.port;
  meta.local_qpn = meta.dst_qpn = qp.qpn;
  meta.psn = packet.psn();
  meta.opcode = static_cast<uint8_t>(packet.opcode());
  return meta;
}


}  // namespace

bool Engine::ForcedError(Qp& qp, const wire::PacketView& packet) {
  if (!faults_.active()) return false;
  auto forced = faults_.ForcedOnPacket(ReceivedMeta(qp, packet));
  if (!forced) return false;
  Count(&qp, &Counters::fault_forced);
  Log().warn("{} qp#{} {}→ERR: forced by the fault rule \"{}\" on a {} (psn {})",
             device_->name(), qp.qpn, QpStateName(qp.attrs.state), forced->rule,
             packet.info().name, packet.psn());
  RaiseQpEvent(qp, device::AsyncEventType::kQpFatal);
  EnterError(qp);
  return true;
}

bool Engine::ForcedResponse(Qp& qp, const wire::PacketView& packet) {
  if (!faults_.active()) return false;
  auto forced = faults_.ForcedOnRequest(ReceivedMeta(qp, packet));
  if (!forced) return false;
  Count(&qp, &Counters::fault_forced);
  const uint32_t psn = packet.psn();
  switch (forced->action) {
    case fault::Action::kRnr:
      Log().debug("{} qp#{}: RNR NAK for psn {} forced by the fault rule \"{}\"",
                  device_->name(), qp.qpn, psn, forced->rule);
      Count(&qp, &Counters::rnr_naks_sent);
      SendAck(qp, psn, wire::RnrNakSyndrome(qp.attrs.min_rnr_timer));
      return true;
    case fault::Action::kNak:
      if (forced->nak == wire::NakCode::kPsnSequenceError) {
        // As for a real gap: the requester goes back to this PSN.
        Log().debug("{} qp#{}: sequence error NAK for psn {} forced by the fault rule \"{}\"",
                    device_->name(), qp.qpn, psn, forced->rule);
        SendAck(qp, psn, wire::NakSyndrome(wire::NakCode::kPsnSequenceError));
        qp.nak_sent = true;
        return true;
      }
      ResponderError(qp, forced->nak, psn,
                     fmt::format("forced by the fault rule \"{}\"", forced->rule));
      return true;
    case fault::Action::kError:
      Log().warn("{} qp#{} {}→ERR: forced by the fault rule \"{}\" on a {} (psn {})",
                 device_->name(), qp.qpn, QpStateName(qp.attrs.state), forced->rule,
                 packet.info().name, psn);
      RaiseQpEvent(qp, device::AsyncEventType::kQpFatal);
      EnterError(qp);
      return true;
    default:
      return false;
  }
}

namespace {

// The running engines by device index (AcquireEngine, FindEngine).
struct Engines {
  std::mutex mu;
  std::unordered_map<int, std::weak_ptr<Engine>> by_index;  // guarded by mu
};
Engines& RunningEngines();

// A fork child is a new host (device::Registry::PrepareFork): it forgets
// the parent's engines, devices and CM state, taking the locks first in
// the order AcquireEngine nests them.
void PrepareFork() {
  RunningEngines().mu.lock();
  device::Registry::Get().PrepareFork();
  cm::Manager::Get().PrepareFork();
}
void AfterFork(bool child) {
  cm::Manager::Get().AfterFork(child);
  device::Registry::Get().AfterFork(child);
  if (child) RunningEngines().by_index.clear();
  RunningEngines().mu.unlock();
}

Engines& RunningEngines() {
  // Never destroyed, as the logger: engine threads outlive exit()'s static
  // destructors when a program exits with devices open.
  static Engines* engines = [] {
    auto* e = new Engines();
    ::pthread_atfork(PrepareFork, [] { AfterFork(false); }, [] { AfterFork(true); });
    return e;
  }();
  return *engines;
}

}  // namespace

Result<CounterValues> Engine::qp_counters(uint32_t qpn) {
  auto qp = FindQp(qpn);
  if (!qp) return NotFound(fmt::format("{} has no qp {}", device_->name(), qpn));
  return qp->counters.Snapshot();
}

std::shared_ptr<Engine> FindEngine(int device_index) {
  Engines& e = RunningEngines();
  std::lock_guard lock(e.mu);
  auto it = e.by_index.find(device_index);
  return it == e.by_index.end() ? nullptr : it->second.lock();
}

Result<std::shared_ptr<Engine>> AcquireEngine(int device_index) {
  Engines& running = RunningEngines();
  std::lock_guard lock(running.mu);
  auto& engines = running.by_index;
  if (auto e = engines[device_index].lock()) return e;
  auto device = device::Registry::Get().Acquire(device_index);
  if (!device.ok()) return device.status();
  auto engine = Engine::Start(std::move(device).value());
  if (!engine.ok()) return engine.status();
  engines[device_index] = *engine;
  return engine;
}

}  // namespace rdmaemu::engine
