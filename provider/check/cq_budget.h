// cq-too-small: a CQ into which its QPs' queues may complete more WRs than
// it holds. A NIC writes a completion for every receive and every signaled
// send; when the program falls behind polling, a CQ smaller than what may be
// outstanding overruns, the device raises IBV_EVENT_CQ_ERR and the QPs go to
// error -- only under load, so tests at low rate never see it. The sum of
// max_send_wr (of QPs sending into the CQ) and max_recv_wr (receiving into
// it, without an SRQ) against the CQ's cqe, each queue counted from its
// first post: a queue never posted to completes nothing (an RDMA WRITE
// benchmark's receive queue), and counting it would report correct programs.
#pragma once

#include <infiniband/verbs.h>

namespace rdmaemu::check {

void CqBudgetQpCreated(const ibv_qp* qp, const ibv_qp_init_attr_ex& requested);
void CqBudgetQpDestroyed(const ibv_qp* qp);

// Before each post on `qp`'s send queue (`send`) or receive queue.
void CqBudgetQueueUsed(const ibv_qp* qp, bool send);

}  // namespace rdmaemu::check
