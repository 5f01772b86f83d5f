// RC soak: the client drives every message of the plan at the server over
// one RC QP pair, `depth` work requests outstanding at once:
//   SEND / SEND_WITH_IMM      into the server's posted receives
//   RDMA_WRITE(_WITH_IMM)     into the server's write area (a slot per message)
//   RDMA_READ                 from the server's read region
//   FETCH_ADD / CMP_SWP       on the server's atomic words
// The server checks every receive (order, length, immediate, bytes) as it
// completes; at the end of each batch (a SEND_WITH_IMM) it checks the
// batch's write slots and grants the client a credit (a SEND_WITH_IMM back),
// which lets the client reuse those slots two batches later. The client
// checks every completion (order, status, opcode), every READ's bytes and
// every atomic's returned value against the plan's model.
#include <arpa/inet.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "tests/e2e/soak/modes.h"
#include "tests/e2e/soak/rdma.h"
#include "tests/e2e/soak/stats.h"

namespace soak {
namespace {

constexpr uint32_t kCreditRecvs = 8;
constexpr uint32_t kCreditBytes = 8;
constexpr uint32_t kServerRecvs = 256;
// Credits the server may have unacknowledged (lost ACKs delay their completions).
constexpr uint32_t kServerCredits = 64;
// Slack after each READ destination that must stay untouched.
constexpr uint32_t kGuard = 64;

// The tail the client sends after its last completion, and the answer.
struct Done {
  uint64_t messages = 0;
  uint64_t bytes = 0;
};
struct Verdict {
  uint64_t receives = 0;        // receive completions checked
  uint64_t writes = 0;          // write slots checked
  uint64_t atomics_ok = 0;      // 1 if the atomic words hold the model's final values
  uint64_t read_region_ok = 0;  // 1 if no READ altered the read region
};

std::string Describe(const Message& m) {
  return fmt::format("message {} ({}, {} bytes)", m.index, KindName(m.kind), m.size);
}

ibv_wc_opcode SendCompletionOpcode(Kind k) {
  switch (k) {
    case Kind::kSend: case Kind::kSendImm: return IBV_WC_SEND;
    case Kind::kWrite: case Kind::kWriteImm: return IBV_WC_RDMA_WRITE;
    case Kind::kRead: return IBV_WC_RDMA_READ;
    case Kind::kFetchAdd: return IBV_WC_FETCH_ADD;
    case Kind::kCompareSwap: return IBV_WC_COMP_SWAP;
  }
  return IBV_WC_SEND;
}

// Page-aligned, poisoned memory the size of `len`.
std::vector<uint8_t> PoisonedBuffer(size_t len) { return std::vector<uint8_t>(len, kPoison); }

// ---------------------------------------------------------------- client

class Client {
 public:
  Client(const Options& o, Channel& ctl) : o_(o), ctl_(ctl) {}
  int Run();

 private:
  bool MayPost(uint32_t i) const;
  void PostChain();
  void Prepare(const Message& m, ibv_send_wr& wr, ibv_sge* sges);
  void OnCompletion(const ibv_wc& wc);
  void OnCredit(const ibv_wc& wc);
  uint8_t* Slot(uint32_t i) { return slots_.data() + uint64_t{i % plan_->params().depth} * slot_bytes_; }

  const Options& o_;
  Channel& ctl_;
  std::unique_ptr<Plan> plan_;
  Verbs v_;
  ibv_qp* qp_ = nullptr;
  Endpoint server_;
  std::vector<uint8_t> slots_, credits_;
  ibv_mr* slots_mr_ = nullptr;
  ibv_mr* credits_mr_ = nullptr;
  uint64_t slot_bytes_ = 0;
  uint32_t next_post_ = 0, next_complete_ = 0;
  int64_t credited_ = -1;  // the last batch the server has checked
  bool flipped_ = false;   // --flip-byte has altered its byte
};

bool Client::MayPost(uint32_t i) const {
  const Params& p = plan_->params();
  if (i >= p.messages || i - next_complete_ >= p.depth) return false;
  const int64_t b = plan_->BatchOf(i);
  return b < 2 || credited_ >= b - 2;
}

void Client::Prepare(const Message& m, ibv_send_wr& wr, ibv_sge* sges) {
  uint8_t* buf = Slot(m.index);
  wr = {};
  wr.wr_id = m.index;
  wr.sg_list = sges;
  wr.send_flags = IBV_SEND_SIGNALED;
  switch (m.kind) {
    case Kind::kSend: wr.opcode = IBV_WR_SEND; break;
    case Kind::kSendImm: wr.opcode = IBV_WR_SEND_WITH_IMM; break;
    case Kind::kWrite: wr.opcode = IBV_WR_RDMA_WRITE; break;
    case Kind::kWriteImm: wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
    case Kind::kRead: wr.opcode = IBV_WR_RDMA_READ; break;
    case Kind::kFetchAdd: wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD; break;
    case Kind::kCompareSwap: wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP; break;
  }
  if (HasImm(m.kind)) wr.imm_data = htonl(m.index);
  if (IsAtomic(m.kind)) {
    std::memset(buf, kPoison, 8);
    sges[0] = {reinterpret_cast<uintptr_t>(buf), 8, slots_mr_->lkey};
    wr.num_sge = 1;
    wr.wr.atomic.remote_addr = server_.atomic_addr + uint64_t{8} * m.atomic_slot;
    wr.wr.atomic.rkey = server_.atomic_rkey;
    wr.wr.atomic.compare_add = m.compare_add;
    wr.wr.atomic.swap = m.swap;
    return;
  }
  if (m.kind == Kind::kRead) {
    std::memset(buf, kPoison, m.size + kGuard);
    wr.wr.rdma.remote_addr = server_.read_addr + m.remote_offset;
    wr.wr.rdma.rkey = server_.read_rkey;
  } else {
    FillPayload(plan_->params().seed, m.index, buf, m.size);
    if (!flipped_ && m.index >= o_.flip_byte_at && m.size > 0) {
      buf[m.size / 2] ^= 0x40;
      fmt::print(stderr, "soak[client]: self-test: altered byte {} of {}\n", m.size / 2, Describe(m));
      flipped_ = true;
    }
    if (IsWrite(m.kind)) {
      wr.wr.rdma.remote_addr = server_.write_addr + m.remote_offset;
      wr.wr.rdma.rkey = server_.write_rkey;
    }
    if (m.inline_data) wr.send_flags |= IBV_SEND_INLINE;
  }
  // The payload split over 1..3 SGEs at fixed fractions of its length.
  uint32_t from = 0;
  for (uint32_t k = 0; k < m.sges; ++k) {
    const uint32_t to = static_cast<uint32_t>(uint64_t{m.size} * (k + 1) / m.sges);
    sges[k] = {reinterpret_cast<uintptr_t>(buf + from), to - from, slots_mr_->lkey};
    from = to;
  }
  wr.num_sge = m.sges;
}

void Client::PostChain() {
  const uint32_t depth = plan_->params().depth;
  std::vector<ibv_send_wr> wrs(depth);
  std::vector<ibv_sge> sges(3 * depth);
  uint32_t n = 0;
  while (MayPost(next_post_ + n)) {
    Prepare((*plan_)[next_post_ + n], wrs[n], &sges[3 * n]);
    if (n > 0) wrs[n - 1].next = &wrs[n];
    ++n;
  }
  if (n == 0) return;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(qp_, wrs.data(), &bad); e != 0) {
    Die(fmt::format("ibv_post_send of messages {}..{} failed at message {}: {}", next_post_,
                    next_post_ + n - 1, bad ? bad->wr_id : 0, std::strerror(e)));
  }
  next_post_ += n;
}

void Client::OnCredit(const ibv_wc& wc) {
  const uint32_t k = static_cast<uint32_t>(wc.wr_id);
  uint8_t* buf = credits_.data() + uint64_t{k} * kCreditBytes;
  const int64_t want = credited_ + 1;
  uint64_t got = 0;
  std::memcpy(&got, buf, sizeof got);
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != kCreditBytes ||
      !(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != want || got != static_cast<uint64_t>(want)) {
    Mismatch(fmt::format("credit for batch {}: status {} opcode {} byte_len {} imm {} payload {}", want,
                         ibv_wc_status_str(wc.status), static_cast<int>(wc.opcode), wc.byte_len,
                         ntohl(wc.imm_data), got));
  }
  credited_ = want;
  std::memset(buf, kPoison, kCreditBytes);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), kCreditBytes, credits_mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = k;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(qp_, &wr, &bad); e != 0) Die(fmt::format("ibv_post_recv: {}", std::strerror(e)));
}

void Client::OnCompletion(const ibv_wc& wc) {
  if (wc.opcode & IBV_WC_RECV) return OnCredit(wc);
  if (next_complete_ >= next_post_) {
    Mismatch(fmt::format("a send completion for wr_id {} with none outstanding", wc.wr_id));
  }
  const Message& m = (*plan_)[next_complete_];
  if (wc.wr_id != m.index) {
    Mismatch(fmt::format("{}: expected its completion next, got wr_id {} (status {}): out of order",
                         Describe(m), wc.wr_id, ibv_wc_status_str(wc.status)));
  }
  if (wc.status != IBV_WC_SUCCESS) {
    Mismatch(fmt::format("{}: completed with status {} (vendor_err {})", Describe(m),
                         ibv_wc_status_str(wc.status), wc.vendor_err));
  }
  if (wc.opcode != SendCompletionOpcode(m.kind)) {
    Mismatch(fmt::format("{}: completed with opcode {}", Describe(m), static_cast<int>(wc.opcode)));
  }
  const uint8_t* buf = Slot(m.index);
  std::string why;
  if (m.kind == Kind::kRead) {
    if (!CheckPayload(plan_->params().seed, kReadRegion, m.remote_offset, buf, m.size, &why)) {
      Mismatch(fmt::format("{} from read-region offset {}: {}", Describe(m), m.remote_offset, why));
    }
    if (!CheckPoison(buf + m.size, kGuard, &why)) {
      Mismatch(fmt::format("{}: wrote past its end: {}", Describe(m), why));
    }
  } else if (IsAtomic(m.kind)) {
    uint64_t got;
    std::memcpy(&got, buf, 8);
    if (got != m.expected_old) {
      Mismatch(fmt::format("{} on word {}: returned {:#018x}, the model says {:#018x} "
                           "(executed twice, lost or out of order)",
                           Describe(m), m.atomic_slot, got, m.expected_old));
    }
  }
  ++next_complete_;
  SetProgress(next_complete_, plan_->params().messages);
}

int Client::Run() {
  Params p = o_.params;
  v_ = OpenVerbs(o_, static_cast<int>(p.depth + kCreditRecvs + 16));
  if (MtuBytes(static_cast<ibv_mtu>(v_.port.active_mtu)) < p.mtu) {
    Die(fmt::format("--mtu {} exceeds the port's active MTU {}", p.mtu, MtuName(v_.port.active_mtu)));
  }
  plan_ = std::make_unique<Plan>(p);
  slot_bytes_ = (uint64_t{p.max_size} + kGuard + 63) / 64 * 64;
  slots_ = PoisonedBuffer(slot_bytes_ * p.depth);
  credits_ = PoisonedBuffer(uint64_t{kCreditRecvs} * kCreditBytes);
  slots_mr_ = Register(v_, slots_.data(), slots_.size(), IBV_ACCESS_LOCAL_WRITE);
  credits_mr_ = Register(v_, credits_.data(), credits_.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_qp_cap cap{};
  cap.max_send_wr = p.depth;
  cap.max_recv_wr = kCreditRecvs;
  cap.max_send_sge = 3;
  cap.max_recv_sge = 1;
  cap.max_inline_data = 64;
  qp_ = CreateQp(v_, IBV_QPT_RC, cap);
  const uint32_t psn = static_cast<uint32_t>(Mix(p.seed ^ 0xC11E47) & 0xffffff);
  ctl_.Send(p);
  ctl_.Send(LocalEndpoint(v_, qp_, psn));
  ctl_.Recv(&server_);
  RcPath path;
  path.mtu = static_cast<ibv_mtu>(__builtin_ctz(p.mtu / 128));
  path.timeout = o_.qp_timeout;
  ConnectRc(v_, qp_, psn, server_, path);
  for (uint32_t k = 0; k < kCreditRecvs; ++k) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(credits_.data() + k * kCreditBytes), kCreditBytes,
                credits_mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = k;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int e = ibv_post_recv(qp_, &wr, &bad); e != 0) Die(fmt::format("ibv_post_recv: {}", std::strerror(e)));
  }

  uint8_t go = 0;
  ctl_.Recv(&go);  // the server is in RTS with its receives posted

  const auto start = std::chrono::steady_clock::now();
  std::vector<ibv_wc> wc(p.depth + kCreditRecvs);
  const int64_t last_batch = plan_->Batches() - 1;
  while (next_complete_ < p.messages || credited_ < last_batch) {
    PostChain();
    const int n = WaitCompletions(v_, wc.data(), static_cast<int>(wc.size()), ctl_);
    for (int k = 0; k < n; ++k) OnCompletion(wc[k]);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  ctl_.Send(Done{p.messages, plan_->total_bytes()});
  Verdict verdict;
  ctl_.Recv(&verdict);
  if (!verdict.atomics_ok) Mismatch("the server's atomic words do not hold the model's final values");
  if (!verdict.read_region_ok) Mismatch("the server's read region was altered");
  uint32_t counts[7] = {};
  for (uint32_t i = 0; i < p.messages; ++i) ++counts[static_cast<int>((*plan_)[i].kind)];
  fmt::print("soak rc ok: messages={} bytes={} time={:.1f}s rate={:.0f}/s mtu={} depth={} seed={} | "
             "send={} send_imm={} write={} write_imm={} read={} fetch_add={} cmp_swp={} | "
             "server checked receives={} write_slots={}\n",
             p.messages, plan_->total_bytes(), secs, p.messages / secs, p.mtu, p.depth, p.seed, counts[0],
             counts[1], counts[2], counts[3], counts[4], counts[5], counts[6], verdict.receives,
             verdict.writes);
  fmt::print("soak client counters: {}\n", DeviceCounters(v_.ctx));
  fmt::print("soak client faults: {}\n", FaultRules(v_.ctx));
  std::fflush(stdout);
  ibv_destroy_qp(qp_);
  ibv_dereg_mr(slots_mr_);
  ibv_dereg_mr(credits_mr_);
  CloseVerbs(v_);
  return kExitOk;
}

// ---------------------------------------------------------------- server

class Server {
 public:
  Server(const Options& o, Channel& ctl) : o_(o), ctl_(ctl) {}
  int Run();

 private:
  void PostRecv(uint32_t k);
  void OnReceive(const ibv_wc& wc);
  void CheckBatch(uint32_t batch);
  void SendCredit(uint32_t batch);
  void AdvanceRecvCursor();
  uint8_t* RecvBuffer(uint32_t k) { return recvs_.data() + uint64_t{k} * plan_->params().max_size; }

  const Options& o_;
  Channel& ctl_;
  std::unique_ptr<Plan> plan_;
  Verbs v_;
  ibv_qp* qp_ = nullptr;
  std::vector<uint8_t> read_, write_, recvs_;
  std::vector<uint64_t> atomics_;
  ibv_mr *read_mr_ = nullptr, *write_mr_ = nullptr, *atomic_mr_ = nullptr, *recvs_mr_ = nullptr;
  uint32_t next_recv_ = 0;   // the next message that consumes a receive
  uint32_t credits_sent_ = 0, credits_done_ = 0;
  Verdict verdict_;
};

void Server::PostRecv(uint32_t k) {
  // Two SGEs per receive, split at a point that differs between buffers.
  const uint32_t max = plan_->params().max_size;
  const uint32_t cut = max < 2 ? max : 1 + (k * 997) % (max - 1);
  uint8_t* buf = RecvBuffer(k);
  ibv_sge sge[2] = {{reinterpret_cast<uintptr_t>(buf), cut, recvs_mr_->lkey},
                    {reinterpret_cast<uintptr_t>(buf + cut), max - cut, recvs_mr_->lkey}};
  ibv_recv_wr wr{};
  wr.wr_id = k;
  wr.sg_list = sge;
  wr.num_sge = 2;
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(qp_, &wr, &bad); e != 0) Die(fmt::format("ibv_post_recv: {}", std::strerror(e)));
}

void Server::AdvanceRecvCursor() {
  while (next_recv_ < plan_->size() && !ConsumesRecv((*plan_)[next_recv_].kind)) ++next_recv_;
}

void Server::CheckBatch(uint32_t batch) {
  const Params& p = plan_->params();
  const uint32_t first = batch * p.batch;
  const uint32_t end = std::min(first + p.batch, p.messages);
  std::string why;
  for (uint32_t i = first; i < end; ++i) {
    const Message& m = (*plan_)[i];
    uint8_t* slot = write_.data() + (uint64_t{batch % 2} * p.batch + i % p.batch) * p.max_size;
    const uint32_t written = IsWrite(m.kind) ? m.size : 0;
    if (written > 0 && !CheckPayload(p.seed, i, 0, slot, written, &why)) {
      Mismatch(fmt::format("{} at write-area offset {}: {}", Describe(m), m.remote_offset, why));
    }
    if (!CheckPoison(slot + written, p.max_size - written, &why)) {
      Mismatch(fmt::format("write slot of {} after its {} written bytes (a write landed long, twice or "
                           "in the wrong slot): {}",
                           Describe(m), written, why));
    }
    if (written > 0) {
      std::memset(slot, kPoison, written);
      ++verdict_.writes;
    }
  }
}

void Server::SendCredit(uint32_t batch) {
  // Inline: the buffer is free again as soon as the post returns.
  uint64_t b = batch;
  ibv_sge sge{reinterpret_cast<uintptr_t>(&b), kCreditBytes, 0};
  ibv_send_wr wr{};
  wr.wr_id = batch;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(batch);
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(qp_, &wr, &bad); e != 0) {
    Die(fmt::format("ibv_post_send of the credit for batch {}: {}", batch, std::strerror(e)));
  }
  ++credits_sent_;
}

void Server::OnReceive(const ibv_wc& wc) {
  if (!(wc.opcode & IBV_WC_RECV)) {
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND || wc.wr_id != credits_done_) {
      Mismatch(fmt::format("the credit SEND for batch {}: status {} opcode {} wr_id {}", credits_done_,
                           ibv_wc_status_str(wc.status), static_cast<int>(wc.opcode), wc.wr_id));
    }
    ++credits_done_;
    return;
  }
  if (next_recv_ >= plan_->size()) {
    Mismatch(fmt::format("a receive completion (status {}, byte_len {}, imm {}) after the last message: "
                         "delivered twice?",
                         ibv_wc_status_str(wc.status), wc.byte_len, ntohl(wc.imm_data)));
  }
  const Params& p = plan_->params();
  const Message& m = (*plan_)[next_recv_];
  if (wc.status != IBV_WC_SUCCESS) {
    Mismatch(fmt::format("{}: receive completed with status {}", Describe(m), ibv_wc_status_str(wc.status)));
  }
  const ibv_wc_opcode want_op = m.kind == Kind::kWriteImm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  const bool imm = wc.wc_flags & IBV_WC_WITH_IMM;
  if (wc.opcode != want_op || wc.byte_len != m.size || imm != HasImm(m.kind) ||
      (imm && ntohl(wc.imm_data) != m.index) || wc.qp_num != qp_->qp_num) {
    Mismatch(fmt::format("{}: expected this receive next, got opcode {} byte_len {} immediate {} (for "
                         "message {}) on qp {}: lost, duplicated or out of order",
                         Describe(m), static_cast<int>(wc.opcode), wc.byte_len, imm ? "yes" : "no",
                         ntohl(wc.imm_data), wc.qp_num));
  }
  const uint32_t k = static_cast<uint32_t>(wc.wr_id);
  uint8_t* buf = RecvBuffer(k);
  std::string why;
  if (m.kind == Kind::kWriteImm) {
    const uint8_t* slot = write_.data() + m.remote_offset;
    if (!CheckPayload(p.seed, m.index, 0, slot, m.size, &why)) {
      Mismatch(fmt::format("{} at write-area offset {}: {}", Describe(m), m.remote_offset, why));
    }
    if (!CheckPoison(buf, std::min(p.max_size, kGuard), &why)) {
      Mismatch(fmt::format("{}: the receive buffer it consumed was written: {}", Describe(m), why));
    }
  } else {
    if (!CheckPayload(p.seed, m.index, 0, buf, m.size, &why)) {
      Mismatch(fmt::format("{} in its receive buffer: {}", Describe(m), why));
    }
    if (!CheckPoison(buf + m.size, std::min(p.max_size - m.size, kGuard), &why)) {
      Mismatch(fmt::format("{}: written past its length: {}", Describe(m), why));
    }
    std::memset(buf, kPoison, m.size);
  }
  PostRecv(k);
  ++verdict_.receives;
  // In order: every message before this one has been executed, so at the
  // end of a batch all its writes are in place.
  if (plan_->LastOfBatch(m.index)) {
    const uint32_t batch = plan_->BatchOf(m.index);
    CheckBatch(batch);
    SendCredit(batch);
  }
  ++next_recv_;
  AdvanceRecvCursor();
  SetProgress(m.index + 1, p.messages);
}

int Server::Run() {
  Params p;
  ctl_.Recv(&p);
  Endpoint client;
  ctl_.Recv(&client);
  if (p.messages == 0 || p.batch == 0 || p.depth == 0 || p.atomics == 0 || p.max_size == 0 ||
      p.max_size > (1u << 24) || p.read_bytes < p.max_size) {
    Die("the client sent parameters that make no plan");
  }
  v_ = OpenVerbs(o_, static_cast<int>(kServerRecvs + kServerCredits + 16));
  if (MtuBytes(static_cast<ibv_mtu>(v_.port.active_mtu)) < p.mtu) {
    Die(fmt::format("the client's MTU {} exceeds this port's active MTU {}", p.mtu, MtuName(v_.port.active_mtu)));
  }
  plan_ = std::make_unique<Plan>(p);
  read_.resize(p.read_bytes);
  FillReadRegion(p.seed, read_.data(), read_.size());
  write_ = PoisonedBuffer(plan_->WriteAreaBytes());
  recvs_ = PoisonedBuffer(uint64_t{kServerRecvs} * p.max_size);
  atomics_.resize(p.atomics);
  for (uint32_t s = 0; s < p.atomics; ++s) atomics_[s] = plan_->AtomicInitial(s);
  read_mr_ = Register(v_, read_.data(), read_.size(), IBV_ACCESS_REMOTE_READ);
  write_mr_ = Register(v_, write_.data(), write_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  atomic_mr_ = Register(v_, atomics_.data(), atomics_.size() * 8,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  recvs_mr_ = Register(v_, recvs_.data(), recvs_.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_qp_cap cap{};
  cap.max_send_wr = kServerCredits;
  cap.max_recv_wr = kServerRecvs;
  cap.max_send_sge = 1;
  cap.max_recv_sge = 2;
  cap.max_inline_data = kCreditBytes;
  qp_ = CreateQp(v_, IBV_QPT_RC, cap);
  const uint32_t psn = static_cast<uint32_t>(Mix(p.seed ^ 0x5E4FE4) & 0xffffff);
  RcPath path;
  path.mtu = static_cast<ibv_mtu>(__builtin_ctz(p.mtu / 128));
  path.timeout = o_.qp_timeout;
  ConnectRc(v_, qp_, psn, client, path);
  for (uint32_t k = 0; k < kServerRecvs; ++k) PostRecv(k);
  Endpoint me = LocalEndpoint(v_, qp_, psn);
  me.read_addr = reinterpret_cast<uintptr_t>(read_.data());
  me.read_rkey = read_mr_->rkey;
  me.write_addr = reinterpret_cast<uintptr_t>(write_.data());
  me.write_rkey = write_mr_->rkey;
  me.atomic_addr = reinterpret_cast<uintptr_t>(atomics_.data());
  me.atomic_rkey = atomic_mr_->rkey;
  ctl_.Send(me);
  ctl_.Send(uint8_t{1});

  AdvanceRecvCursor();
  std::vector<ibv_wc> wc(kServerRecvs + kServerCredits);
  const uint32_t batches = plan_->Batches();
  while (credits_done_ < batches) {
    const int n = WaitCompletions(v_, wc.data(), static_cast<int>(wc.size()), ctl_);
    for (int k = 0; k < n; ++k) OnReceive(wc[k]);
  }
  Done done;
  ctl_.Recv(&done);
  // Every message has completed at the client: nothing may arrive now.
  const int late = ibv_poll_cq(v_.cq, static_cast<int>(wc.size()), wc.data());
  if (late != 0) Mismatch(fmt::format("{} completion(s) after the client finished", late));
  verdict_.atomics_ok = atomics_ == plan_->AtomicFinal();
  std::vector<uint8_t> pristine(p.read_bytes);
  FillReadRegion(p.seed, pristine.data(), pristine.size());
  verdict_.read_region_ok = pristine == read_;
  ctl_.Send(verdict_);
  fmt::print("soak rc server: receives={} write_slots={} atomics {} read region {}\n", verdict_.receives,
             verdict_.writes, verdict_.atomics_ok ? "ok" : "WRONG", verdict_.read_region_ok ? "intact" : "ALTERED");
  fmt::print("soak server counters: {}\n", DeviceCounters(v_.ctx));
  fmt::print("soak server faults: {}\n", FaultRules(v_.ctx));
  std::fflush(stdout);
  ibv_destroy_qp(qp_);
  for (ibv_mr* mr : {read_mr_, write_mr_, atomic_mr_, recvs_mr_}) ibv_dereg_mr(mr);
  CloseVerbs(v_);
  return verdict_.atomics_ok && verdict_.read_region_ok ? kExitOk : kExitMismatch;
}

}  // namespace

int RunRcClient(const Options& o, Channel& ctl) { return Client(o, ctl).Run(); }
int RunRcServer(const Options& o, Channel& ctl) { return Server(o, ctl).Run(); }

}  // namespace soak
