#include "tests/emulator/engine/protection_runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "tests/emulator/engine/fake_peer.h"
#include "tests/emulator/engine/protection_model.h"

namespace rdmaemu::testing {
namespace {

using model::Op;
using model::Reply;
using model::RecvStatus;
using wire::Opcode;

constexpr size_t kPage = 4096;
constexpr size_t kArenaPages = 12;
constexpr size_t kArenaBytes = kArenaPages * kPage;
constexpr int kQps = 4;
constexpr uint32_t kRecvBytes = 512;  // each QP's receive buffer
constexpr size_t kMaxRegions = 10;
constexpr size_t kMaxWindows = 8;
constexpr int kPds = 2;
constexpr uint32_t kRemoteRights = model::kRemoteWrite | model::kRemoteRead | model::kRemoteAtomic;

}  // namespace

class ProtectionRunner::Impl {
 public:
  explicit Impl(uint64_t seed) : seed_(seed), rng_(seed) { Setup(); }
  ~Impl();

  bool Run(uint64_t cases);

  std::string setup_error_;
  std::string failure_;
  ProtectionRunStats stats_;

 private:
  // One live verbs object and the model's handle for it.
  struct RealRegion {
    ibv_mr* mr = nullptr;
    bool fixed = false;  // a receive buffer's region: never deregistered
  };
  struct RealWindow {
    ibv_mw* mw = nullptr;
  };

  void Setup();
  bool Fail(std::string what);
  void Note(std::string step);
  void Count(const std::string& outcome) { ++stats_.outcomes[outcome]; }

  uint64_t U(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // ---- verbs objects
  ibv_qp* CreateQp(int pd);
  bool Connect(int qp, uint32_t epsn);
  bool PostRecv(int qp);
  std::optional<ibv_wc> WaitCompletion(int qp, std::chrono::milliseconds timeout = 2000ms);
  bool Recover(int qp, bool receive_posted);
  bool Barrier(int except_qp);
  void DrainAsyncEvents();

  // ---- one case
  bool Step();
  bool ObjectStep();
  bool DoRegister();
  bool DoDeregister(int forced = -1);
  bool DoReregister(int forced = -1);
  bool DoAllocWindow();
  bool DoDeallocWindow(int forced = -1);
  bool DoBind(int type, int forced = -1);
  bool DoLocalInvalidate(std::optional<uint32_t> forced_key = std::nullopt, int forced_qp = -1);
  bool ChangeUnderTheWrite(const model::Qp::Partial& partial, int qp);
  bool RemoteStep();
  model::Request MakeRequest();
  uint32_t PickKey(int qp, uint64_t* base, uint64_t* length);
  void PickRange(Op op, int qp, uint64_t base, uint64_t length, model::Request* r);
  // Packets [from, to) of the request's message.
  void SendRequest(const model::Request& r, uint32_t mtu, uint32_t from = 0, uint32_t to = ~0u);
  bool CheckAnswer(const model::Request& r, const model::Prediction& p);
  bool CheckMemory(const model::Prediction& p, const std::string& what);
  std::string Describe(const model::Request& r) const;
  std::string Where(uint64_t host) const;

  template <typename Map>
  int RandomKey(const Map& m) {
    if (m.empty()) return -1;
    auto it = m.begin();
    std::advance(it, static_cast<long>(U(m.size())));
    return it->first;
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  uint64_t case_ = 0;
  std::deque<std::string> recent_;

  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  ibv_pd* pds_[kPds] = {};
  uint8_t* mapping_ = nullptr;  // guard page, arena, guard page, receive page, guard page
  uint8_t* arena_ = nullptr;
  uint8_t* recv_page_ = nullptr;
  ibv_qp* qps_[kQps] = {};
  uint32_t recv_lkey_[kPds] = {};
  bool recv_posted_[kQps] = {};
  std::optional<model::Request> last_replayable_[kQps];

  model::Model model_;
  std::map<int, RealRegion> regions_;
  std::map<int, RealWindow> windows_;
  std::vector<uint32_t> stale_keys_;  // keys that no longer name anything (or name something new)
  int busy_qp_ = -1;                  // a QP in the middle of a paused WRITE: no binds on it
};

// ---------------------------------------------------------------- setup

void ProtectionRunner::Impl::Setup() {
  if (!emu_.ok()) {
    setup_error_ = "cannot open the emulated device";
    return;
  }
  peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
  if (!peer_->ok()) {
    setup_error_ = "cannot bind the fake peer";
    return;
  }
  // The async events of the QP errors are read and acknowledged as they
  // come, so that millions of cases do not queue millions of events.
  int flags = fcntl(emu_.ctx()->async_fd, F_GETFL);
  fcntl(emu_.ctx()->async_fd, F_SETFL, flags | O_NONBLOCK);
  pds_[0] = emu_.pd();
  pds_[1] = ibv_alloc_pd(emu_.ctx());
  if (pds_[1] == nullptr) {
    setup_error_ = "ibv_alloc_pd failed";
    return;
  }
  // PROT_NONE pages around the arena and the receive page: a stray access
  // past them faults at once.
  const size_t total = (kArenaPages + 4) * kPage;
  void* m = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    setup_error_ = "mmap failed";
    return;
  }
  mapping_ = static_cast<uint8_t*>(m);
  arena_ = mapping_ + kPage;
  recv_page_ = arena_ + kArenaBytes + kPage;
  if (mprotect(arena_, kArenaBytes, PROT_READ | PROT_WRITE) != 0 ||
      mprotect(recv_page_, kPage, PROT_READ | PROT_WRITE) != 0) {
    setup_error_ = "mprotect failed";
    return;
  }
  for (size_t i = 0; i < kArenaBytes; ++i) arena_[i] = static_cast<uint8_t>(rng_());
  for (size_t i = 0; i < kPage; ++i) recv_page_[i] = static_cast<uint8_t>(rng_());
  model_.AddMemory(reinterpret_cast<uintptr_t>(arena_), {arena_, arena_ + kArenaBytes});
  model_.AddMemory(reinterpret_cast<uintptr_t>(recv_page_), {recv_page_, recv_page_ + kPage});

  // Each PD's receive region: local write only, so also a key with no
  // remote rights for the requests to try.
  for (int pd = 0; pd < kPds; ++pd) {
    ibv_mr* mr = ibv_reg_mr(pds_[pd], recv_page_, kPage, IBV_ACCESS_LOCAL_WRITE);
    if (mr == nullptr) {
      setup_error_ = "cannot register the receive page";
      return;
    }
    model::Region r;
    r.key = mr->rkey;
    r.pd = pd;
    r.host = r.iova = reinterpret_cast<uintptr_t>(recv_page_);
    r.length = kPage;
    r.access = model::kLocalWrite;
    std::string why;
    auto h = model_.Registered(r, &why);
    if (!h) {
      setup_error_ = why;
      return;
    }
    regions_[*h] = {mr, true};
    recv_lkey_[pd] = mr->lkey;
  }

  for (int i = 0; i < kQps; ++i) {
    model::Qp q;
    q.pd = i % kPds;
    // QPs 0 and 1 allow everything; 2 and 3 a random part.
    q.access = i < 2 ? kRemoteRights : static_cast<uint32_t>(U(8)) << 1;
    q.mtu = i % 2 == 0 ? 256 : 1024;
    q.recv_host = reinterpret_cast<uintptr_t>(recv_page_) + i * kRecvBytes;
    q.recv_length = kRecvBytes;
    model_.AddQp(q);
    qps_[i] = CreateQp(q.pd);
    const uint32_t epsn = static_cast<uint32_t>(U(1u << 24));
    if (qps_[i] == nullptr || !Connect(i, epsn) || !PostRecv(i)) {
      setup_error_ = fmt::format("cannot set up QP {}", i);
      return;
    }
    model_.Reconnect(i, epsn);
  }
}

ProtectionRunner::Impl::~Impl() {
  for (auto& [h, w] : windows_) ibv_dealloc_mw(w.mw);
  for (auto& [h, r] : regions_) ibv_dereg_mr(r.mr);
  for (ibv_qp* qp : qps_) {
    if (qp != nullptr) ibv_destroy_qp(qp);
  }
  DrainAsyncEvents();
  if (pds_[1] != nullptr) ibv_dealloc_pd(pds_[1]);
  if (mapping_ != nullptr) munmap(mapping_, (kArenaPages + 4) * kPage);
}

ibv_qp* ProtectionRunner::Impl::CreateQp(int pd) {
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = emu_.cq();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 8;
  attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  return ibv_create_qp(pds_[pd], &attr);
}

bool ProtectionRunner::Impl::Connect(int i, uint32_t epsn) {
  const model::Qp& q = model_.qp(i);
  RcParams p;
  p.access = static_cast<int>(q.access);
  p.mtu = q.mtu == 256 ? IBV_MTU_256 : IBV_MTU_1024;
  p.rq_psn = epsn;
  return emu_.ToInit(qps_[i], p) == 0 && emu_.ToRtr(qps_[i], p) == 0 && emu_.ToRts(qps_[i], p) == 0;
}

bool ProtectionRunner::Impl::PostRecv(int i) {
  const model::Qp& q = model_.qp(i);
  ibv_sge sge{q.recv_host, q.recv_length, recv_lkey_[q.pd]};
  ibv_recv_wr wr{};
  wr.wr_id = static_cast<uint64_t>(i);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  recv_posted_[i] = ibv_post_recv(qps_[i], &wr, &bad) == 0;
  return recv_posted_[i];
}

std::optional<ibv_wc> ProtectionRunner::Impl::WaitCompletion(int qp, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(emu_.cq(), 1, &wc);
    if (n == 1) {
      if (wc.qp_num != qps_[qp]->qp_num) {
        Fail(fmt::format("a completion of qp#{} (status {}) came while waiting for qp#{}'s",
                         wc.qp_num, ibv_wc_status_str(wc.status), qps_[qp]->qp_num));
        return std::nullopt;
      }
      return wc;
    }
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    usleep(20);
  }
}

void ProtectionRunner::Impl::DrainAsyncEvents() {
  ibv_async_event e;
  while (ibv_get_async_event(emu_.ctx(), &e) == 0) ibv_ack_async_event(&e);
}

// The QP went to ERR: its posted receive (if any) is flushed; back through
// RESET to RTS with a new PSN and a fresh receive.
bool ProtectionRunner::Impl::Recover(int i, bool receive_posted) {
  if (emu_.State(qps_[i]) != IBV_QPS_ERR) {
    return Fail(fmt::format("QP {} should be in ERR, it is in state {}", i, int(emu_.State(qps_[i]))));
  }
  if (receive_posted) {
    auto wc = WaitCompletion(i);
    if (!failure_.empty()) return false;
    if (!wc || wc->status != IBV_WC_WR_FLUSH_ERR) {
      return Fail(fmt::format("QP {}: its receive was not flushed (status {})", i,
                              wc ? ibv_wc_status_str(wc->status) : "none"));
    }
  }
  DrainAsyncEvents();
  // The rest of a message whose first packet failed may still be on its
  // way to the QP: it must find the QP in ERR (and be dropped), not the QP
  // reconnected.
  if (!Barrier(i)) return false;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  if (ibv_modify_qp(qps_[i], &a, IBV_QP_STATE) != 0) return Fail("modify to RESET failed");
  const uint32_t epsn = Chance(0.1) ? 0xffffff - static_cast<uint32_t>(U(4))
                                    : static_cast<uint32_t>(U(1u << 24));
  if (!Connect(i, epsn) || !PostRecv(i)) return Fail(fmt::format("QP {} cannot be reconnected", i));
  model_.Reconnect(i, epsn);
  last_replayable_[i].reset();
  return true;
}

// Every packet sent so far has been handled once another QP answers one
// sent after them: the device takes its datagrams in order. Nothing else
// may answer before it (a QP in ERR answers nothing).
bool ProtectionRunner::Impl::Barrier(int except_qp) {
  const int other = (except_qp + 1) % kQps;
  const uint32_t psn = model::PsnAdd(model_.qp(other).epsn, -1);
  peer_->Send(FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qps_[other]->qp_num, psn));
  auto rx = peer_->Receive(2000ms);
  if (!rx || rx->opcode != Opcode::RC_ACKNOWLEDGE || rx->syndrome != wire::AckSyndrome() || rx->psn != psn) {
    return Fail(fmt::format("waiting for QP {}'s ACK of a probe (psn {:#x}) after QP {} failed: {}", other, psn,
                            except_qp,
                            rx ? fmt::format("{} syndrome {:#x} psn {:#x} came first", wire::ToString(rx->opcode),
                                             rx->syndrome, rx->psn)
                               : "nothing came"));
  }
  return true;
}

// ---------------------------------------------------------------- failures

bool ProtectionRunner::Impl::Fail(std::string what) {
  if (!failure_.empty()) return false;
  std::string steps;
  for (const auto& s : recent_) steps += "\n    " + s;
  failure_ = fmt::format("{}\n  at case {} of seed {} (replay: RDMAEMU_MODEL_SEED={}); the last steps:{}",
                         what, case_, seed_, seed_, steps);
  return false;
}

void ProtectionRunner::Impl::Note(std::string step) {
  recent_.push_back(fmt::format("#{} {}", case_, std::move(step)));
  if (recent_.size() > 24) recent_.pop_front();
}

std::string ProtectionRunner::Impl::Where(uint64_t host) const {
  std::string out;
  for (const auto& [h, r] : model_.regions()) {
    if (host >= r.host && host < r.host + r.length) out += fmt::format(" region {:#x}", r.key);
  }
  for (const auto& [h, w] : model_.windows()) {
    if (w.bound && host >= w.host && host < w.host + w.length) out += fmt::format(" window {:#x}", w.key);
  }
  return out.empty() ? " (no region or window: a guard byte)" : " (inside" + out + ")";
}

// ---------------------------------------------------------------- the cases

bool ProtectionRunner::Impl::Run(uint64_t cases) {
  if (!setup_error_.empty()) return Fail(setup_error_);
  for (uint64_t n = 0; n < cases; ++n, ++case_) {
    if (!Step()) return Fail("stopped");
    ++stats_.cases;
  }
  return true;
}

bool ProtectionRunner::Impl::Step() {
  // Objects change often enough that requests meet every state of them.
  if (Chance(0.18) || regions_.size() < 4) return ObjectStep();
  return RemoteStep();
}

bool ProtectionRunner::Impl::ObjectStep() {
  switch (U(10)) {
    case 0:
    case 1: return DoRegister();
    case 2: return DoDeregister();
    case 3: return DoReregister();
    case 4: return DoAllocWindow();
    case 5: return DoDeallocWindow();
    case 6: return DoBind(1);
    case 7:
    case 8: return DoBind(2);
    default: return DoLocalInvalidate();
  }
}

bool ProtectionRunner::Impl::DoRegister() {
  if (regions_.size() >= kMaxRegions) return DoDeregister();
  const int pd = static_cast<int>(U(kPds));
  const size_t offset = U(kArenaBytes);
  size_t length;
  switch (U(4)) {
    case 0: length = U(65); break;
    case 1: length = 1 + U(kPage); break;
    case 2: length = kArenaBytes - offset; break;
    default: length = 1 + U(kArenaBytes - offset); break;
  }
  length = std::min(length, kArenaBytes - offset);
  // Half the regions grant everything, so that requests get past the keys.
  uint32_t access = Chance(0.5) ? 0x1f : static_cast<uint32_t>(U(32));  // LOCAL_WRITE .. MW_BIND
  if (!Chance(0.05) && (access & (model::kRemoteWrite | model::kRemoteAtomic))) access |= model::kLocalWrite;
  uint8_t* host = arena_ + offset;
  const uint64_t h = reinterpret_cast<uintptr_t>(host);
  // The peer's addresses: the host's own, or an IOVA with the same offset
  // in its page (as the kernel requires) low, high or near the top.
  uint64_t iova = h;
  const int kind = static_cast<int>(U(4));
  if (kind == 1) iova = h % kPage;
  if (kind == 2) iova = 0x7f0000000000ull + (U(1 << 20) << 12) + h % kPage;
  if (kind == 3) iova = 0xffffffffffe00000ull + h % kPage;
  const int want = model_.CheckRegister(pd, h, length, access);
  errno = 0;
  ibv_mr* mr = kind == 0 ? ibv_reg_mr(pds_[pd], host, length, static_cast<int>(access))
                         : ibv_reg_mr_iova(pds_[pd], host, length, iova, static_cast<int>(access));
  Note(fmt::format("reg_mr pd {} [{:#x}, +{}) iova {:#x} access {:#x}: {}", pd, h, length, iova,
                   access, mr ? fmt::format("key {:#x}", mr->rkey) : fmt::format("errno {}", errno)));
  if (want != 0) {
    Count("reg_mr -> refused");
    if (mr != nullptr) {
      ibv_dereg_mr(mr);
      return Fail(fmt::format("ibv_reg_mr succeeded; the model says errno {}", want));
    }
    return errno == want ? true : Fail(fmt::format("ibv_reg_mr: errno {}, the model says {}", errno, want));
  }
  if (mr == nullptr) return Fail(fmt::format("ibv_reg_mr failed (errno {}); the model says it works", errno));
  Count("reg_mr -> ok");
  model::Region r;
  r.key = mr->rkey;
  r.pd = pd;
  r.host = h;
  r.iova = iova;
  r.length = length;
  r.access = access;
  std::string why;
  auto handle = model_.Registered(r, &why);
  if (!handle) return Fail(why);
  if (mr->lkey != mr->rkey) return Fail("the region's lkey and rkey differ");
  regions_[*handle] = {mr, false};
  return true;
}

bool ProtectionRunner::Impl::DoDeregister(int forced) {
  std::vector<int> candidates;
  for (const auto& [h, r] : regions_) {
    if (!r.fixed) candidates.push_back(h);
  }
  if (candidates.empty()) return DoRegister();
  const int h = forced >= 0 ? forced : candidates[U(candidates.size())];
  const int want = model_.CheckDeregister(h);
  const uint32_t key = regions_[h].mr->rkey;
  const int rc = ibv_dereg_mr(regions_[h].mr);
  Note(fmt::format("dereg_mr {:#x}: {}", key, rc));
  Count(want == 0 ? "dereg_mr -> ok" : "dereg_mr -> busy");
  if (rc != want) return Fail(fmt::format("ibv_dereg_mr returned {}, the model says {}", rc, want));
  if (rc == 0) {
    model_.Deregistered(h);
    regions_.erase(h);
    stale_keys_.push_back(key);
  }
  return true;
}

bool ProtectionRunner::Impl::DoReregister(int forced) {
  std::vector<int> candidates;
  for (const auto& [h, r] : regions_) {
    if (!r.fixed) candidates.push_back(h);
  }
  if (candidates.empty()) return DoRegister();
  int h = candidates[U(candidates.size())];
  // Often the region of a READ that a duplicate may ask for again: its
  // rights, PD or translation change under the replay.
  for (const auto& last : last_replayable_) {
    for (int c : candidates) {
      if (last && model_.regions().at(c).key == last->rkey && Chance(0.5)) h = c;
    }
  }
  if (forced >= 0) h = forced;
  ibv_mr* mr = regions_[h].mr;
  const model::Region before = model_.regions().at(h);
  int flags = 0;
  while (flags == 0) flags = static_cast<int>(U(8));
  int pd = before.pd;
  uint64_t host = before.host;
  uint64_t length = before.length;
  uint32_t access = before.access;
  if (flags & IBV_REREG_MR_CHANGE_PD) pd = static_cast<int>(U(kPds));
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    const size_t offset = U(kArenaBytes - 1);
    length = 1 + U(kArenaBytes - offset - 1);
    host = reinterpret_cast<uintptr_t>(arena_ + offset);
  }
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    access = static_cast<uint32_t>(U(32));
    if (!Chance(0.05) && (access & (model::kRemoteWrite | model::kRemoteAtomic))) access |= model::kLocalWrite;
  }
  const int want = model_.CheckReregister(h, access);
  errno = 0;
  const int rc = ibv_rereg_mr(mr, flags, pds_[pd],
                              (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? reinterpret_cast<void*>(host) : nullptr,
                              (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : 0, static_cast<int>(access));
  const int err = rc == 0 ? 0 : errno;
  Note(fmt::format("rereg_mr {:#x} flags {} pd {} [{:#x}, +{}) access {:#x}: {} (errno {})", before.key,
                   flags, pd, host, length, access, rc, err));
  Count(want == 0 ? "rereg_mr -> ok" : "rereg_mr -> refused");
  if ((rc == 0) != (want == 0) || err != want) {
    return Fail(fmt::format("ibv_rereg_mr returned {} errno {}; the model says errno {}", rc, err, want));
  }
  if (rc != 0) return true;
  std::string why;
  if (!model_.Reregistered(h, pd, host, length, access, mr->rkey, &why)) return Fail(why);
  return true;
}

bool ProtectionRunner::Impl::DoAllocWindow() {
  if (windows_.size() >= kMaxWindows) return DoDeallocWindow();
  const int pd = static_cast<int>(U(kPds));
  const int type = Chance(0.4) ? 1 : 2;
  ibv_mw* mw = ibv_alloc_mw(pds_[pd], type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
  Note(fmt::format("alloc_mw type {} pd {}: {}", type, pd, mw ? fmt::format("key {:#x}", mw->rkey) : "failed"));
  if (mw == nullptr) return Fail(fmt::format("ibv_alloc_mw failed (errno {})", errno));
  Count("alloc_mw -> ok");
  model::Window w;
  w.type = type;
  w.pd = pd;
  w.key = mw->rkey;
  std::string why;
  auto h = model_.Allocated(w, &why);
  if (!h) return Fail(why);
  windows_[*h] = {mw};
  return true;
}

bool ProtectionRunner::Impl::DoDeallocWindow(int forced) {
  const int h = forced >= 0 ? forced : RandomKey(windows_);
  if (h < 0) return DoAllocWindow();
  const uint32_t key = model_.windows().at(h).key;
  const int rc = ibv_dealloc_mw(windows_[h].mw);
  Note(fmt::format("dealloc_mw {:#x}: {}", key, rc));
  Count("dealloc_mw -> ok");
  if (rc != 0) return Fail(fmt::format("ibv_dealloc_mw returned {}", rc));
  model_.Deallocated(h);
  windows_.erase(h);
  stale_keys_.push_back(key);
  return true;
}

bool ProtectionRunner::Impl::DoBind(int type, int forced) {
  std::vector<int> candidates;
  for (const auto& [h, w] : model_.windows()) {
    if (w.type == type) candidates.push_back(h);
  }
  if (candidates.empty()) return DoAllocWindow();
  const int wh = forced >= 0 ? forced : candidates[U(candidates.size())];
  const model::Window w = model_.windows().at(wh);
  // Mostly a QP and a region of the window's PD: the binds that work, and
  // the ones that fail on a rule of their own.
  int qp = static_cast<int>(U(kQps));
  if (Chance(0.85)) qp = w.pd + kPds * static_cast<int>(U(kQps / kPds));
  if (qp == busy_qp_) qp = (qp + kPds) % kQps;
  std::vector<int> regions;
  for (const auto& [h, r] : model_.regions()) {
    if (!regions_[h].fixed && (r.pd == w.pd || Chance(0.1))) regions.push_back(h);
  }
  const bool unbind = type == 1 && Chance(0.15);
  int rh = -1;
  uint64_t va = 0, length = 0;
  uint32_t access = static_cast<uint32_t>(U(8)) << 1;
  if (!unbind) {
    if (regions.empty()) return DoRegister();
    rh = regions[U(regions.size())];
    const model::Region& r = model_.regions().at(rh);
    const uint64_t offset = U(r.length + 1);
    va = r.iova + offset;
    length = Chance(0.1) ? r.length - offset + 1 + U(8) : U(r.length - offset + 1);
    // A type 1 bind of zero bytes to a region is left out: whether it
    // unbinds or binds an empty window is not settled (see the report).
    if (type == 1 && length == 0) length = 1;
    if (Chance(0.05)) va = r.iova - 1 - U(16);
    if (type == 2 && Chance(0.3)) {
      access |= model::kZeroBased;
      va &= ~uint64_t{7};  // keep the window's host address 8-byte aligned (see the report)
      if (va < r.iova) va += 8;
    }
  }
  const uint32_t new_key = type == 1 ? ibv_inc_rkey(windows_[wh].mw->rkey)
                                     : (w.key & ~0xffu) | static_cast<uint32_t>(U(256));
  ibv_mr* mr = rh >= 0 ? regions_[rh].mr : nullptr;
  int rc;
  if (type == 1) {
    ibv_mw_bind b{};
    b.wr_id = 1000;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = {mr, va, length, access};
    rc = ibv_bind_mw(qps_[qp], windows_[wh].mw, &b);
  } else {
    ibv_send_wr wr{};
    wr.wr_id = 1000;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = windows_[wh].mw;
    wr.bind_mw.rkey = new_key;
    wr.bind_mw.bind_info = {mr, va, length, access};
    ibv_send_wr* bad = nullptr;
    rc = ibv_post_send(qps_[qp], &wr, &bad);
  }
  const std::string what = fmt::format("bind type {} window {:#x} -> {:#x} on QP {} region {} [{:#x}, +{}) access {:#x}",
                                       type, w.key, new_key, qp, mr ? fmt::format("{:#x}", mr->rkey) : "none",
                                       va, length, access);
  // libibverbs' inline ibv_bind_mw refuses a region of another PD than the
  // window's before anything is posted.
  if (type == 1 && mr != nullptr && mr->pd != windows_[wh].mw->pd) {
    Note(what + fmt::format(": {} at the call", rc));
    Count("bind type 1 -> refused at the call");
    return rc == EPERM ? true : Fail(fmt::format("{}: returned {}, not EPERM", what, rc));
  }
  if (rc != 0) return Fail(fmt::format("{}: posting failed ({})", what, rc));
  std::string why;
  const bool ok = model_.Bind(qp, wh, rh, va, length, access, new_key, &why);
  Note(what + ": the model says " + (ok ? "bound" : why));
  Count(fmt::format("bind type {} -> {}", type, ok ? "ok" : "MW_BIND_ERR"));
  auto wc = WaitCompletion(qp);
  if (!failure_.empty()) return false;
  if (!wc) return Fail(what + ": no completion");
  if (wc->opcode != IBV_WC_BIND_MW && wc->status == IBV_WC_SUCCESS) return Fail(what + ": not a BIND_MW completion");
  const ibv_wc_status want = ok ? IBV_WC_SUCCESS : IBV_WC_MW_BIND_ERR;
  if (wc->status != want) {
    return Fail(fmt::format("{}: completed with {}, the model says {} ({})", what, ibv_wc_status_str(wc->status),
                            ibv_wc_status_str(want), ok ? "bound" : why));
  }
  if (ok && w.bound) stale_keys_.push_back(w.key);
  if (!ok) return Recover(qp, recv_posted_[qp]);
  return true;
}

bool ProtectionRunner::Impl::DoLocalInvalidate(std::optional<uint32_t> forced_key, int forced_qp) {
  int qp = forced_qp >= 0 ? forced_qp : static_cast<int>(U(kQps));
  if (qp == busy_qp_) qp = (qp + kPds) % kQps;
  uint32_t key;
  int wh = RandomKey(model_.windows());
  for (const auto& [h, w] : model_.windows()) {
    if (w.type == 2 && w.bound && Chance(0.5)) wh = h;
  }
  if (wh >= 0 && Chance(0.85)) {
    key = model_.windows().at(wh).key;
  } else if (!stale_keys_.empty() && Chance(0.5)) {
    key = stale_keys_[U(stale_keys_.size())];
  } else {
    key = model_.regions().at(RandomKey(model_.regions())).key;
  }
  if (forced_key) key = *forced_key;
  ibv_send_wr wr{};
  wr.wr_id = 2000;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = key;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qps_[qp], &wr, &bad) != 0) return Fail("posting LOCAL_INV failed");
  std::string why;
  const bool ok = model_.LocalInvalidate(qp, key, &why);
  Note(fmt::format("local_inv {:#x} on QP {}: the model says {}", key, qp, ok ? "invalidated" : why));
  Count(fmt::format("local_inv -> {}", ok ? "ok" : "LOC_QP_OP_ERR"));
  auto wc = WaitCompletion(qp);
  if (!failure_.empty()) return false;
  if (!wc) return Fail("LOCAL_INV: no completion");
  const ibv_wc_status want = ok ? IBV_WC_SUCCESS : IBV_WC_LOC_QP_OP_ERR;
  if (wc->status != want) {
    return Fail(fmt::format("LOCAL_INV of {:#x}: completed with {}, the model says {}", key,
                            ibv_wc_status_str(wc->status), ibv_wc_status_str(want)));
  }
  if (!ok) return Recover(qp, recv_posted_[qp]);
  return true;
}

// Between the packets of a paused WRITE: mostly a change of the region or
// window its key named, through a QP other than the writing one (which
// must stay in RTS for the rest of its message); else any object step.
bool ProtectionRunner::Impl::ChangeUnderTheWrite(const model::Qp::Partial& partial, int qp) {
  const int other = (qp + kPds) % kQps;  // same PD, another QP
  if (partial.handle < 0 || Chance(0.3)) {
    // Something else: whatever it is, it must not disturb the write.
    switch (U(3)) {
      case 0: return DoRegister();
      case 1: return DoAllocWindow();
      default: return DoBind(2);
    }
  }
  if (!partial.window) {
    if (regions_.at(partial.handle).fixed) return true;
    return Chance(0.5) ? DoDeregister(partial.handle) : DoReregister(partial.handle);
  }
  const model::Window& w = model_.windows().at(partial.handle);
  if (Chance(0.3)) return DoDeallocWindow(partial.handle);
  if (w.type == 2) return DoLocalInvalidate(w.key, other);
  return DoBind(1, partial.handle);
}

// ---------------------------------------------------------------- requests

// A key for a request, and the range of addresses it (or something near)
// answers to, so that the addresses can aim at the edges.
uint32_t ProtectionRunner::Impl::PickKey(int qp, uint64_t* base, uint64_t* length) {
  *base = reinterpret_cast<uintptr_t>(arena_);
  *length = kArenaBytes;
  const double x = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (x < 0.45 || model_.windows().empty()) {
    const model::Region& r = model_.regions().at(RandomKey(model_.regions()));
    *base = r.iova;
    *length = r.length;
    return r.key;
  }
  if (x < 0.80) {
    // Windows bound through this QP most of the time.
    std::vector<int> mine;
    for (const auto& [h, w] : model_.windows()) {
      if (w.bound && (w.type == 1 || w.qp == qp)) mine.push_back(h);
    }
    const int h = !mine.empty() && Chance(0.7) ? mine[U(mine.size())] : RandomKey(model_.windows());
    const model::Window& w = model_.windows().at(h);
    if (w.bound) {
      *base = w.base;
      *length = w.length;
    }
    return w.key;
  }
  if (x < 0.90 && !stale_keys_.empty()) return stale_keys_[U(stale_keys_.size())];
  const uint32_t k = model_.regions().at(RandomKey(model_.regions())).key;
  return Chance(0.5) ? k ^ (1u << U(32)) : static_cast<uint32_t>(rng_());
}

void ProtectionRunner::Impl::PickRange(Op op, int qp, uint64_t base, uint64_t length, model::Request* r) {
  const uint32_t mtu = model_.qp(qp).mtu;
  const bool atomic = op == Op::kCompareSwap || op == Op::kFetchAdd;
  uint64_t len = 8;
  if (!atomic) {
    switch (U(6)) {
      case 0: len = 0; break;
      case 1: len = 1 + U(16); break;
      case 2: len = 1 + U(mtu); break;
      case 3: len = 1 + U(3 * mtu); break;
      default: len = std::min<uint64_t>(length, 3 * mtu) + U(3) - 1; break;
    }
    len = std::min<uint64_t>(len, 4 * mtu);
  }
  uint64_t va;
  switch (U(6)) {
    case 0: va = base + length - len; break;              // flush with the end
    case 1: va = base + length - len + 1 + U(8); break;   // just past it
    case 2: va = base - 1 - U(8); break;                  // just before
    case 3: va = Chance(0.5) ? rng_() : ~uint64_t{0} - U(64); break;
    default: va = base + U(length + 1); break;
  }
  if (atomic) {
    va &= ~uint64_t{7};
    if (Chance(0.08)) va += 1 + U(7);
  }
  r->va = va;
  r->length = static_cast<uint32_t>(len);
}

model::Request ProtectionRunner::Impl::MakeRequest() {
  model::Request r;
  // Mostly the QPs that allow every operation.
  r.qp = Chance(0.75) ? static_cast<int>(U(2)) : static_cast<int>(U(kQps));
  const model::Qp& q = model_.qp(r.qp);
  // Again the newest READ or atomic: a duplicate the responder answers from
  // its replay memory.
  if (last_replayable_[r.qp] && Chance(0.1)) return *last_replayable_[r.qp];
  const uint64_t o = U(100);
  r.op = o < 22 ? Op::kWrite : o < 30 ? Op::kWriteWithImm : o < 55 ? Op::kRead : o < 65 ? Op::kCompareSwap : o < 75 ? Op::kFetchAdd
       : o < 87 ? Op::kSend : Op::kSendWithInvalidate;
  uint64_t base, length;
  r.rkey = PickKey(r.qp, &base, &length);
  if (r.op == Op::kSend || r.op == Op::kSendWithInvalidate) {
    r.data.resize(U(q.recv_length + 200));
    if (r.op == Op::kSendWithInvalidate) {
      r.invalidate_rkey = r.rkey;
      if (Chance(0.5)) {
        // A type 2 window bound through this QP, if there is one.
        for (const auto& [h, w] : model_.windows()) {
          if (w.bound && w.type == 2 && w.qp == r.qp) r.invalidate_rkey = w.key;
        }
      }
    }
    r.rkey = 0;
  } else {
    PickRange(r.op, r.qp, base, length, &r);
    if (r.op == Op::kWrite || r.op == Op::kWriteWithImm) {
      int64_t payload = r.length;
      if (Chance(0.05)) payload += static_cast<int64_t>(U(20)) - 10;
      r.data.resize(static_cast<size_t>(std::max<int64_t>(0, payload)));
    }
    r.compare = Chance(0.5) ? rng_() : 0;
    r.swap_add = rng_();
  }
  for (auto& b : r.data) b = static_cast<uint8_t>(rng_());
  // The PSN: mostly the one expected; sometimes a duplicate or ahead, in
  // one packet (a message of many packets is one PSN per packet).
  r.psn = q.epsn;
  const double x = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (x < 0.12 && r.op != Op::kRead && !(r.op == Op::kCompareSwap || r.op == Op::kFetchAdd)) {
    r.data.resize(std::min<size_t>(r.data.size(), q.mtu));
    if (r.op == Op::kWrite || r.op == Op::kWriteWithImm) r.length = static_cast<uint32_t>(r.data.size());
    r.psn = x < 0.06 ? model::PsnAdd(q.epsn, -1 - static_cast<int64_t>(U(4)))
                     : model::PsnAdd(q.epsn, 1 + static_cast<int64_t>(U(4)));
  } else if (x < 0.16) {
    if (r.op == Op::kRead) r.length = std::min(r.length, q.mtu);
    r.psn = model::PsnAdd(q.epsn, 1 + static_cast<int64_t>(U(4)));
  }
  return r;
}

std::string ProtectionRunner::Impl::Describe(const model::Request& r) const {
  std::string s = fmt::format("QP {} {} psn {:#x}", r.qp, model::ToString(r.op), r.psn);
  switch (r.op) {
    case Op::kWrite:
    case Op::kWriteWithImm:
      return s + fmt::format(" va {:#x} rkey {:#x} length {} payload {}", r.va, r.rkey, r.length, r.data.size());
    case Op::kRead: return s + fmt::format(" va {:#x} rkey {:#x} length {}", r.va, r.rkey, r.length);
    case Op::kCompareSwap:
    case Op::kFetchAdd: return s + fmt::format(" va {:#x} rkey {:#x}", r.va, r.rkey);
    case Op::kSend: return s + fmt::format(" {} bytes", r.data.size());
    case Op::kSendWithInvalidate: return s + fmt::format(" {} bytes, invalidate {:#x}", r.data.size(), r.invalidate_rkey);
  }
  return s;
}

void ProtectionRunner::Impl::SendRequest(const model::Request& r, uint32_t mtu, uint32_t from_packet,
                                         uint32_t to_packet) {
  const uint32_t qpn = qps_[r.qp]->qp_num;
  if (r.op == Op::kRead || r.op == Op::kCompareSwap || r.op == Op::kFetchAdd) {
    const Opcode op = r.op == Op::kRead ? Opcode::RC_RDMA_READ_REQUEST
                      : r.op == Op::kCompareSwap ? Opcode::RC_COMPARE_SWAP
                                                 : Opcode::RC_FETCH_ADD;
    wire::PacketFields f = FakePeer::Request(op, qpn, r.psn);
    f.reth = {r.va, r.rkey, r.length};
    f.atomic_eth = {r.va, r.rkey, r.swap_add, r.compare};
    peer_->Send(f);
    return;
  }
  const bool write = r.op == Op::kWrite || r.op == Op::kWriteWithImm;
  const bool imm = r.op == Op::kWriteWithImm;
  const bool inv = r.op == Op::kSendWithInvalidate;
  const uint32_t packets = model::PacketCount(r, mtu);
  std::span<const uint8_t> all(r.data);
  for (uint32_t i = from_packet; i < std::min(packets, to_packet); ++i) {
    const bool first = i == 0, last = i + 1 == packets;
    Opcode op;
    if (write) {
      op = first && last ? (imm ? Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE : Opcode::RC_RDMA_WRITE_ONLY)
           : first       ? Opcode::RC_RDMA_WRITE_FIRST
           : last        ? (imm ? Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE : Opcode::RC_RDMA_WRITE_LAST)
                         : Opcode::RC_RDMA_WRITE_MIDDLE;
    } else {
      op = first && last ? (inv ? Opcode::RC_SEND_ONLY_WITH_INVALIDATE : Opcode::RC_SEND_ONLY)
           : first       ? Opcode::RC_SEND_FIRST
           : last        ? (inv ? Opcode::RC_SEND_LAST_WITH_INVALIDATE : Opcode::RC_SEND_LAST)
                         : Opcode::RC_SEND_MIDDLE;
    }
    // A paused WRITE's first packet asks for its ACK, so the test knows it
    // was taken before it changes anything.
    wire::PacketFields f = FakePeer::Request(op, qpn, model::PsnAdd(r.psn, i), last || i + 1 == to_packet);
    f.reth = {r.va, r.rkey, r.length};
    f.invalidate_rkey = r.invalidate_rkey;
    f.imm = r.psn;
    const size_t from = size_t{i} * mtu;
    peer_->Send(f, all.subspan(std::min(from, all.size()), std::min<size_t>(mtu, all.size() - std::min(from, all.size()))));
  }
}

bool ProtectionRunner::Impl::RemoteStep() {
  model::Request r = MakeRequest();
  const uint32_t mtu = model_.qp(r.qp).mtu;
  const uint32_t epsn_before = model_.qp(r.qp).epsn;
  // Now and then a WRITE stops after its first packet while its region or
  // window (or another) changes, then goes on.
  if (r.op == Op::kWrite && r.psn == epsn_before && r.data.size() == r.length && r.length > mtu &&
      Chance(0.3)) {
    r.pause_after_first = true;
  }
  const model::Prediction p = model_.Execute(r);
  const std::string what = Describe(r);
  Note(fmt::format("{}: the model says {} psn {:#x}{} ({})", what, model::ToString(p.reply), p.psn,
                   p.recv != RecvStatus::kNone ? fmt::format(", receive {}", model::ToString(p.recv)) : "",
                   p.why));
  const int32_t distance = model::PsnDistance(r.psn, epsn_before);
  Count(fmt::format("{}{} -> {}", model::ToString(r.op),
                    distance < 0 ? " (duplicate)" : distance > 0 ? " (ahead)" : "", model::ToString(p.reply)));
  if ((r.op == Op::kRead || r.op == Op::kCompareSwap || r.op == Op::kFetchAdd) && !p.qp_error &&
      model::PsnDistance(r.psn, epsn_before) >= 0 && p.reply != Reply::kNakSequence && p.reply != Reply::kNothing) {
    last_replayable_[r.qp] = r;
  }
  SendRequest(r, mtu, 0, r.pause_after_first ? 1 : ~0u);
  if (!CheckAnswer(r, p)) return false;
  if (r.pause_after_first && !p.qp_error) {
    const model::Qp::Partial partial = model_.qp(r.qp).partial;
    if (!CheckMemory(p, what + " (its first packet)")) return false;
    busy_qp_ = r.qp;
    const bool changed = ChangeUnderTheWrite(partial, r.qp);
    busy_qp_ = -1;
    if (!changed) return false;
    const model::Prediction rest = model_.Continue(r);
    Note(fmt::format("{}: the rest: the model says {} psn {:#x} ({})", what, model::ToString(rest.reply),
                     rest.psn, rest.why));
    Count(fmt::format("WRITE (rest after a pause) -> {}", model::ToString(rest.reply)));
    SendRequest(r, mtu, 1);
    if (!CheckAnswer(r, rest)) return false;
    if (!CheckMemory(rest, what + " (the rest)")) return false;
    if (rest.qp_error) return Recover(r.qp, recv_posted_[r.qp]);
    return true;
  }
  if (p.recv != RecvStatus::kNone) {
    auto wc = WaitCompletion(r.qp);
    if (!failure_.empty()) return false;
    if (!wc) return Fail(what + ": no receive completion");
    recv_posted_[r.qp] = false;
    const ibv_wc_status want = p.recv == RecvStatus::kSuccess     ? IBV_WC_SUCCESS
                               : p.recv == RecvStatus::kLocLenErr ? IBV_WC_LOC_LEN_ERR
                                                                  : IBV_WC_REM_INV_REQ_ERR;
    if (wc->status != want) {
      return Fail(fmt::format("{}: the receive completed with {}, the model says {} ({})", what,
                              ibv_wc_status_str(wc->status), ibv_wc_status_str(want), p.why));
    }
    if (want == IBV_WC_SUCCESS) {
      const bool inv = (wc->wc_flags & IBV_WC_WITH_INV) != 0;
      const ibv_wc_opcode opcode = p.rdma_with_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
      if (wc->opcode != opcode || wc->byte_len != p.byte_len || inv != p.with_invalidate ||
          (inv && wc->invalidated_rkey != r.invalidate_rkey) ||
          (p.rdma_with_imm && (!(wc->wc_flags & IBV_WC_WITH_IMM) || ntohl(wc->imm_data) != r.psn))) {
        return Fail(fmt::format("{}: receive completion opcode {} byte_len {} with_inv {}; the model says "
                                "{} bytes, with_inv {}",
                                what, int(wc->opcode), wc->byte_len, inv, p.byte_len, p.with_invalidate));
      }
      if (!PostRecv(r.qp)) return Fail("cannot post a receive");
    }
  }
  if (!CheckMemory(p, what)) return false;
  if (p.qp_error) return Recover(r.qp, recv_posted_[r.qp]);
  return true;
}

bool ProtectionRunner::Impl::CheckAnswer(const model::Request& r, const model::Prediction& p) {
  const std::string what = Describe(r);
  const uint32_t mtu = model_.qp(r.qp).mtu;
  auto next = [&](const char* expecting) -> std::optional<RxPacket> {
    auto rx = peer_->Receive(2000ms);
    if (!rx) {
      Fail(fmt::format("{}: no answer; the model says {} ({})", what, expecting, p.why));
      return std::nullopt;
    }
    if (!rx->icrc_ok) {
      Fail(what + ": an answer with a bad ICRC");
      return std::nullopt;
    }
    return rx;
  };
  auto expect_ack = [&](uint8_t syndrome, uint32_t psn, const char* name) {
    auto rx = next(name);
    if (!rx) return false;
    if (rx->opcode != Opcode::RC_ACKNOWLEDGE || rx->syndrome != syndrome || rx->psn != psn) {
      return Fail(fmt::format("{}: answered {} syndrome {:#x} psn {:#x}; the model says {} psn {:#x} ({})",
                              what, wire::ToString(rx->opcode), rx->syndrome, rx->psn, name, psn, p.why));
    }
    return true;
  };
  switch (p.reply) {
    case Reply::kAck: return expect_ack(wire::AckSyndrome(), p.psn, "ACK");
    case Reply::kNakSequence:
      return expect_ack(wire::NakSyndrome(wire::NakCode::kPsnSequenceError), p.psn, "NAK PSN sequence error");
    case Reply::kNakInvalidRequest:
      return expect_ack(wire::NakSyndrome(wire::NakCode::kInvalidRequest), p.psn, "NAK invalid request");
    case Reply::kNakRemoteAccess:
      return expect_ack(wire::NakSyndrome(wire::NakCode::kRemoteAccessError), p.psn, "NAK remote access error");
    case Reply::kAtomicAck: {
      auto rx = next("ATOMIC_ACKNOWLEDGE");
      if (!rx) return false;
      if (rx->opcode != Opcode::RC_ATOMIC_ACKNOWLEDGE || rx->psn != p.psn || !rx->has_atomic_ack ||
          rx->orig_data != p.atomic_orig || rx->syndrome != wire::AckSyndrome()) {
        return Fail(fmt::format("{}: answered {} psn {:#x} orig {:#x}; the model says ATOMIC_ACKNOWLEDGE psn "
                                "{:#x} orig {:#x}",
                                what, wire::ToString(rx->opcode), rx->psn, rx->orig_data, p.psn, p.atomic_orig));
      }
      return true;
    }
    case Reply::kReadResponse: {
      const uint32_t count = r.length == 0 ? 1 : (r.length + mtu - 1) / mtu;
      std::vector<uint8_t> got;
      for (uint32_t i = 0; i < count; ++i) {
        auto rx = next("READ responses");
        if (!rx) return false;
        const Opcode want = count == 1    ? Opcode::RC_RDMA_READ_RESPONSE_ONLY
                            : i == 0       ? Opcode::RC_RDMA_READ_RESPONSE_FIRST
                            : i + 1 == count ? Opcode::RC_RDMA_READ_RESPONSE_LAST
                                             : Opcode::RC_RDMA_READ_RESPONSE_MIDDLE;
        if (rx->opcode != want || rx->psn != model::PsnAdd(p.psn, i)) {
          return Fail(fmt::format("{}: response {} of {} is {} psn {:#x} syndrome {:#x}; the model says {} psn {:#x} ({})",
                                  what, i + 1, count, wire::ToString(rx->opcode), rx->psn, rx->syndrome,
                                  wire::ToString(want), model::PsnAdd(p.psn, i), p.why));
        }
        got.insert(got.end(), rx->payload.begin(), rx->payload.end());
      }
      if (got != p.read_data) {
        size_t at = 0;
        while (at < got.size() && at < p.read_data.size() && got[at] == p.read_data[at]) ++at;
        return Fail(fmt::format("{}: the READ returned {} bytes, the model {}; first difference at byte {}",
                                what, got.size(), p.read_data.size(), at));
      }
      return true;
    }
    case Reply::kNothing: {
      // Silence is checked by a probe that must be the next thing answered:
      // a zero-length WRITE behind the expected PSN, a duplicate that is
      // only acknowledged again.
      const uint32_t epsn = model_.qp(r.qp).epsn;
      peer_->Send(FakePeer::Request(Opcode::RC_RDMA_WRITE_ONLY, qps_[r.qp]->qp_num, model::PsnAdd(epsn, -1)));
      return expect_ack(wire::AckSyndrome(), model::PsnAdd(epsn, -1), "nothing, then the probe's ACK");
    }
  }
  return true;
}

bool ProtectionRunner::Impl::CheckMemory(const model::Prediction& p, const std::string& what) {
  // Undefined bytes may be anything the request was granted: take them as
  // they are, then every other byte must be the model's.
  for (const model::HostRange& u : p.undefined) {
    std::memcpy(model_.MutableImage(u.host, u.length), reinterpret_cast<const void*>(u.host), u.length);
  }
  for (const auto& [host, image] : model_.memory()) {
    const auto* real = reinterpret_cast<const uint8_t*>(host);
    if (std::memcmp(real, image.data(), image.size()) == 0) continue;
    size_t at = 0;
    while (real[at] == image[at]) ++at;
    size_t end = image.size();
    while (real[end - 1] == image[end - 1]) --end;
    return Fail(fmt::format("{}: memory differs from the model's in [{:#x}, {:#x}): byte {:#x}{} is {:#04x}, "
                            "the model says {:#04x} ({})",
                            what, host + at, host + end, host + at, Where(host + at), real[at], image[at], p.why));
  }
  return true;
}

// ---------------------------------------------------------------- the API

ProtectionRunner::ProtectionRunner(uint64_t seed) : impl_(std::make_unique<Impl>(seed)) {}
ProtectionRunner::~ProtectionRunner() = default;
const std::string& ProtectionRunner::setup_error() const { return impl_->setup_error_; }
bool ProtectionRunner::Run(uint64_t cases) { return impl_->Run(cases); }
const std::string& ProtectionRunner::failure() const { return impl_->failure_; }
const ProtectionRunStats& ProtectionRunner::stats() const { return impl_->stats_; }

}  // namespace rdmaemu::testing
