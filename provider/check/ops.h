// The checker's layer over a context's fast-path ops (post_send, post_recv,
// post_srq_recv, poll_cq), installed only when the checker is on, so the
// data path of a program run without it is exactly the provider's. The
// wrappers refuse destroyed objects instead of following them (a NIC's
// library would crash or corrupt), and feed sends.h. Also the hooks for QP
// creation and destruction that the tracking needs.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace rdmaemu::check {

// After the provider's InstallOps.
void WrapOps(verbs_context* vctx);

// After a CQ's creation: its ibv_start_poll and ibv_next_poll feed the send
// tracking as ibv_poll_cq does.
void WrapCqEx(ibv_cq_ex* cq);

// `requested` as the program passed it (before the provider rounded the
// capacities up); `qp` created from it, with `max_send_wr` send slots. A QP
// of the extended post API gets its wr_complete wrapped, so its batches are
// tracked as ibv_post_send's chains are.
void QpCreated(ibv_qp* qp, const ibv_qp_init_attr_ex& requested, uint32_t max_send_wr);
// Before the provider frees it.
void QpDestroyed(ibv_qp* qp);

}  // namespace rdmaemu::check
