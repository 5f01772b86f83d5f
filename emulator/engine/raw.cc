// Raw packet QPs: whole Ethernet frames between emulated ports, and the flow
// rules that steer received frames to QPs (docs/raw-packet.md).
//
// A frame leaves in one UDP datagram behind the raw frame marker
// (wire/ethernet.h), never through fault rules (they speak BTH fields a
// frame does not have). Its destination MAC picks where it goes: the port
// whose MAC it is (wire::PortOfMac), or, for broadcast, multicast and MACs
// of no emulated port, the segment group every port with flow rules
// listens to; the kernel loops a group datagram back to the sender's own
// group socket, so QPs on the sending port get it too, as an embedded
// switch delivers between functions of one NIC.
#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "emulator/engine/engine.h"
#include "emulator/engine/internal.h"
#include "emulator/engine/rss.h"
#include "emulator/wire/ethernet.h"

namespace rdmaemu::engine {

Status Engine::RawSegmentFromEnvironment() {
  const char* v = std::getenv("RDMAEMU_RAW_SEGMENT");
  if (v == nullptr || *v == '\0') return Status::Ok();
  in_addr a{};
  if (::inet_pton(AF_INET, v, &a) != 1 || !IN_MULTICAST(ntohl(a.s_addr))) {
    return InvalidArgument(fmt::format("RDMAEMU_RAW_SEGMENT: \"{}\" is not an IPv4 multicast "
                                       "group (224.0.0.0/4)",
                                       v));
  }
  raw_segment_ = ntohl(a.s_addr);
  return Status::Ok();
}

Result<uint64_t> Engine::AddFlow(flow::Rule rule) {
  if (rule.port < 1 || rule.port > endpoints_.size()) return InvalidArgument("no such port");
  std::unique_lock lock(flows_mu_);
  if (flows_.size() >= static_cast<size_t>(device::kMaxFlowRules)) {
    return NoMemory(fmt::format("{} flow rules exist already", flows_.size()));
  }
  const int p = rule.port - 1;
  const bool first = std::none_of(flows_.begin(), flows_.end(),
                                  [&](const flow::Rule& r) { return r.port == rule.port; });
  if (first && !segment_joined_[p]) {
    const Endpoint& at = endpoints_[p];
    auto socket = net::UdpSocket::OpenGroup(in_addr{htonl(raw_segment_)}, at.service_port,
                                            in_addr{htonl(at.ip)});
    if (!socket.ok()) {
      // Frames to the port's own MAC still arrive on its socket: the rule
      // works for them. Flooded ones (broadcast, multicast) will not.
      Log().warn("{} port {}: cannot listen to the raw segment group {}: {}; frames flooded to "
                 "the segment will not reach this port's flow rules",
                 device_->name(), rule.port, net::ToString(in_addr{htonl(raw_segment_)}),
                 socket.status().message());
    } else {
      segment_socket_[p] = loop_->AddGroupSocket(p, std::move(socket).value());
      segment_joined_[p] = true;
    }
  }
  rule.id = next_flow_id_++;
  flows_.push_back(rule);
  Log().debug("{} qp#{}: flow rule {} on port {} (type {}, priority {})", device_->name(), rule.qpn,
              rule.id, rule.port, static_cast<int>(rule.type), rule.priority);
  return rule.id;
}

Status Engine::RemoveFlow(uint64_t id) {
  std::unique_lock lock(flows_mu_);
  if (EraseFlowsLocked([id](const flow::Rule& r) { return r.id == id; }) == 0) {
    return InvalidArgument(fmt::format("no flow rule {}", id));
  }
  return Status::Ok();
}

size_t Engine::EraseFlowsLocked(const std::function<bool(const flow::Rule&)>& drop) {
  const size_t before = flows_.size();
  std::erase_if(flows_, drop);
  for (size_t p = 0; p < endpoints_.size() && p < 2; ++p) {
    const bool any = std::any_of(flows_.begin(), flows_.end(),
                                 [&](const flow::Rule& r) { return r.port == p + 1; });
    if (!any && segment_joined_[p]) {
      loop_->RemoveGroupSocket(segment_socket_[p]);
      segment_joined_[p] = false;
    }
  }
  return before - flows_.size();
}

void Engine::ExecuteRawSend(Qp& qp, const SendWqe& wqe) {
  auto complete = [&](objects::WcStatus status) { CompleteUnackedSend(qp, wqe, status); };
  if (wqe.length < wire::kEthHeaderBytes || wqe.length > wire::kMaxFrameBytes) {
    RDMAEMU_WARN_LIMITED("qp#{} WR {}: a raw frame of {} bytes: an Ethernet frame has {} to {} "
                         "bytes (header, up to 1500 bytes of payload, one VLAN tag): local length "
                         "error",
                         qp.qpn, wqe.wr_id, wqe.length, wire::kEthHeaderBytes, wire::kMaxFrameBytes);
    complete(objects::WcStatus::kLocLenErr);
    return;
  }
  if (auto s = CheckSges(qp, wqe.sges, false); s != objects::WcStatus::kSuccess) {
    complete(s);
    return;
  }
  const uint8_t port = qp.attrs.port >= 1 && qp.attrs.port <= endpoints_.size() ? qp.attrs.port : 1;
  // As a NIC whose link is down: the frame is gone, the send completes.
  if (device_->dead()) {
    Count(&qp, &Counters::dropped_device_dead);
    complete(objects::WcStatus::kSuccess);
    return;
  }
  if (!device_->PortUp(port)) {
    Count(&qp, &Counters::dropped_port_down);
    complete(objects::WcStatus::kSuccess);
    return;
  }
  GatherRange(wqe, 0, wqe.length, scratch_);
  wire::MacAddress dst;
  std::copy_n(scratch_.begin(), dst.size(), dst.begin());
  const uint32_t owner = wire::IsMulticastMac(dst) ? 0 : wire::PortOfMac(dst);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(owner != 0 ? owner : raw_segment_);
  to.sin_port = htons(endpoints_[port - 1].service_port);
  wire::EncapsulateFrame(scratch_, raw_datagram_);
  if (DebugOn()) {
    Log().debug("{} qp#{} WR {} raw frame of {} bytes to {:02x} → {}", device_->name(), qp.qpn,
                wqe.wr_id, wqe.length, fmt::join(dst, ":"),
                owner != 0 ? net::ToString(to) : "the segment");
  }
  CountOnQp(qp, &Counters::packets_sent);
  CountOnQp(qp, &Counters::bytes_sent, raw_datagram_.size());
  SendNow(port, to, raw_datagram_, 0);
  complete(objects::WcStatus::kSuccess);
}

void Engine::ReceiveRawFrame(const net::Datagram& d, uint8_t port) {
  auto frame = wire::DecapsulateFrame(d.data);
  auto fields = frame.ok() ? wire::ParseFrame(*frame) : Result<wire::FrameFields>(frame.status());
  if (!fields.ok()) {
    CountPort(port, &Counters::dropped_malformed);
    RDMAEMU_WARN_LIMITED("{}: dropped a malformed raw frame from {}: {}", device_->name(),
                         net::ToString(d.src), fields.status().message());
    return;
  }
  std::vector<uint32_t>& qpns = raw_targets_;
  {
    std::shared_lock lock(flows_mu_);
    flow::Steer(flows_, port, *fields, qpns);
  }
  if (qpns.empty()) {
    CountPort(port, &Counters::dropped_no_flow);
    return;
  }
  for (uint32_t qpn : qpns) {
    auto qp = FindQp(qpn);
    if (!qp) continue;  // being destroyed: RemoveQp drops its rules
    DeliverRaw(*qp, *frame, *fields, port);
  }
}

void Engine::DeliverRaw(Qp& qp, std::span<const uint8_t> frame, const wire::FrameFields& fields,
                        uint8_t port) {
  std::lock_guard lock(qp.mu);
  if (qp.removed) return;
  CountOnQp(qp, &Counters::packets_received);
  CountOnQp(qp, &Counters::bytes_received, frame.size());
  // A QP with an indirection table is only a steering target (mlx5's TIR):
  // it has no state of its own and receives while its WQs are RDY, on the
  // port its rules name.
  if (qp.rss) {
    DeliverRawRss(qp, frame, fields);
    return;
  }
  const QpState state = qp.attrs.state;
  // The receive side runs from RTR on (as mlx5's RQ, ready at RTR).
  if (port != qp.attrs.port || (state != QpState::kRtr && state != QpState::kRts &&
                                state != QpState::kSqd && state != QpState::kSqe)) {
    Count(&qp, &Counters::dropped_bad_state);
    RDMAEMU_LOG_LIMITED(spdlog::level::debug, "{} qp#{}: dropped a raw frame in state {}",
                        device_->name(), qp.qpn, QpStateName(state));
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
  cqe.opcode = objects::WcOpcode::kRecv;
  // The frame from its first byte, no GRH: byte_len is the frame's length.
  cqe.byte_len = static_cast<uint32_t>(frame.size());
  if (frame.size() > wqe.length) {
    cqe.status = objects::WcStatus::kLocLenErr;
  } else if (auto s = CheckSges(RecvPd(qp), qp.qpn, wqe.sges, true); s != objects::WcStatus::kSuccess) {
    cqe.status = s;
  } else {
    ScatterRange(wqe.sges, 0, frame);
  }
  PushCqe(qp, qp.recv_cq, cqe);
}

void Engine::DeliverRawRss(Qp& qp, std::span<const uint8_t> frame, const wire::FrameFields& f) {
  // Fields the frame lacks hash as zeros. The UDP port fields take the
  // ports of a UDP header only, as mlx5 hashes L4 ports of the protocol
  // the QP selected.
  const bool udp = f.l4_proto == wire::kIpProtoUdp;
  const uint32_t hash = RxHash(qp.rx_hash.key, qp.rx_hash.fields, f.has_ipv4 ? f.ipv4_src : 0,
                               f.has_ipv4 ? f.ipv4_dst : 0, udp ? f.l4_src_port : 0,
                               udp ? f.l4_dst_port : 0);
  const auto& entries = qp.rss->entries;
  Wq& wq = *entries[hash & (entries.size() - 1)];
  std::lock_guard lock(wq.mu);
  if (wq.state != WqState::kRdy) {
    Count(&qp, &Counters::dropped_bad_state);
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
  cqe.qp_num = wq.wqn;  // as mlx5: the RQ that held the WQE
  cqe.opcode = objects::WcOpcode::kRecv;
  cqe.byte_len = static_cast<uint32_t>(frame.size());
  if (frame.size() > wqe.length) {
    cqe.status = objects::WcStatus::kLocLenErr;
  } else if (auto s = CheckSges(wq.pd, wq.wqn, wqe.sges, true); s != objects::WcStatus::kSuccess) {
    cqe.status = s;
  } else {
    ScatterRange(wqe.sges, 0, frame);
  }
  PushWqCqe(wq, cqe);
}

}  // namespace rdmaemu::engine
