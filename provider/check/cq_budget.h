// cq-too-small: a CQ into which its QPs' queues may complete more WRs than
// it holds. A NIC writes a completion for every receive and every signaled
// send; when the program falls behind polling, a CQ smaller than what may be
// outstanding overruns, the device raises IBV_EVENT_CQ_ERR and the QPs go to
// error -- only under load, so tests at low rate never see it. Checked when
// a QP is created: the sum of max_send_wr (of QPs sending into the CQ) and
// max_recv_wr (receiving into it, without an SRQ) against the CQ's cqe.
#pragma once

#include <infiniband/verbs.h>

namespace rdmaemu::check {

void CqBudgetQpCreated(const ibv_qp* qp, const ibv_qp_init_attr_ex& requested);
void CqBudgetQpDestroyed(const ibv_qp* qp);

}  // namespace rdmaemu::check
