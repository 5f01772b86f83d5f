// Completion queues: creation, the poll paths (classic and extended), arming.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <new>
#include <utility>
#include <vector>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
#include "emulator/net/loop.h"
#include "provider/domain.h"
#include "provider/handles.h"
#include "provider/check/check.h"
#include "provider/check/quarantine.h"
#include "provider/check/sends.h"
#include "provider/object_slot.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {

namespace {
// Whether this thread's last wait for a completion event had to wait (the
// channel was empty): it then comes back to ibv_get_cq_event after
// re-arming, so ibv_req_notify_cq need not hand the network to the
// engine's thread (which would wake for the next datagram first). A thread
// that reads events only once its own poll or epoll says the channel is
// ready never waits here, and its arming hands the network over at once,
// as before.
thread_local bool waits_for_events = false;

// The device numbers statuses and opcodes as libibverbs does.
static_assert(static_cast<int>(objects::WcStatus::kGeneralErr) == IBV_WC_GENERAL_ERR);
static_assert(static_cast<int>(objects::WcStatus::kRnrRetryExcErr) == IBV_WC_RNR_RETRY_EXC_ERR);
static_assert(static_cast<int>(objects::WcOpcode::kRecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<int>(objects::WcOpcode::kFetchAdd) == IBV_WC_FETCH_ADD);
static_assert(objects::kWcWithInv == uint32_t{IBV_WC_WITH_INV} && objects::kWcGrh == uint32_t{IBV_WC_GRH});
static_assert(static_cast<int>(objects::WcOpcode::kTmAdd) == IBV_WC_TM_ADD);
static_assert(static_cast<int>(objects::WcOpcode::kTmNoTag) == IBV_WC_TM_NO_TAG);
static_assert(static_cast<int>(objects::WcStatus::kTmRndvIncomplete) == IBV_WC_TM_RNDV_INCOMPLETE);
static_assert(objects::kWcTmSyncReq == uint32_t{IBV_WC_TM_SYNC_REQ} &&
              objects::kWcTmMatch == uint32_t{IBV_WC_TM_MATCH} &&
              objects::kWcTmDataValid == uint32_t{IBV_WC_TM_DATA_VALID});

constexpr uint64_t kSupportedWcFlags = uint64_t{IBV_WC_STANDARD_FLAGS} |
                                       uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
                                       uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK} |
                                       uint64_t{IBV_WC_EX_WITH_TM_INFO};

void ToIbvWc(const objects::Cqe& c, ibv_wc* wc) {
  wc->wr_id = c.wr_id;
  wc->status = static_cast<ibv_wc_status>(c.status);
  wc->opcode = static_cast<ibv_wc_opcode>(c.opcode);
  wc->vendor_err = c.vendor_err;
  wc->byte_len = c.byte_len;
  wc->imm_data = c.imm_data;
  wc->qp_num = c.qp_num;
  wc->src_qp = c.src_qp;
  wc->wc_flags = c.wc_flags;
  wc->pkey_index = c.pkey_index;
  wc->slid = c.slid;
  wc->sl = c.sl;
  wc->dlid_path_bits = c.dlid_path_bits;
}

int PollOnce(objects::Cq& cq, int num_entries, ibv_wc* wc) {
  objects::Cqe batch[16];
  int total = 0;
  while (total < num_entries) {
    int want = std::min(num_entries - total, 16);
    int got = cq.Poll(want, batch);
    for (int i = 0; i < got; ++i) ToIbvWc(batch[i], &wc[total + i]);
    total += got;
    if (got < want) break;
  }
  return total;
}

// A poll of an empty CQ runs the device's receive side on the polling
// thread (DESIGN.md, "The fast path"): a program spinning on its CQ is its
// own engine, with no thread hand-off between the datagram and the CQE.
// When another thread is driving, the poller yields the CPU instead: on a
// small machine it may be the one the driver needs.
bool DriveEmpty(ibv_context* context) {
  if (ToContext(context)->engine->DriveForPoll()) return true;
  sched_yield();
  return false;
}

// A poll that took completions may give the receive side back to the
// engine's thread (Engine::TookCompletions).
void TookCompletions(ibv_context* context, bool took_receive) {
  ToContext(context)->engine->TookCompletions(took_receive);
}
// Every receive-side opcode has IBV_WC_RECV's bit (enum ibv_wc_opcode).
bool IsReceive(uint32_t opcode) { return (opcode & IBV_WC_RECV) != 0; }

int PollCq(ibv_cq* ibv, int num_entries, ibv_wc* wc) {
  if (num_entries < 0) return -1;
  objects::Cq& cq = *ToCq(ibv)->cq;
  int total = PollOnce(cq, num_entries, wc);
  if (total == 0 && num_entries > 0 && DriveEmpty(ibv->context)) total = PollOnce(cq, num_entries, wc);
  if (total > 0) {
    bool took_receive = false;
    for (int i = 0; i < total; ++i) took_receive |= IsReceive(wc[i].opcode);
    TookCompletions(ibv->context, took_receive);
  }
  return total;
}

// A CQ created without a completion channel has nowhere to deliver the
// event it would be armed for; refused rather than armed for nothing, so
// that the program learns its events can never come.
int ReqNotifyCq(ibv_cq* ibv, int solicited_only) {
  if (LiveHandle(ibv, Kind::kCq, "ibv_req_notify_cq") == nullptr) return EINVAL;
  if (ibv->channel == nullptr) {
    Log().warn("ibv_req_notify_cq: cq#{} was created without a completion channel, so no "
               "completion event can ever be delivered for it; pass one to ibv_create_cq",
               ToCq(ibv)->number);
    return EINVAL;
  }
  ToCq(ibv)->cq->Arm(solicited_only != 0);
  // Arming says the program is going to sleep until an event: the engine's
  // thread must watch the network from now on, not wait for a poll. Unless
  // this thread waits in ibv_get_cq_event, which watches it itself.
  if (!waits_for_events) ToContext(ibv->context)->engine->Release();
  return 0;
}

// Extended polling (ibv_start_poll / ibv_next_poll / ibv_end_poll).
void LoadCurrent(Cq* cq) {
  cq->ibv.wr_id = cq->current.wr_id;
  cq->ibv.status = static_cast<ibv_wc_status>(cq->current.status);
  if (IsReceive(static_cast<uint32_t>(cq->current.opcode))) cq->took_receive = true;
}

int StartPoll(ibv_cq_ex* ibv, ibv_poll_cq_attr* attr) {
  Cq* cq = ToCq(ibv);
  if (attr != nullptr && attr->comp_mask != 0) return EINVAL;
  cq->poll_mu.lock();
  if (!cq->cq->Peek(&cq->current)) {
    cq->poll_mu.unlock();
    // As in PollCq; the lock is not held while driving, which pushes CQEs.
    if (!DriveEmpty(ibv->context)) return ENOENT;
    cq->poll_mu.lock();
    if (!cq->cq->Peek(&cq->current)) {
      cq->poll_mu.unlock();
      return ENOENT;
    }
  }
  LoadCurrent(cq);
  return 0;
}

int NextPoll(ibv_cq_ex* ibv) {
  Cq* cq = ToCq(ibv);
  cq->cq->Pop();
  if (!cq->cq->Peek(&cq->current)) return ENOENT;
  LoadCurrent(cq);
  return 0;
}

void EndPoll(ibv_cq_ex* ibv) {
  Cq* cq = ToCq(ibv);
  cq->cq->Pop();
  const bool took_receive = std::exchange(cq->took_receive, false);
  cq->poll_mu.unlock();
  TookCompletions(ibv->context, took_receive);
}

enum ibv_wc_opcode ReadOpcode(ibv_cq_ex* c) { return static_cast<ibv_wc_opcode>(ToCq(c)->current.opcode); }
uint32_t ReadVendorErr(ibv_cq_ex* c) { return ToCq(c)->current.vendor_err; }
uint32_t ReadByteLen(ibv_cq_ex* c) { return ToCq(c)->current.byte_len; }
__be32 ReadImmData(ibv_cq_ex* c) { return ToCq(c)->current.imm_data; }
uint32_t ReadQpNum(ibv_cq_ex* c) { return ToCq(c)->current.qp_num; }
uint32_t ReadSrcQp(ibv_cq_ex* c) { return ToCq(c)->current.src_qp; }
unsigned int ReadWcFlags(ibv_cq_ex* c) { return ToCq(c)->current.wc_flags; }
uint32_t ReadSlid(ibv_cq_ex* c) { return ToCq(c)->current.slid; }
uint8_t ReadSl(ibv_cq_ex* c) { return ToCq(c)->current.sl; }
uint8_t ReadDlidPathBits(ibv_cq_ex* c) { return ToCq(c)->current.dlid_path_bits; }
// A field the CQ was not created to carry is not in a NIC's CQE: what the
// program reads is then whatever the CQE held. Here it is 0, with a line.
bool Carries(Cq* cq, uint64_t flag, const char* reader) {
  if (cq->wc_flags & flag) return true;
  RDMAEMU_WARN_LIMITED("{}: cq#{} was created without {} in wc_flags, so its completions carry "
                       "no such field; 0 is returned", reader, cq->number,
                       flag == IBV_WC_EX_WITH_COMPLETION_TIMESTAMP ? "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP"
                       : flag == IBV_WC_EX_WITH_TM_INFO ? "IBV_WC_EX_WITH_TM_INFO"
                                                         : "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK");
  return false;
}
uint64_t ReadCompletionTs(ibv_cq_ex* c) {
  Cq* cq = ToCq(c);
  if (!Carries(cq, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, "ibv_wc_read_completion_ts")) return 0;
  return cq->current.timestamp;
}
uint64_t ReadCompletionWallclockNs(ibv_cq_ex* c) {
  Cq* cq = ToCq(c);
  if (!Carries(cq, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
               "ibv_wc_read_completion_wallclock_ns")) {
    return 0;
  }
  return cq->current.wallclock_ns;
}
// Not supported (creation refuses these flags); present so no slot is NULL.
uint16_t ReadCvlan(ibv_cq_ex*) { return 0; }
uint32_t ReadFlowTag(ibv_cq_ex*) { return 0; }
// The TMH's tag and app_ctx of a tag-matching receive; 0 for any other
// completion (a list operation, a plain receive, a send).
void ReadTmInfo(ibv_cq_ex* c, ibv_wc_tm_info* info) {
  Cq* cq = ToCq(c);
  *info = ibv_wc_tm_info{};
  if (!Carries(cq, IBV_WC_EX_WITH_TM_INFO, "ibv_wc_read_tm_info")) return;
  info->tag = cq->current.tm_tag;
  info->priv = cq->current.tm_priv;
}

int ModifyCq(ibv_cq* ibv, ibv_modify_cq_attr*) {
  if (LiveHandle(ibv, Kind::kCq, "ibv_modify_cq") == nullptr) return EINVAL;
  return EOPNOTSUPP;
}

}  // namespace

void InstallCqOps(verbs_context* vctx) {
  vctx->context.ops.poll_cq = PollCq;
  vctx->context.ops.req_notify_cq = ReqNotifyCq;
  vctx->modify_cq = ModifyCq;
}

Result<ibv_cq_ex*> CreateCq(ibv_context* context, const ibv_cq_init_attr_ex& attr) {
  if (Status dead = DeadDevice(context, "ibv_create_cq"); !dead.ok()) return dead;
  if (attr.cqe < 1 || attr.cqe > static_cast<uint32_t>(device::kMaxCqe)) {
    Log().warn("ibv_create_cq: cqe={} is outside 1..{} (max_cqe)", attr.cqe, device::kMaxCqe);
    return InvalidArgument("cqe out of range");
  }
  if (attr.comp_vector >= static_cast<uint32_t>(context->num_comp_vectors)) {
    Log().warn("ibv_create_cq: comp_vector={} but the context has {} completion vectors",
               attr.comp_vector, context->num_comp_vectors);
    return InvalidArgument("comp_vector out of range");
  }
  if (attr.channel != nullptr &&
      !HandleOf(attr.channel, Kind::kCompChannel, context, "ibv_create_cq", "the completion channel")) {
    return InvalidArgument("not a completion channel of this context");
  }
  if (attr.wc_flags & ~kSupportedWcFlags) {
    Log().warn("ibv_create_cq_ex: wc_flags {:#x} are not supported (supported: {:#x})",
               attr.wc_flags & ~kSupportedWcFlags, kSupportedWcFlags);
    return NotSupported("wc_flags");
  }
  if (attr.comp_mask & ~(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) {
    return NotSupported("comp_mask");
  }
  if ((attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (attr.flags & ~(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN))) {
    return NotSupported("flags");
  }
  Pd* parent_domain = nullptr;
  if (attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    auto pd = CqParentDomain(context, attr.parent_domain);
    if (!pd.ok()) return pd.status();
    parent_domain = *pd;
  }
  ObjectSlot slot(*ToContext(context)->device, ObjectSlot::Limited::kCq, "ibv_create_cq");
  if (!slot.ok()) return NoMemory("max_cq");

  auto* cq = new Cq{};
  ibv_cq* base = reinterpret_cast<ibv_cq*>(&cq->ibv);
  uint32_t stamps = 0;
  if (attr.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) stamps |= objects::kStampCoreClock;
  if (attr.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) stamps |= objects::kStampWallclock;
  if (parent_domain != nullptr) cq->memory = BufferMemory(*parent_domain, kCqRingResourceType);
  try {
    cq->cq = std::make_unique<objects::Cq>(
        attr.cqe,
        [base] {
          if (base->channel != nullptr && Hooks().completion != nullptr) Hooks().completion(base);
        },
        reinterpret_cast<uint64_t>(base), stamps,
        cq->memory ? cq->memory.get() : std::pmr::get_default_resource());
  } catch (const std::bad_alloc&) {
    delete cq;
    return NoMemory("no memory for the CQ's ring");
  }
  if (check::On()) {
    // send-buffer-changed compares a send WR's memory when the device is
    // done with it, as well as at the poll (sends.h).
    cq->cq->set_observer([context](const objects::Cqe& cqe) {
      if (cqe.status == objects::WcStatus::kSuccess &&
          static_cast<unsigned>(cqe.opcode) < static_cast<unsigned>(objects::WcOpcode::kRecv)) {
        check::SendProduced(context, cqe.qp_num, cqe.wr_id);
      }
    });
  }
  cq->wc_flags = attr.wc_flags;
  cq->ibv.context = context;
  cq->ibv.cqe = static_cast<int>(attr.cqe);
  cq->ibv.start_poll = StartPoll;
  cq->ibv.next_poll = NextPoll;
  cq->ibv.end_poll = EndPoll;
  cq->ibv.read_opcode = ReadOpcode;
  cq->ibv.read_vendor_err = ReadVendorErr;
  cq->ibv.read_byte_len = ReadByteLen;
  cq->ibv.read_imm_data = ReadImmData;
  cq->ibv.read_qp_num = ReadQpNum;
  cq->ibv.read_src_qp = ReadSrcQp;
  cq->ibv.read_wc_flags = ReadWcFlags;
  cq->ibv.read_slid = ReadSlid;
  cq->ibv.read_sl = ReadSl;
  cq->ibv.read_dlid_path_bits = ReadDlidPathBits;
  cq->ibv.read_completion_ts = ReadCompletionTs;
  cq->ibv.read_completion_wallclock_ns = ReadCompletionWallclockNs;
  cq->ibv.read_cvlan = ReadCvlan;
  cq->ibv.read_flow_tag = ReadFlowTag;
  cq->ibv.read_tm_info = ReadTmInfo;
  auto number = ToContext(context)->device->directory().Add(objects::ObjectKind::kCq,
                                                            reinterpret_cast<uint64_t>(base));
  if (!number.ok()) {
    Log().warn("ibv_create_cq: {}", number.status().message());
    delete cq;
    return number.status();
  }
  cq->number = *number;
  cq->parent_domain = parent_domain;
  if (parent_domain != nullptr) ++parent_domain->users;
  AddHandle(base, Kind::kCq, context);
  slot.Keep();
  return &cq->ibv;
}

int ResizeCq(ibv_cq* ibv, int cqe) {
  if (Status dead = DeadDevice(ibv->context, "ibv_resize_cq"); !dead.ok()) return dead.code();
  if (cqe < 1 || cqe > device::kMaxCqe) {
    Log().warn("ibv_resize_cq: cqe={} is outside 1..{}", cqe, device::kMaxCqe);
    return EINVAL;
  }
  Status s = ToCq(ibv)->cq->Resize(static_cast<uint32_t>(cqe));
  if (!s.ok()) {
    Log().warn("ibv_resize_cq: {}", s.message());
    return s.code();
  }
  ibv->cqe = cqe;
  return 0;
}

int DetachCq(ibv_cq* ibv) {
  // The engine completes into a CQ only through its QPs, so a CQ no QP
  // uses receives nothing more.
  if (int users = ToCq(ibv)->users.load(); users != 0) {
    Log().warn("ibv_destroy_cq: {} send or receive queue(s) of QPs still complete into this CQ; destroy "
               "the QPs first",
               users);
    return EBUSY;
  }
  // From here no control-plane event can name it (Remove waits for one
  // being raised), so the queued events libibverbs discards next are all.
  ToContext(ibv->context)->device->directory().Remove(objects::ObjectKind::kCq, ToCq(ibv)->number);
  RetireHandle(ibv);
  return 0;
}

void AwaitCompletionEvent(ibv_context* context, int channel_fd,
                          const std::atomic<size_t>& queued) {
  engine::Engine& engine = *ToContext(context)->engine;
  engine.NoteEventWait();
  engine.Drive();
  thread_local std::vector<int> sockets;
  const bool event_there = queued.load(std::memory_order_acquire) > 0;
  if (event_there && waits_for_events) {
    // An event is there already (two came close together) for a thread
    // that waits here: it comes back soon, so it keeps the network. Were it
    // handed to the loop thread now, the next wait would find the loop
    // thread reading the sockets and have to take them back.
    return;
  }
  const int flags = ::fcntl(channel_fd, F_GETFL);
  const bool blocking = flags >= 0 && !(flags & O_NONBLOCK);
  if (!blocking || event_there || !engine.BeginWait(&sockets)) {
    // No wait (an event is there, or the program reads without blocking),
    // or the engine's thread keeps the network: as a program that polls
    // the channel itself first.
    waits_for_events = false;
    engine.Release();
    return;
  }
  waits_for_events = true;
  const std::chrono::microseconds spin = engine.wait_spin();
  pollfd fds[1 + net::kMaxSockets];
  fds[0] = {channel_fd, POLLIN, 0};
  const nfds_t n = 1 + std::min<size_t>(sockets.size(), net::kMaxSockets);
  for (nfds_t i = 1; i < n; ++i) fds[i] = {sockets[i - 1], POLLIN, 0};
  for (;;) {
    // First without sleeping, for the engine's wait_spin: a datagram that
    // comes meanwhile wakes no sleeping thread.
    int ready = 0;
    if (spin.count() > 0) {
      const auto until = std::chrono::steady_clock::now() + spin;
      do {
        ready = ::poll(fds, n, 0);
      } while (ready == 0 && std::chrono::steady_clock::now() < until);
    }
    if (ready == 0) ready = ::poll(fds, n, -1);
    if (ready < 0) break;  // a signal: the read that follows sees it as before
    if (fds[0].revents != 0) break;
    // A socket closed under the wait (the device closed while a thread
    // waited on it, which no program may do): block on the channel alone.
    bool closed = false;
    for (nfds_t i = 1; i < n; ++i) closed = closed || (fds[i].revents & POLLNVAL) != 0;
    if (closed) break;
    // A datagram: handled here. If another thread is driving (it takes
    // it), or (io_uring) the loop thread has not handed the socket over
    // yet, yield: either finishes its round meanwhile. When the round
    // queued an event, the read finds it without another poll.
    if (!engine.Drive()) {
      ::sched_yield();
    } else if (queued.load(std::memory_order_acquire) > 0) {
      break;
    }
  }
  engine.EndWait();
}

bool CqArmed(ibv_cq* ibv) { return ToCq(ibv)->cq->armed(); }

void FreeCq(ibv_cq* ibv) {
  RemoveHandle(ibv);
  ToContext(ibv->context)->device->ReturnObject(device::Device::Limited::kCq);
  // The ring goes back to the parent domain's allocator first.
  Pd* parent_domain = ToCq(ibv)->parent_domain;
  check::Dispose(ToCq(ibv));
  if (parent_domain != nullptr) --parent_domain->users;
}

}  // namespace rdmaemu::provider
