#include "tests/emulator/engine/fake_peer.h"

#include <arpa/inet.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "emulator/wire/icrc.h"

namespace rdmaemu::testing {

uint16_t EmulatorUdpPort() {
  const char* v = std::getenv("RDMAEMU_UDP_PORT");
  if (v == nullptr || *v == '\0') return wire::kRoceUdpPort;
  return static_cast<uint16_t>(std::atoi(v));
}

uint32_t PeerIpOfThisProcess() {
  // pid_max is at most 2^22, so the addresses stay below 127.192.0.0.
  return 0x7f400000u + 2u * static_cast<uint32_t>(getpid());
}

FakePeer::FakePeer(uint32_t emu_ip, uint16_t port, uint32_t ip)
    : ip_(ip), emu_ip_(emu_ip), port_(port) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  // No SO_REUSEADDR: a second socket on the same address must fail to bind,
  // not share (and steal) its datagrams.
  int big = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ip);
  a.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return;
  }
  fd_ = fd;
}

FakePeer::~FakePeer() {
  if (fd_ >= 0) close(fd_);
}

std::vector<uint8_t> FakePeer::Build(const wire::PacketFields& fields,
                                     std::span<const uint8_t> payload) const {
  std::vector<uint8_t> out(wire::kMaxPacketBytes);
  wire::IcrcAddressing addr{ip_, emu_ip_, port_, port_};
  auto len = wire::BuildPacket(fields, payload, out, &addr);
  if (!len.ok()) return {};
  out.resize(*len);
  return out;
}

void FakePeer::FixIcrc(std::span<uint8_t> packet) const {
  wire::IcrcAddressing addr{ip_, emu_ip_, port_, port_};
  wire::WriteIcrc(addr, packet);
}

std::vector<uint8_t> FakePeer::Send(const wire::PacketFields& fields,
                                    std::span<const uint8_t> payload) {
  std::vector<uint8_t> bytes = Build(fields, payload);
  SendRaw(bytes);
  return bytes;
}

void FakePeer::SendRaw(std::span<const uint8_t> bytes) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(emu_ip_);
  to.sin_port = htons(port_);
  (void)sendto(fd_, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
}

bool FakePeer::SendTogether(std::span<const std::vector<uint8_t>> packets) {
  if (packets.empty()) return false;
  std::vector<uint8_t> all;
  for (const auto& p : packets) all.insert(all.end(), p.begin(), p.end());
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(emu_ip_);
  to.sin_port = htons(port_);
  iovec iov{all.data(), all.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(uint16_t))] = {};
  msghdr m{};
  m.msg_name = &to;
  m.msg_namelen = sizeof to;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  const auto segment = static_cast<uint16_t>(packets.front().size());
  std::memcpy(CMSG_DATA(c), &segment, sizeof segment);
  return sendmsg(fd_, &m, 0) == static_cast<ssize_t>(all.size());
}

std::optional<RxPacket> FakePeer::Receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<uint8_t> buf(65536);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return std::nullopt;
      return std::nullopt;
    }
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(fd_, buf.data(), buf.size(), MSG_DONTWAIT,
                         reinterpret_cast<sockaddr*>(&from), &fl);
    if (n < 0) continue;
    // Only what the emulator sent to us.
    if (ntohl(from.sin_addr.s_addr) != emu_ip_) continue;
    RxPacket rx;
    rx.bytes.assign(buf.begin(), buf.begin() + n);
    auto parsed = wire::ParsePacket(rx.bytes);
    if (!parsed.ok()) return rx;
    const wire::PacketView& v = *parsed;
    wire::IcrcAddressing addr{emu_ip_, ip_, ntohs(from.sin_port), port_};
    rx.icrc_ok = wire::CheckIcrc(addr, rx.bytes).ok();
    rx.opcode = v.opcode();
    rx.psn = v.psn();
    rx.dest_qpn = v.dest_qpn();
    rx.ack_req = v.bth().ack_req();
    rx.pkey = v.bth().pkey();
    if (v.Has(wire::kAethMask)) {
      rx.has_aeth = true;
      rx.syndrome = v.aeth().syndrome();
      rx.msn = v.aeth().msn();
    }
    if (v.Has(wire::kRethMask)) {
      rx.has_reth = true;
      rx.reth_va = v.reth().va();
      rx.reth_rkey = v.reth().rkey();
      rx.reth_length = v.reth().dma_length();
    }
    if (v.Has(wire::kAtomicAckEthMask)) {
      rx.has_atomic_ack = true;
      rx.orig_data = v.atomic_ack_eth().orig_data();
    }
    rx.payload.assign(v.payload().begin(), v.payload().end());
    return rx;
  }
}

std::vector<RxPacket> FakePeer::ReceiveAll(std::chrono::milliseconds window) {
  std::vector<RxPacket> out;
  const auto deadline = std::chrono::steady_clock::now() + window;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    auto p = Receive(left);
    if (!p) break;
    out.push_back(std::move(*p));
  }
  return out;
}

void FakePeer::Drain() {
  while (Receive(0ms)) {
  }
}

wire::PacketFields FakePeer::Request(wire::Opcode op, uint32_t dest_qpn, uint32_t psn,
                                     bool ack_req) {
  wire::PacketFields f;
  f.opcode = op;
  f.bth.dest_qpn = dest_qpn;
  f.bth.psn = psn;
  f.bth.ack_req = ack_req;
  return f;
}

wire::PacketFields FakePeer::Ack(uint32_t dest_qpn, uint32_t psn, uint8_t syndrome,
                                 uint32_t msn) {
  wire::PacketFields f;
  f.opcode = wire::Opcode::RC_ACKNOWLEDGE;
  f.bth.dest_qpn = dest_qpn;
  f.bth.psn = psn;
  f.aeth.syndrome = syndrome;
  f.aeth.msn = msn;
  return f;
}

// ---------------------------------------------------------------- EmuRc

EmuRc::EmuRc(bool with_channel) {
  int n = 0;
  list_ = ibv_get_device_list(&n);
  if (list_ == nullptr || n < 1) return;
  ctx_ = ibv_open_device(list_[0]);
  if (ctx_ == nullptr) return;
  ibv_gid gid;
  if (ibv_query_gid(ctx_, 1, 0, &gid) != 0) return;
  std::memcpy(&ip_, gid.raw + 12, 4);
  ip_ = ntohl(ip_);
  port_ = EmulatorUdpPort();
  pd_ = ibv_alloc_pd(ctx_);
  if (pd_ == nullptr) return;
  if (with_channel && (channel_ = ibv_create_comp_channel(ctx_)) == nullptr) return;
  cq_ = ibv_create_cq(ctx_, 256, nullptr, channel_, 0);
}

EmuRc::~EmuRc() {
  for (ibv_qp* qp : qps_) ibv_destroy_qp(qp);
  for (auto& b : buffers_) {
    if (b->mr) ibv_dereg_mr(b->mr);
  }
  if (cq_) ibv_destroy_cq(cq_);
  if (channel_) ibv_destroy_comp_channel(channel_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  if (list_) ibv_free_device_list(list_);
}

EmuRc::Buffer* EmuRc::Register(size_t bytes, int access, uint8_t fill) {
  auto b = std::make_unique<Buffer>();
  b->data.assign(bytes, fill);
  b->mr = ibv_reg_mr(pd_, b->data.data(), b->data.size(), access);
  if (b->mr == nullptr) return nullptr;
  buffers_.push_back(std::move(b));
  return buffers_.back().get();
}

ibv_qp* EmuRc::CreateQp(uint32_t wr) {
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = wr;
  attr.cap.max_recv_wr = wr;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd_, &attr);
  if (qp) qps_.push_back(qp);
  return qp;
}

int EmuRc::ToInit(ibv_qp* qp, const RcParams& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.pkey_index = 0;
  a.qp_access_flags = p.access;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int EmuRc::ToRtr(ibv_qp* qp, const RcParams& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p.mtu;
  a.dest_qp_num = p.dest_qpn;
  a.rq_psn = p.rq_psn;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = p.min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
  uint32_t be = htonl(p.peer_ip);
  std::memcpy(a.ah_attr.grh.dgid.raw + 12, &be, 4);
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int EmuRc::ToRts(ibv_qp* qp, const RcParams& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.sq_psn;
  a.timeout = p.timeout;
  a.retry_cnt = p.retry_cnt;
  a.rnr_retry = p.rnr_retry;
  a.max_rd_atomic = p.max_rd_atomic;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

ibv_qp* EmuRc::ConnectedQp(const RcParams& p) {
  ibv_qp* qp = CreateQp();
  if (qp == nullptr) return nullptr;
  if (ToInit(qp, p) != 0 || ToRtr(qp, p) != 0 || ToRts(qp, p) != 0) return nullptr;
  return qp;
}

std::pair<ibv_qp*, ibv_qp*> EmuRc::ConnectedPair(RcParams p, uint32_t wr) {
  ibv_qp* a = CreateQp(wr);
  ibv_qp* b = CreateQp(wr);
  if (a == nullptr || b == nullptr) return {nullptr, nullptr};
  p.peer_ip = ip_;
  RcParams pa = p, pb = p;
  pa.dest_qpn = b->qp_num;
  pb.dest_qpn = a->qp_num;
  pa.sq_psn = pb.rq_psn = 1000;
  pb.sq_psn = pa.rq_psn = 2000;
  for (auto [qp, params] : {std::pair{a, pa}, std::pair{b, pb}}) {
    if (ToInit(qp, params) != 0 || ToRtr(qp, params) != 0 || ToRts(qp, params) != 0) {
      return {nullptr, nullptr};
    }
  }
  return {a, b};
}

int EmuRc::PostRecv(ibv_qp* qp, uint64_t wr_id, const Buffer& b, size_t offset, size_t length) {
  ibv_sge sge{b.addr() + offset, static_cast<uint32_t>(length), b.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

int EmuRc::PostSend(ibv_qp* qp, uint64_t wr_id, ibv_wr_opcode op, const Buffer& b, size_t offset,
                    size_t length, uint64_t remote_addr, uint32_t rkey) {
  ibv_sge sge{b.addr() + offset, static_cast<uint32_t>(length), b.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

ibv_qp_state EmuRc::State(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init) != 0) return static_cast<ibv_qp_state>(-1);
  return a.qp_state;
}

std::optional<ibv_wc> EmuRc::Poll(std::chrono::milliseconds timeout, bool spin) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n == 1) return wc;
    if (n < 0) return std::nullopt;
    if (!spin) usleep(200);
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

std::vector<ibv_wc> EmuRc::PollAll(std::chrono::milliseconds window) {
  std::vector<ibv_wc> out;
  const auto deadline = std::chrono::steady_clock::now() + window;
  while (std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc{};
    if (ibv_poll_cq(cq_, 1, &wc) == 1) {
      out.push_back(wc);
    } else {
      usleep(200);
    }
  }
  return out;
}

}  // namespace rdmaemu::testing
