#include "emulator/engine/engine.h"

#include <arpa/inet.h>
#include <sys/uio.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "emulator/base/endian.h"
#include "emulator/base/log.h"
#include "emulator/objects/mr.h"
#include "emulator/wire/icrc.h"
#include "emulator/wire/psn.h"

namespace rdmaemu::engine {
namespace {

constexpr size_t kGrhBytes = 40;

Result<net::Backend> BackendFromEnvironment() {
  const char* v = std::getenv("RDMAEMU_ENGINE");
  if (v == nullptr || *v == '\0') return net::Backend::kAuto;
  auto b = net::ParseBackend(v);
  if (!b.ok()) return InvalidArgument(fmt::format("RDMAEMU_ENGINE: {}", b.status().message()));
  return b;
}

// The 40-byte GRH area of a UD receive holds the network header: for IPv4,
// 20 zero bytes and then the IPv4 header (as Linux's soft-RoCE writes it).
void WriteGrh(uint8_t* grh, uint32_t src_ip, uint32_t dst_ip, size_t udp_payload) {
  std::memset(grh, 0, kGrhBytes);
  uint8_t* ip = grh + 20;
  ip[0] = 0x45;
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

}  // namespace

Engine::Engine(std::shared_ptr<device::Device> device) : device_(std::move(device)) {}

Engine::~Engine() {
  if (loop_) loop_->Stop();
}

Result<std::shared_ptr<Engine>> Engine::Start(std::shared_ptr<device::Device> device) {
  auto backend = BackendFromEnvironment();
  if (!backend.ok()) return backend.status();
  auto socket = device->TakeSocket(1);
  if (!socket.ok()) return socket.status();
  std::shared_ptr<Engine> engine(new Engine(std::move(device)));
  engine->local_ip_ = ntohl(socket->address().sin_addr.s_addr);
  engine->udp_port_ = ntohs(socket->address().sin_port);
  auto loop = net::Loop::Create(*backend, std::move(socket).value(), engine.get());
  if (!loop.ok()) return loop.status();
  engine->loop_ = std::move(loop).value();
  engine->loop_->Start();
  Log().info("{}: engine running on {} ({})", engine->device_->name(),
             net::ToString(engine->loop_->address()), net::ToString(engine->loop_->backend()));
  return engine;
}

Result<uint32_t> Engine::AllocateQpn() {
  std::unique_lock lock(qps_mu_);
  for (int tries = 0; tries < (1 << 24); ++tries) {
    uint32_t qpn = next_qpn_;
    next_qpn_ = next_qpn_ >= 0xffffff ? 0x11 : next_qpn_ + 1;
    if (!qps_.contains(qpn)) return qpn;
  }
  return NoMemory("no free QP number");
}

void Engine::AddQp(std::shared_ptr<Qp> qp) {
  std::unique_lock lock(qps_mu_);
  uint32_t qpn = qp->qpn;
  qps_[qpn] = std::move(qp);
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
  // The loop thread may be inside a handler holding its own reference; taking
  // the QP's lock once after unpublishing orders us after any such use.
  std::lock_guard lock(qp->mu);
}

std::shared_ptr<Qp> Engine::FindQp(uint32_t qpn) {
  std::shared_lock lock(qps_mu_);
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second;
}

void Engine::Doorbell(uint32_t qpn) {
  {
    std::lock_guard lock(pending_mu_);
    pending_.push_back(qpn);
  }
  loop_->Ring();
}

std::optional<std::chrono::steady_clock::time_point> Engine::OnWork(
    std::chrono::steady_clock::time_point) {
  std::vector<uint32_t> rung;
  {
    std::lock_guard lock(pending_mu_);
    rung.swap(pending_);
  }
  for (uint32_t qpn : rung) {
    if (auto qp = FindQp(qpn)) ExecuteSends(*qp);
  }
  return std::nullopt;
}

void Engine::ExecuteSends(Qp& qp) {
  for (;;) {
    SendWqe wqe;
    {
      std::lock_guard lock(qp.mu);
      if (qp.sq.empty()) return;
      if (qp.attrs.state != QpState::kRts) {
        if (qp.attrs.state == QpState::kErr) {
          // Flushed by the provider on the move to ERR.
        }
        return;
      }
      wqe = std::move(qp.sq.front());
      qp.sq.pop_front();
    }
    if (qp.type == QpType::kUd) {
      ExecuteUdSend(qp, wqe);
    } else {
      RDMAEMU_WARN_LIMITED("qp#{}: RC/UC transport is not implemented yet; WR {} completes with an error",
                           qp.qpn, wqe.wr_id);
      CompleteSend(qp, wqe, objects::WcStatus::kLocQpOpErr);
    }
  }
}

objects::WcStatus Engine::Gather(const Qp& qp, const SendWqe& wqe, std::vector<uint8_t>& out) {
  out.clear();
  if (wqe.is_inline) {
    out = wqe.inline_data;
    return objects::WcStatus::kSuccess;
  }
  for (const Sge& sge : wqe.sges) {
    if (sge.length == 0) continue;
    auto mr = device_->mrs().FindByLkey(sge.lkey);
    if (!mr || mr->pd != qp.pd || !mr->Contains(sge.addr, sge.length)) {
      RDMAEMU_WARN_LIMITED("qp#{} WR {}: SGE [{:#x}, +{}) lkey {:#x} is not inside a memory region "
                           "of the QP's PD: local protection error",
                           qp.qpn, wqe.wr_id, sge.addr, sge.length, sge.lkey);
      return objects::WcStatus::kLocProtErr;
    }
    const uint8_t* src = mr->HostAddress(sge.addr);
    out.insert(out.end(), src, src + sge.length);
  }
  return objects::WcStatus::kSuccess;
}

void Engine::CompleteSend(Qp& qp, const SendWqe& wqe, objects::WcStatus status) {
  {
    std::lock_guard lock(qp.mu);
    if (qp.sq_outstanding > 0) --qp.sq_outstanding;
  }
  if (!wqe.signaled && status == objects::WcStatus::kSuccess) return;
  objects::Cqe cqe;
  cqe.wr_id = wqe.wr_id;
  cqe.status = status;
  cqe.opcode = objects::WcOpcode::kSend;
  cqe.qp_num = qp.qpn;
  cqe.byte_len = static_cast<uint32_t>(wqe.length);
  cqe.timestamp_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch()).count());
  if (!qp.send_cq->Push(cqe)) {
    RDMAEMU_WARN_LIMITED("qp#{}: send CQ overrun: completion of WR {} lost", qp.qpn, wqe.wr_id);
  }
}

void Engine::ExecuteUdSend(Qp& qp, const SendWqe& wqe) {
  uint32_t mtu;
  uint32_t qkey;
  uint32_t psn;
  {
    std::lock_guard lock(qp.mu);
    mtu = device_->QueryPort(qp.attrs.port).active_mtu;
    qkey = qp.attrs.qkey;
    psn = qp.next_send_psn;
    qp.next_send_psn = wire::PsnAdd(psn, 1);
  }
  if (wqe.length > mtu) {
    RDMAEMU_WARN_LIMITED("qp#{} WR {}: UD message of {} bytes exceeds the port MTU {}: local length error",
                         qp.qpn, wqe.wr_id, wqe.length, mtu);
    CompleteSend(qp, wqe, objects::WcStatus::kLocLenErr);
    return;
  }
  if (auto status = Gather(qp, wqe, scratch_); status != objects::WcStatus::kSuccess) {
    CompleteSend(qp, wqe, status);
    return;
  }
  wire::PacketFields f;
  f.opcode = wqe.op == SendOp::kSendWithImm ? wire::Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                                            : wire::Opcode::UD_SEND_ONLY;
  f.bth.solicited = wqe.solicited;
  f.bth.dest_qpn = wqe.ud.remote_qpn;
  f.bth.psn = psn;
  // A Q_Key with the high bit set means "use the QP's own" (IBA 10.2.4.3).
  f.deth.qkey = (wqe.ud.remote_qkey & 0x80000000u) ? qkey : wqe.ud.remote_qkey;
  f.deth.src_qpn = qp.qpn;
  f.imm = ntohl(wqe.imm_data);
  packet_.resize(wire::kMaxPacketBytes);
  wire::IcrcAddressing addr{local_ip_, ntohl(wqe.ud.dst_ip), udp_port_, udp_port_};
  auto len = wire::BuildPacket(f, std::span<const uint8_t>(scratch_), packet_, &addr);
  if (!len.ok()) {
    RDMAEMU_WARN_LIMITED("qp#{} WR {}: {}", qp.qpn, wqe.wr_id, len.status().message());
    CompleteSend(qp, wqe, objects::WcStatus::kLocQpOpErr);
    return;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = wqe.ud.dst_ip;
  to.sin_port = htons(udp_port_);
  iovec iov{packet_.data(), *len};
  loop_->Send(to, std::span<const iovec>(&iov, 1));
  counters_.packets_sent.fetch_add(1, std::memory_order_relaxed);
  CompleteSend(qp, wqe, objects::WcStatus::kSuccess);
}

void Engine::OnDatagrams(std::span<const net::Datagram> batch) {
  for (const net::Datagram& d : batch) {
    counters_.packets_received.fetch_add(1, std::memory_order_relaxed);
    auto packet = wire::ParsePacket(d.data);
    if (!packet.ok()) {
      counters_.dropped_malformed.fetch_add(1, std::memory_order_relaxed);
      RDMAEMU_WARN_LIMITED("dropped a malformed packet from {}: {}", net::ToString(d.src),
                           packet.status().message());
      continue;
    }
    wire::IcrcAddressing addr{ntohl(d.src.sin_addr.s_addr), ntohl(d.dst.s_addr),
                              ntohs(d.src.sin_port), udp_port_};
    if (Status s = wire::CheckIcrc(addr, d.data); !s.ok()) {
      counters_.dropped_icrc.fetch_add(1, std::memory_order_relaxed);
      Log().debug("dropped a packet from {}: {}", net::ToString(d.src), s.message());
      continue;
    }
    if (packet->bth().pkey() != wire::kDefaultPkey) {
      counters_.dropped_pkey.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    auto qp = FindQp(packet->dest_qpn());
    if (!qp) {
      counters_.dropped_unknown_qpn.fetch_add(1, std::memory_order_relaxed);
      Log().debug("dropped a packet for unknown qp#{} from {}", packet->dest_qpn(),
                  net::ToString(d.src));
      continue;
    }
    if (packet->info().transport == wire::Transport::kUd && qp->type == QpType::kUd) {
      ReceiveUd(*qp, *packet, d);
    } else {
      counters_.dropped_bad_state.fetch_add(1, std::memory_order_relaxed);
      RDMAEMU_WARN_LIMITED("qp#{}: dropped a {} packet: RC/UC transport is not implemented yet",
                           qp->qpn, packet->info().name);
    }
  }
}

void Engine::ReceiveUd(Qp& qp, const wire::PacketView& packet, const net::Datagram& d) {
  RecvWqe wqe;
  {
    std::lock_guard lock(qp.mu);
    QpState state = qp.attrs.state;
    if (state != QpState::kRtr && state != QpState::kRts && state != QpState::kSqd) {
      counters_.dropped_bad_state.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (packet.deth().qkey() != qp.attrs.qkey) {
      counters_.dropped_qkey.fetch_add(1, std::memory_order_relaxed);
      Log().debug("qp#{}: dropped a UD packet with Q_Key {:#x} (QP's is {:#x})", qp.qpn,
                  packet.deth().qkey(), qp.attrs.qkey);
      return;
    }
    if (qp.rq.empty()) {
      counters_.dropped_no_receive.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    wqe = std::move(qp.rq.front());
    qp.rq.pop_front();
  }
  objects::Cqe cqe;
  cqe.wr_id = wqe.wr_id;
  cqe.opcode = objects::WcOpcode::kRecv;
  cqe.qp_num = qp.qpn;
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
  } else {
    uint8_t grh[kGrhBytes];
    WriteGrh(grh, ntohl(d.src.sin_addr.s_addr), ntohl(d.dst.s_addr), d.data.size());
    size_t done = 0;
    for (const Sge& sge : wqe.sges) {
      if (done == total) break;
      size_t n = std::min<size_t>(sge.length, total - done);
      auto mr = device_->mrs().FindByLkey(sge.lkey);
      if (!mr || mr->pd != qp.pd || !(mr->access & objects::kLocalWrite) ||
          !mr->Contains(sge.addr, n)) {
        cqe.status = objects::WcStatus::kLocProtErr;
        break;
      }
      uint8_t* dst = mr->HostAddress(sge.addr);
      for (size_t i = 0; i < n; ++i) {
        size_t at = done + i;
        dst[i] = at < kGrhBytes ? grh[at] : payload[at - kGrhBytes];
      }
      done += n;
    }
  }
  cqe.timestamp_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch()).count());
  if (!qp.recv_cq->Push(cqe)) {
    RDMAEMU_WARN_LIMITED("qp#{}: receive CQ overrun: completion of WR {} lost", qp.qpn, wqe.wr_id);
  }
}

Result<std::shared_ptr<Engine>> AcquireEngine(int device_index) {
  static std::mutex mu;
  static std::unordered_map<int, std::weak_ptr<Engine>> engines;
  std::lock_guard lock(mu);
  if (auto e = engines[device_index].lock()) return e;
  auto device = device::Registry::Get().Acquire(device_index);
  if (!device.ok()) return device.status();
  auto engine = Engine::Start(std::move(device).value());
  if (!engine.ok()) return engine.status();
  engines[device_index] = *engine;
  return engine;
}

}  // namespace rdmaemu::engine
