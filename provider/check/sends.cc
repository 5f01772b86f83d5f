// Outstanding send WRs per QP (sends.h).
#include "provider/check/sends.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "provider/check/check.h"

namespace rdmaemu::check {
namespace {

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct Posted {
  uint64_t wr_id;
  ibv_wr_opcode opcode;
  bool signaled;
  bool summed;        // SEND or RDMA WRITE from registered memory
  uint64_t sum = 0;   // of the SGEs' bytes, in order
  std::vector<Sge> sges;
  std::shared_ptr<const Stack> posted;  // one per ibv_post_send call
  const char* verb = "ibv_post_send";   // or ibv_wr_complete
  // A bind: the window and the region it names (compared, never read: the
  // provider has not checked them yet when the WR is recorded).
  const void* bind_mw = nullptr;
  const void* bind_mr = nullptr;
  // The device produced the completion that retires it (SendProduced), and
  // the memory was still as posted then: nothing to compare at the poll.
  bool produced = false;
  bool unchanged_at_retire = false;
};

struct SendQueue {
  bool sq_sig_all;
  uint32_t max_send_wr;
  std::deque<Posted> outstanding;
  // Held by a SendPost from recording to Finish (never with g_mu held
  // inside it the other way round): shared, as ForgetQp may drop the queue
  // while a post of a racing thread still holds it.
  std::shared_ptr<std::mutex> post_order = std::make_shared<std::mutex>();
};

std::mutex g_mu;
// Keyed by context and QP number, as a CQE names its QP; never freed (used at exit).
auto& g_queues = *new std::map<std::pair<const ibv_context*, uint32_t>, SendQueue>();  // g_mu
auto& g_device_keys = *new std::multiset<uint32_t>();  // g_mu; lkeys of regions over device memory

// The device reads these WRs' local memory for the wire; a RDMA READ or an
// atomic writes it, and inline data was copied at the post.
bool ReadsLocalMemory(const ibv_send_wr& wr) {
  if (wr.send_flags & IBV_SEND_INLINE) return false;
  switch (wr.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return true;
    default:
      return false;
  }
}

uint64_t Sum(const std::vector<Sge>& sges) {
  uint64_t sum = 0;
  for (const Sge& s : sges) {
    std::string_view bytes(reinterpret_cast<const char*>(s.addr), s.length);
    sum = sum * 1099511628211ULL ^ std::hash<std::string_view>{}(bytes);
  }
  return sum;
}

const char* OpcodeName(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND: return "SEND";
    case IBV_WR_SEND_WITH_IMM: return "SEND with immediate";
    case IBV_WR_SEND_WITH_INV: return "SEND with invalidate";
    case IBV_WR_RDMA_WRITE: return "RDMA WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA WRITE with immediate";
    case IBV_WR_RDMA_READ: return "RDMA READ";
    case IBV_WR_ATOMIC_CMP_AND_SWP: return "compare-and-swap";
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return "fetch-and-add";
    case IBV_WR_BIND_MW: return "bind of a memory window";
    default: return "WR";
  }
}

std::string Describe(const Posted& p) {
  std::string sges;
  for (const Sge& s : p.sges) {
    sges += fmt::format("{}{} bytes at {:#x} (mr lkey {:#x})", sges.empty() ? "" : ", ", s.length,
                        s.addr, s.lkey);
  }
  return fmt::format("wr_id {} ({}{}{})", p.wr_id, OpcodeName(p.opcode), sges.empty() ? "" : ", ",
                     sges);
}

}  // namespace

void TrackQp(const ibv_qp* qp, bool sq_sig_all, uint32_t max_send_wr) {
  std::lock_guard lock(g_mu);
  g_queues[{qp->context, qp->qp_num}] = SendQueue{sq_sig_all, max_send_wr, {}};
}

void ForgetQp(const ibv_qp* qp) {
  std::lock_guard lock(g_mu);
  g_queues.erase({qp->context, qp->qp_num});
}

struct SendPost::State {
  const ibv_qp* qp;
  std::shared_ptr<std::mutex> post_order;  // locked while the State lives
  size_t recorded = 0;                     // WRs appended to the queue
  size_t wrs = 0;                          // in the chain
  std::shared_ptr<const Stack> where;
  const char* verb;
};

SendPost::SendPost(const ibv_qp* qp, const ibv_send_wr* wr, const Stack& where, size_t needed,
                   const char* verb)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.qp = qp;
  st.where = std::make_shared<const Stack>(where);
  st.verb = verb;
  {
    std::lock_guard lock(g_mu);
    auto it = g_queues.find({qp->context, qp->qp_num});
    if (it == g_queues.end()) return;  // not a QP the checker tracks: nothing to record
    st.post_order = it->second.post_order;
  }
  st.post_order->lock();
  // Summed outside g_mu: the bytes may be many.
  std::vector<Posted> records;
  for (; wr != nullptr; wr = wr->next) {
    Posted p{wr->wr_id, wr->opcode, (wr->send_flags & IBV_SEND_SIGNALED) != 0, false, 0, {},
             st.where, verb};
    bool device_memory = false;
    {
      std::lock_guard lock(g_mu);
      for (int i = 0; i < wr->num_sge; ++i) {
        p.sges.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
        device_memory |= g_device_keys.count(wr->sg_list[i].lkey) != 0;
      }
    }
    if (wr->opcode == IBV_WR_BIND_MW) {
      p.bind_mw = wr->bind_mw.mw;
      p.bind_mr = wr->bind_mw.bind_info.mr;
    }
    if (ReadsLocalMemory(*wr) && !p.sges.empty() && !device_memory) {
      p.summed = true;
      p.sum = Sum(p.sges);
    }
    records.push_back(std::move(p));
  }
  st.wrs = records.size();
  std::lock_guard lock(g_mu);
  auto it = g_queues.find({qp->context, qp->qp_num});
  if (it == g_queues.end()) return;
  SendQueue& q = it->second;
  if (q.outstanding.size() + needed > q.max_send_wr) {
    room_ = false;
    return;
  }
  for (Posted& p : records) {
    p.signaled |= q.sq_sig_all;
    q.outstanding.push_back(std::move(p));
  }
  st.recorded = records.size();
}

SendPost::~SendPost() {
  if (state_->post_order) state_->post_order->unlock();
}

void SendPost::Finish(int rc, const ibv_send_wr* bad_wr) {
  State& st = *state_;
  // The WRs from bad_wr on were not posted, and are still the queue's last:
  // a completion retires up to the first outstanding WR it names, always a
  // posted one, and no later post could record behind them (post_order).
  size_t unposted = 0;
  if (rc != 0) {
    if (bad_wr == nullptr) unposted = st.wrs;
    for (const ibv_send_wr* wr = bad_wr; wr != nullptr; wr = wr->next) ++unposted;
  }
  std::unique_lock lock(g_mu);
  auto it = g_queues.find({st.qp->context, st.qp->qp_num});
  if (it == g_queues.end()) return;
  SendQueue& q = it->second;
  for (size_t i = 0; i < std::min(unposted, st.recorded) && !q.outstanding.empty(); ++i) {
    q.outstanding.pop_back();
  }
  if (rc != ENOMEM || q.outstanding.empty()) return;
  for (const Posted& p : q.outstanding) {
    if (p.signaled) return;  // its completion will retire the rest: only full for now
  }
  size_t n = q.outstanding.size();
  uint32_t qpn = st.qp->qp_num, max = q.max_send_wr;
  Stack first = *q.outstanding.front().posted;
  lock.unlock();
  Report(Kind::kUnsignaledSqFull,
         fmt::format("{} on qp#{} failed with ENOMEM: its send queue (max_send_wr {}) "
                     "holds {} WRs and none is signaled, so no completion will ever retire them "
                     "(a NIC frees send queue slots only when it writes a completion); post with "
                     "IBV_SEND_SIGNALED every so often (e.g. every max_send_wr/2 WRs) and poll it",
                     st.verb, qpn, max, n),
         *st.where, {{"the oldest outstanding unsignaled WR was posted here", first}});
}

void SendProduced(const ibv_context* context, uint32_t qp_num, uint64_t wr_id) {
  std::lock_guard lock(g_mu);
  auto it = g_queues.find({context, qp_num});
  if (it == g_queues.end()) return;
  auto& out = it->second.outstanding;
  // Completions come in order: this one retires the WRs after those an
  // earlier one produced, up to the first signaled WR it names.
  size_t start = 0;
  while (start < out.size() && out[start].produced) ++start;
  size_t end = start;
  for (; end < out.size(); ++end) {
    if (out[end].wr_id == wr_id && out[end].signaled) break;
  }
  if (end == out.size()) return;
  for (size_t i = start; i <= end; ++i) {
    out[i].produced = true;
    out[i].unchanged_at_retire = !out[i].summed || Sum(out[i].sges) == out[i].sum;
  }
}

void SendCompleted(const ibv_context* context, const ibv_wc& wc) {
  struct Changed {
    Posted posted;
  };
  std::vector<Changed> changed;
  {
    std::lock_guard lock(g_mu);
    auto it = g_queues.find({context, wc.qp_num});
    if (it == g_queues.end()) return;
    auto& out = it->second.outstanding;
    // A success names its signaled WR, and a send queue completes in order,
    // so it retires every unsignaled WR before it; an error completion (a
    // flush) comes for each WR, signaled or not.
    bool ok = wc.status == IBV_WC_SUCCESS;
    size_t end = 0;
    for (; end < out.size(); ++end) {
      if (out[end].wr_id == wc.wr_id && (out[end].signaled || !ok)) break;
    }
    if (end == out.size()) return;  // not one this checker saw posted
    for (size_t i = 0; i <= end; ++i) {
      if (ok && out[i].summed && !out[i].unchanged_at_retire && Sum(out[i].sges) != out[i].sum) {
        changed.push_back({out[i]});
      }
    }
    out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(end + 1));
  }
  for (const Changed& c : changed) {
    Report(Kind::kSendBufferChanged,
           fmt::format("qp#{} {}: its local memory changed between {} and the "
                       "completion that retired it; a NIC reads the buffer while it sends (and "
                       "again for a retransmission), so the peer may have received the old bytes, "
                       "the new ones or a mix: leave a send buffer alone until its completion is "
                       "polled",
                       wc.qp_num, Describe(c.posted), c.posted.verb),
           CaptureStack(), {{"the WR was posted here", *c.posted.posted}});
  }
}

namespace {

// The first outstanding WR `uses` says uses the object, with its QP's number.
template <typename Uses>
std::optional<std::pair<uint32_t, Posted>> FirstUser(const ibv_context* context, Uses uses) {
  std::lock_guard lock(g_mu);
  for (const auto& [key, q] : g_queues) {
    if (key.first != context) continue;
    for (const Posted& p : q.outstanding) {
      if (uses(p)) return std::pair{key.second, p};
    }
  }
  return std::nullopt;
}

}  // namespace

void Deregistering(const ibv_mr* mr) {
  auto user = FirstUser(mr->context, [mr](const Posted& p) {
    if (p.bind_mr == mr) return true;
    for (const Sge& s : p.sges) {
      if (s.lkey == mr->lkey) return true;
    }
    return false;
  });
  if (!user) return;
  const auto& [qpn, p] = *user;
  const char* outcome =
      p.bind_mr == mr
          ? "the bind will fail (a window needs a live region), or on a NIC bind a window over "
            "memory that is no longer registered"
          : "the WR will fail with a local protection error, or on a NIC read or write memory "
            "that is no longer registered";
  Report(Kind::kDeregInFlight,
         fmt::format("ibv_dereg_mr of mr lkey {:#x} ({} bytes at {}) while qp#{} {} still uses "
                     "it, posted and not yet completed: {}; wait for its completion before "
                     "deregistering",
                     mr->lkey, mr->length, mr->addr, qpn, Describe(p), outcome),
         CaptureStack(), {{"the WR was posted here", *p.posted}});
}

void DeallocatingMw(const ibv_mw* mw) {
  auto user = FirstUser(mw->context, [mw](const Posted& p) { return p.bind_mw == mw; });
  if (!user) return;
  const auto& [qpn, p] = *user;
  Report(Kind::kDeregInFlight,
         fmt::format("ibv_dealloc_mw of mw rkey {:#x} while qp#{} {} still binds it, posted and "
                     "not yet completed: the bind then fails with a bind error, or on a NIC "
                     "finds the window's resources freed or reused; wait for the bind's "
                     "completion before deallocating",
                     mw->rkey, qpn, Describe(p)),
         CaptureStack(), {{"the WR was posted here", *p.posted}});
}

void DeviceMemoryKey(uint32_t lkey, bool registered) {
  std::lock_guard lock(g_mu);
  if (registered) {
    g_device_keys.insert(lkey);
  } else if (auto it = g_device_keys.find(lkey); it != g_device_keys.end()) {
    g_device_keys.erase(it);
  }
}

}  // namespace rdmaemu::check
