// The send queues as the checker sees them: every WR a QP has posted and no
// completion has retired yet, with a checksum of the local memory a SEND or
// RDMA WRITE reads. From it come three kinds of report:
//   send-buffer-changed  the memory differs when the device produces the WR's
//                        completion (or a later one that retires it, if
//                        unsignaled), checked when the program polls it;
//   unsignaled-sq-full   a post fails with ENOMEM and nothing outstanding is
//                        signaled, so no completion will ever make room;
//   dereg-in-flight      ibv_dereg_mr of an MR an outstanding WR names,
//                        ibv_dealloc_mw of a window an outstanding bind names.
// Only the public verbs structs are read. Any thread.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include "provider/check/stack.h"

namespace rdmaemu::check {

// A QP's life: what its sends are retired against.
void TrackQp(const ibv_qp* qp, bool sq_sig_all, uint32_t max_send_wr);
void ForgetQp(const ibv_qp* qp);

// One ibv_post_send (or ibv_wr_complete) as the checker sees it. The device
// may send, be acknowledged and complete a WR before the provider's post
// returns, and another thread may poll that completion at once, so each WR
// is recorded as outstanding (with the checksum of the memory a SEND or RDMA
// WRITE reads) before the provider posts, and what it did not post is taken
// back after. The QP's posts are serialized from construction to Finish, so
// the records keep the order the device sees.
//
// A NIC frees a send queue slot only when the program polls the completion
// that retires its WR (an unsignaled WR's slot with the next signaled one);
// the device here frees it when the WR is done. With the checker on the post
// holds to the NIC's rule: room() is false (and the caller fails the post
// with ENOMEM, posting nothing) when `needed` slots (ibv_post_send: 1, the
// provider fails the rest of a chain itself; a batch of ibv_wr_*: all) are
// not free beside the WRs no polled completion has retired yet.
class SendPost {
 public:
  // `wr`: the chain about to be posted; `verb` what the program called.
  SendPost(const ibv_qp* qp, const ibv_send_wr* wr, const Stack& where, size_t needed = 1,
           const char* verb = "ibv_post_send");
  ~SendPost();
  SendPost(const SendPost&) = delete;
  SendPost& operator=(const SendPost&) = delete;

  bool room() const { return room_; }
  // After the provider's post returned `rc` (`bad_wr` the first WR not
  // posted when rc != 0; null: none was). Call once.
  void Finish(int rc, const ibv_send_wr* bad_wr);

 private:
  struct State;
  std::unique_ptr<State> state_;
  bool room_ = true;
};

// When the device produces a successful send-side completion on a CQ of
// `context` (before the program can poll it): the WRs it retires are summed
// again now. Memory unchanged now is what the device sent, for good: a
// change after this (a receive landing in the buffer, the program reusing
// it before polling) is not reported at the poll.
void SendProduced(const ibv_context* context, uint32_t qp_num, uint64_t wr_id);

// For each send-side completion polled from a CQ of `context`.
void SendCompleted(const ibv_context* context, const ibv_wc& wc);

// Before ibv_dereg_mr of `mr`: dereg-in-flight if an outstanding WR reads
// or writes it, or binds a window over it.
void Deregistering(const ibv_mr* mr);
// Before ibv_dealloc_mw of `mw` (a live handle): dereg-in-flight if an
// outstanding bind WR names it.
void DeallocatingMw(const ibv_mw* mw);

// A region over device memory (ibv_reg_dm_mr) was registered or is gone:
// an SGE with its lkey holds an offset into the device's memory, not an
// address of the program's, so a WR naming it is not summed. Keyed by lkey
// alone: a host region of another device with the same lkey goes unsummed
// too (a report missed, never a false one).
void DeviceMemoryKey(uint32_t lkey, bool registered);

}  // namespace rdmaemu::check
