// What each CQ may be asked to hold (cq_budget.h).
#include "provider/check/cq_budget.h"

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "provider/check/check.h"

namespace rdmaemu::check {
namespace {

struct Share {
  const ibv_cq* cq;
  uint64_t wrs;
};

std::mutex g_mu;
// Never freed (used at exit).
auto& g_load = *new std::map<const ibv_cq*, uint64_t>();                 // guarded by g_mu
auto& g_shares = *new std::map<const ibv_qp*, std::vector<Share>>();     // guarded by g_mu
auto& g_reported = *new std::set<const ibv_cq*>();                       // guarded by g_mu

}  // namespace

void CqBudgetQpCreated(const ibv_qp* qp, const ibv_qp_init_attr_ex& requested) {
  std::vector<Share> shares;
  if (qp->send_cq != nullptr) shares.push_back({qp->send_cq, requested.cap.max_send_wr});
  if (qp->recv_cq != nullptr && qp->srq == nullptr &&
      !(requested.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE)) {
    shares.push_back({qp->recv_cq, requested.cap.max_recv_wr});
  }
  std::vector<std::pair<const ibv_cq*, uint64_t>> over;
  {
    std::lock_guard lock(g_mu);
    for (const Share& s : shares) {
      uint64_t load = g_load[s.cq] += s.wrs;
      if (load > static_cast<uint64_t>(s.cq->cqe) && g_reported.insert(s.cq).second) {
        over.emplace_back(s.cq, load);
      }
    }
    g_shares[qp] = std::move(shares);
  }
  for (const auto& [cq, load] : over) {
    Report(Kind::kCqTooSmall,
           fmt::format("qp#{} completes into a CQ of {} entries, but the QPs completing into it "
                       "may have {} WRs outstanding (each QP's max_send_wr for its send CQ, "
                       "max_recv_wr for its receive CQ); when the program falls behind polling "
                       "the CQ overruns, the device raises IBV_EVENT_CQ_ERR and the QPs go to "
                       "error: create the CQ with cqe >= {} (or give the QPs smaller queues)",
                       qp->qp_num, cq->cqe, load, load),
           CaptureStack());
  }
}

void CqBudgetQpDestroyed(const ibv_qp* qp) {
  std::lock_guard lock(g_mu);
  auto it = g_shares.find(qp);
  if (it == g_shares.end()) return;
  for (const Share& s : it->second) {
    if ((g_load[s.cq] -= s.wrs) == 0) {
      g_load.erase(s.cq);
      g_reported.erase(s.cq);
    }
  }
  g_shares.erase(it);
}

}  // namespace rdmaemu::check
