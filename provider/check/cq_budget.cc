// What each CQ may be asked to hold (cq_budget.h).
#include "provider/check/cq_budget.h"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "provider/check/check.h"

namespace rdmaemu::check {
namespace {

struct Share {
  const ibv_cq* cq = nullptr;  // NULL: the queue completes into no CQ of its own
  uint64_t wrs = 0;
  bool counted = false;  // posted to: its wrs are in g_load
};

struct QpShares {
  Share send;
  Share recv;
  std::shared_ptr<const Stack> created;
};

std::mutex g_mu;
// Never freed (used at exit).
auto& g_load = *new std::map<const ibv_cq*, uint64_t>();            // guarded by g_mu
auto& g_shares = *new std::map<const ibv_qp*, QpShares>();          // guarded by g_mu
auto& g_reported = *new std::set<const ibv_cq*>();                  // guarded by g_mu

}  // namespace

void CqBudgetQpCreated(const ibv_qp* qp, const ibv_qp_init_attr_ex& requested) {
  QpShares shares;
  if (qp->send_cq != nullptr) shares.send = {qp->send_cq, requested.cap.max_send_wr};
  if (qp->recv_cq != nullptr && qp->srq == nullptr &&
      !(requested.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE)) {
    shares.recv = {qp->recv_cq, requested.cap.max_recv_wr};
  }
  shares.created = std::make_shared<const Stack>(CaptureStack());
  std::lock_guard lock(g_mu);
  g_shares[qp] = std::move(shares);
}

void CqBudgetQueueUsed(const ibv_qp* qp, bool send) {
  const ibv_cq* cq = nullptr;
  uint64_t load = 0;
  std::shared_ptr<const Stack> created;
  {
    std::lock_guard lock(g_mu);
    auto it = g_shares.find(qp);
    if (it == g_shares.end()) return;
    Share& s = send ? it->second.send : it->second.recv;
    if (s.cq == nullptr || s.counted) return;
    s.counted = true;
    load = g_load[s.cq] += s.wrs;
    if (load <= static_cast<uint64_t>(s.cq->cqe) || !g_reported.insert(s.cq).second) return;
    cq = s.cq;
    created = it->second.created;
  }
  Report(Kind::kCqTooSmall,
         fmt::format("qp#{} completes into a CQ of {} entries, but the queues completing into it "
                     "may have {} WRs outstanding (the max_send_wr of each QP that sends into "
                     "it, the max_recv_wr of each that receives into it, counted from its first "
                     "post); when the program falls behind polling the CQ overruns, the device "
                     "raises IBV_EVENT_CQ_ERR and the QPs go to error: create the CQ with cqe >= "
                     "{} (or give the QPs smaller queues)",
                     qp->qp_num, cq->cqe, load, load),
         CaptureStack(), {{fmt::format("qp#{} was created here", qp->qp_num), *created}});
}

void CqBudgetQpDestroyed(const ibv_qp* qp) {
  std::lock_guard lock(g_mu);
  auto it = g_shares.find(qp);
  if (it == g_shares.end()) return;
  for (const Share* s : {&it->second.send, &it->second.recv}) {
    if (!s->counted) continue;
    if ((g_load[s->cq] -= s->wrs) == 0) {
      g_load.erase(s->cq);
      g_reported.erase(s->cq);
    }
  }
  g_shares.erase(it);
}

}  // namespace rdmaemu::check
