// Completion queue: the ring the device writes completions into and the
// application polls, with one-shot arming for completion events.
//
// Thread safety: the engine thread pushes, application threads poll, arm
// and resize; all under mu_ (uncontended in the common case, and never a
// system call). The notifier runs after mu_ is released, so an event is
// never delivered before its completion is visible to Poll.
#pragma once

#include <cstdint>
#include <functional>
#include <memory_resource>
#include <mutex>
#include <utility>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::objects {

// Numbered as libibverbs numbers enum ibv_wc_status and enum ibv_wc_opcode.
enum class WcStatus : uint8_t {
  kSuccess = 0, kLocLenErr, kLocQpOpErr, kLocEecOpErr, kLocProtErr, kWrFlushErr,
  kMwBindErr, kBadRespErr, kLocAccessErr, kRemInvReqErr, kRemAccessErr, kRemOpErr,
  kRetryExcErr, kRnrRetryExcErr, kLocRddViolErr, kRemInvRdReqErr, kRemAbortErr,
  kInvEecnErr, kInvEecStateErr, kFatalErr, kRespTimeoutErr, kGeneralErr,
  // Tag matching: a list operation that failed (a TAG_DEL whose tag a
  // message consumed), a rendezvous whose data could not be read.
  kTmErr, kTmRndvIncomplete,
};

enum class WcOpcode : uint8_t {
  kSend = 0, kRdmaWrite = 1, kRdmaRead = 2, kCompSwap = 3, kFetchAdd = 4, kBindMw = 5,
  kLocalInv = 6, kTso = 7, kFlush = 8, kAtomicWrite = 9,
  kRecv = 128, kRecvRdmaWithImm = 129,
  // Tag matching (a TM SRQ's CQ): list operations, then messages.
  kTmAdd = 130, kTmDel = 131, kTmSync = 132, kTmRecv = 133, kTmNoTag = 134,
};

// Flags as libibverbs' IBV_WC_GRH / IBV_WC_WITH_IMM / IBV_WC_WITH_INV.
enum WcFlags : uint32_t { kWcGrh = 1, kWcWithImm = 2, kWcIpCsumOk = 4, kWcWithInv = 8,
  // IBV_WC_TM_*: a list operation asks for a sync; a message matched a
  // tagged buffer; the buffer holds the message's data.
  kWcTmSyncReq = 16, kWcTmMatch = 32, kWcTmDataValid = 64 };

struct Cqe {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;  // network byte order, as in ibv_wc; or the invalidated rkey (host order)
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  uint16_t pkey_index = 0;
  uint16_t slid = 0;
  uint8_t sl = 0;
  uint8_t dlid_path_bits = 0;
  bool solicited = false;
  // A tag-matching receive (IBV_WC_EX_WITH_TM_INFO): the TMH's tag and
  // app_ctx (host order).
  uint64_t tm_tag = 0;
  uint32_t tm_priv = 0;
  // Set by Cq::Push, if the CQ stamps them (Stamp): when the CQE was
  // produced, in core clock ticks and in nanoseconds of wall time.
  uint64_t timestamp = 0;
  uint64_t wallclock_ns = 0;
};

// The clocks a CQ stamps its CQEs with as they are pushed (the timestamp
// flags of ibv_create_cq_ex), as a NIC writes them into the CQE it produces;
// a CQ that asked for none reads no clock.
enum Stamp : uint32_t { kStampCoreClock = 1u << 0, kStampWallclock = 1u << 1 };

class Cq {
 public:
  using Notifier = std::function<void()>;

  // `capacity` CQEs fit; the caller validated the range.
  // `handle` names the CQ in its CQ_ERR event (the provider's ibv_cq*);
  // `stamps` (Stamp bits) the clocks each pushed CQE is stamped with.
  // The ring, and the one a resize makes, comes from `memory` (a parent
  // domain's allocator); it throws std::bad_alloc when that fails.
  Cq(uint32_t capacity, Notifier notifier, uint64_t handle = 0, uint32_t stamps = 0,
     std::pmr::memory_resource* memory = std::pmr::get_default_resource());

  uint64_t handle() const { return handle_; }

  // Called by Push with each CQE it is about to make visible, before any
  // poller can see it (on the pushing thread, no lock held): the moment the
  // device is done with the WR. Set once, before the CQ is in use; unset
  // (the default), Push pays one test.
  using Observer = std::function<void(const Cqe&)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  uint32_t capacity() const;

  // Engine side: the CQE is produced now (and stamped). False when the CQ
  // is full: the CQE is lost, the CQ is in error (overrun) and the caller
  // raises CQ_ERR.
  bool Push(const Cqe& cqe);

  // Application side. Returns how many CQEs were copied into out.
  int Poll(int max, Cqe* out);
  // Looks at the oldest CQE without taking it (for the extended poll API).
  bool Peek(Cqe* out);
  // Takes the CQE the last Peek saw; nothing if RemoveQp took it meanwhile.
  void Pop();

  // One-shot: the next completion (or the next solicited one) notifies.
  void Arm(bool solicited_only);
  // Fails with EINVAL when the CQEs already queued would not fit, ENOMEM
  // when the memory resource has no new ring.
  Status Resize(uint32_t new_capacity);
  // Takes every unpolled CQE of QP (or WQ) `qp_num` out of the ring, the
  // others keeping their order; returns how many. For a QP moved to RESET,
  // as libmlx5 and libmlx4 clean the CQ then.
  size_t RemoveQp(uint32_t qp_num);

  bool overrun() const;
  // Armed and not yet fired (the checker's unarmed-wait asks).
  bool armed() const;
  // True exactly once, for the first Push that found the CQ full: the caller
  // raises CQ_ERR then.
  bool TakeOverrunNotice();
  size_t depth() const;

 private:
  enum class ArmState { kDisarmed, kNextCompletion, kSolicited };

  mutable std::mutex mu_;
  std::pmr::vector<Cqe> ring_;  // guarded by mu_
  uint64_t head_ = 0;      // guarded by mu_; next to poll
  uint64_t tail_ = 0;      // guarded by mu_; next to fill
  ArmState arm_ = ArmState::kDisarmed;  // guarded by mu_
  bool overrun_ = false;                // guarded by mu_
  bool overrun_noticed_ = false;        // guarded by mu_
  // Peek saw the head and no Pop took it yet; RemoveQp clears it when it
  // takes that CQE out, so the Pop of an extended-poll session does not
  // take the next one (the application never saw that one).
  bool peeked_ = false;  // guarded by mu_
  const Notifier notifier_;
  Observer observer_;
  const uint64_t handle_;
  const uint32_t stamps_;
};

}  // namespace rdmaemu::objects
