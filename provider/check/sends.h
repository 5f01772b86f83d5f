// The send queues as the checker sees them: every WR a QP has posted and no
// completion has retired yet, with a checksum of the local memory a SEND or
// RDMA WRITE reads. From it come three kinds of report:
//   send-buffer-changed  the memory differs when the WR's completion (or a
//                        later one that retires it, if unsignaled) is polled;
//   unsignaled-sq-full   a post fails with ENOMEM and nothing outstanding is
//                        signaled, so no completion will ever make room;
//   dereg-in-flight      ibv_dereg_mr of an MR an outstanding WR names.
// Only the public verbs structs are read. Any thread.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "provider/check/stack.h"

namespace rdmaemu::check {

// A QP's life: what its sends are retired against.
void TrackQp(const ibv_qp* qp, bool sq_sig_all, uint32_t max_send_wr);
void ForgetQp(const ibv_qp* qp);

// A NIC frees a send queue slot only when the program polls the completion
// that retires its WR (an unsignaled WR's slot with the next signaled one);
// the device here frees it when the WR is done. With the checker on the
// post holds to the NIC's rule: false (and the post fails with ENOMEM) when
// every slot holds a WR no polled completion has retired yet (`wrs`: the
// slots a batch of ibv_wr_* needs at once).
bool HasRoom(const ibv_qp* qp, size_t wrs = 1);

// After the provider's post_send returned `rc` for the chain `wr`
// (`bad_wr` the first not posted when rc != 0). `before` are the checksums
// SumSends took of the chain before posting, in order.
struct PostedSums;
PostedSums* SumSends(const ibv_send_wr* wr);
// `verb` is what the program called: ibv_post_send, or ibv_wr_complete.
void AfterPostSend(const ibv_qp* qp, const ibv_send_wr* wr, int rc, const ibv_send_wr* bad_wr,
                   PostedSums* sums, const Stack& where, const char* verb = "ibv_post_send");

// For each send-side completion polled from a CQ of `context`.
void SendCompleted(const ibv_context* context, const ibv_wc& wc);

// Before ibv_dereg_mr of `mr`.
void Deregistering(const ibv_mr* mr);

// A region over device memory (ibv_reg_dm_mr) was registered or is gone:
// an SGE with its lkey holds an offset into the device's memory, not an
// address of the program's, so a WR naming it is not summed. Keyed by lkey
// alone: a host region of another device with the same lkey goes unsummed
// too (a report missed, never a false one).
void DeviceMemoryKey(uint32_t lkey, bool registered);

}  // namespace rdmaemu::check
