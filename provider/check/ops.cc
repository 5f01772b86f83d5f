// The checker's op wrappers (ops.h).
#include "provider/check/ops.h"

#include <atomic>
#include <cerrno>

#include "provider/check/check.h"
#include "provider/check/cq_budget.h"
#include "provider/check/sends.h"
#include "provider/handles.h"
#include "provider/provider.h"

namespace rdmaemu::check {
namespace {

using provider::Kind;
using provider::LiveHandle;

// The provider's ops, the same for every context (one driver).
int (*g_post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr**) = nullptr;
int (*g_post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
int (*g_post_srq_recv)(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
int (*g_poll_cq)(ibv_cq*, int, ibv_wc*) = nullptr;
// The extended API's, the same for every QP and CQ (set before any wrapper runs).
std::atomic<int (*)(ibv_qp_ex*)> g_wr_complete{nullptr};
std::atomic<void (*)(ibv_qp_ex*)> g_wr_abort{nullptr};
std::atomic<int (*)(ibv_cq_ex*, ibv_poll_cq_attr*)> g_start_poll{nullptr};
std::atomic<int (*)(ibv_cq_ex*)> g_next_poll{nullptr};

int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  if (LiveHandle(qp, Kind::kQp, "ibv_post_send") == nullptr) {
    *bad_wr = wr;
    return EINVAL;
  }
  CqBudgetQueueUsed(qp, true);
  SendPost post(qp, wr, CaptureStack());
  *bad_wr = nullptr;
  int rc = 0;
  if (!post.room()) {
    rc = ENOMEM;
    *bad_wr = wr;
  } else {
    rc = g_post_send(qp, wr, bad_wr);
  }
  post.Finish(rc, *bad_wr);
  return rc;
}

int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (LiveHandle(qp, Kind::kQp, "ibv_post_recv") == nullptr) {
    *bad_wr = wr;
    return EINVAL;
  }
  CqBudgetQueueUsed(qp, false);
  return g_post_recv(qp, wr, bad_wr);
}

int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (LiveHandle(srq, Kind::kSrq, "ibv_post_srq_recv") == nullptr) {
    *bad_wr = wr;
    return EINVAL;
  }
  return g_post_srq_recv(srq, wr, bad_wr);
}

// The batch's WRs are known only to the provider until it posts them:
// taken as a chain first, then handled as ibv_post_send's.
int WrComplete(ibv_qp_ex* qpx) {
  ibv_qp* qp = &qpx->qp_base;
  CqBudgetQueueUsed(qp, true);
  provider::BatchSends batch = provider::OpenBatch(qpx);
  const ibv_send_wr* chain = batch.wrs.empty() ? nullptr : batch.wrs.data();
  SendPost post(qp, chain, CaptureStack(), batch.wrs.size(), "ibv_wr_complete");
  int rc = 0;
  if (!post.room()) {
    rc = ENOMEM;
    g_wr_abort.load()(qpx);  // a failed batch is aborted whole (man ibv_wr_post)
  } else {
    rc = g_wr_complete.load()(qpx);
  }
  post.Finish(rc, rc != 0 ? chain : nullptr);
  return rc;
}

// The completion ibv_start_poll/ibv_next_poll made current, as ibv_poll_cq
// would have returned it.
void PolledEx(ibv_cq_ex* cq) {
  ibv_wc wc{};
  wc.wr_id = cq->wr_id;
  wc.status = cq->status;
  wc.opcode = cq->read_opcode(cq);
  wc.qp_num = cq->read_qp_num(cq);
  if (!(wc.opcode & IBV_WC_RECV) || wc.status != IBV_WC_SUCCESS) {
    SendCompleted(cq->context, wc);
  }
}

int StartPoll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  int rc = g_start_poll.load()(cq, attr);
  if (rc == 0) PolledEx(cq);
  return rc;
}

int NextPoll(ibv_cq_ex* cq) {
  int rc = g_next_poll.load()(cq);
  if (rc == 0) PolledEx(cq);
  return rc;
}

int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  // A NIC's poll reads a freed ring: -1 is what libmlx5 returns for a bad CQ.
  if (LiveHandle(cq, Kind::kCq, "ibv_poll_cq") == nullptr) return -1;
  int n = g_poll_cq(cq, num_entries, wc);
  for (int i = 0; i < n; ++i) {
    // Receive opcodes have IBV_WC_RECV's bit; a flushed receive says
    // nothing of the send queue either way.
    if (!(wc[i].opcode & IBV_WC_RECV) || wc[i].status != IBV_WC_SUCCESS) {
      SendCompleted(cq->context, wc[i]);
    }
  }
  return n;
}

}  // namespace

void WrapOps(verbs_context* vctx) {
  ibv_context_ops& ops = vctx->context.ops;
  g_post_send = ops.post_send;
  g_post_recv = ops.post_recv;
  g_post_srq_recv = ops.post_srq_recv;
  g_poll_cq = ops.poll_cq;
  ops.post_send = PostSend;
  ops.post_recv = PostRecv;
  ops.post_srq_recv = PostSrqRecv;
  ops.poll_cq = PollCq;
}

void WrapCqEx(ibv_cq_ex* cq) {
  if (cq->start_poll == StartPoll) return;
  g_start_poll.store(cq->start_poll);
  g_next_poll.store(cq->next_poll);
  cq->start_poll = StartPoll;
  cq->next_poll = NextPoll;
}

void QpCreated(ibv_qp* qp, const ibv_qp_init_attr_ex& requested, uint32_t max_send_wr) {
  TrackQp(qp, requested.sq_sig_all != 0, max_send_wr);
  CqBudgetQpCreated(qp, requested);
  if (ibv_qp_ex* qpx = provider::QpToQpEx(qp); qpx != nullptr && qpx->wr_complete != WrComplete) {
    g_wr_complete.store(qpx->wr_complete);
    g_wr_abort.store(qpx->wr_abort);
    qpx->wr_complete = WrComplete;
  }
}

void QpDestroyed(ibv_qp* qp) {
  ForgetQp(qp);
  CqBudgetQpDestroyed(qp);
}

}  // namespace rdmaemu::check
