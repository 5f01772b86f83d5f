// Shared receive queues.
#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/device/attributes.h"
#include "emulator/engine/trace.h"
#include "provider/handles.h"
#include "provider/check/quarantine.h"
#include "provider/object_slot.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

int PostSrqRecv(ibv_srq* ibv, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  engine::Srq& srq = *ToSrq(ibv)->srq;
  std::lock_guard lock(srq.mu);
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > srq.max_sge) {
      RDMAEMU_WARN_LIMITED("ibv_post_srq_recv: num_sge {} exceeds the SRQ's max_sge {}", wr->num_sge,
                           srq.max_sge);
      *bad_wr = wr;
      return EINVAL;
    }
    if (srq.rq.size() >= srq.max_wr) {
      *bad_wr = wr;
      return ENOMEM;
    }
    srq.rq.push_back(ToRecvWqe(*wr));
    if (engine::DebugOn()) {
      Log().debug("{} srq#{} recv WR {} {} bytes", ToContext(ibv->context)->device->name(),
                  ToSrq(ibv)->number, wr->wr_id, srq.rq.back().length);
    }
  }
  return 0;
}

// A tagged buffer from an IBV_WR_TAG_ADD, or why it is refused.
Result<engine::TaggedBuffer> ToTaggedBuffer(const ibv_ops_wr& wr) {
  const auto& add = wr.tm.add;
  if (add.num_sge < 0 || add.num_sge > device::kMaxTmSge || (add.num_sge > 0 && add.sg_list == nullptr)) {
    return InvalidArgument(fmt::format("IBV_WR_TAG_ADD: num_sge {} with sg_list {}: a tagged buffer "
                                       "has 0..{} SGEs (tm_caps.max_sge)",
                                       add.num_sge, fmt::ptr(add.sg_list), device::kMaxTmSge));
  }
  engine::TaggedBuffer b;
  b.tag = add.tag;
  b.mask = add.mask;
  b.recv_wr_id = add.recv_wr_id;
  for (int i = 0; i < add.num_sge; ++i) {
    b.sges.push_back({add.sg_list[i].addr, add.sg_list[i].length, add.sg_list[i].lkey});
    b.length += add.sg_list[i].length;
  }
  return b;
}

// ibv_post_srq_ops: the matching list of a TM SRQ. Each operation is done
// as it is posted (the device has it at once); a signaled one completes on
// the SRQ's CQ, where the SRQ's messages complete too, in that order.
int PostSrqOps(ibv_srq* ibv, ibv_ops_wr* wr, ibv_ops_wr** bad_wr) {
  if (Status dead = DeadDevice(ibv->context, "ibv_post_srq_ops"); !dead.ok()) {
    *bad_wr = wr;
    return dead.code();
  }
  Srq* srq = ToSrq(ibv);
  engine::Srq& e = *srq->srq;
  if (!e.tags) {
    Log().warn("ibv_post_srq_ops: srq#{} is not a tag-matching SRQ (create it with srq_type "
               "IBV_SRQT_TM): it has no matching list",
               srq->number);
    *bad_wr = wr;
    return EINVAL;
  }
  std::lock_guard lock(e.mu);
  for (; wr != nullptr; wr = wr->next) {
    auto refuse = [&](int code, const std::string& why) {
      Log().warn("ibv_post_srq_ops: srq#{} WR {}: {}", srq->number, wr->wr_id, why);
      *bad_wr = wr;
      return code;
    };
    constexpr int kKnownFlags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
    if (wr->flags & ~kKnownFlags) {
      return refuse(EINVAL, fmt::format("flags {:#x} are none of IBV_OPS_SIGNALED, IBV_OPS_TM_SYNC",
                                        wr->flags & ~kKnownFlags));
    }
    objects::Cqe c;
    c.wr_id = wr->wr_id;
    switch (wr->opcode) {
      case IBV_WR_TAG_ADD: {
        auto buffer = ToTaggedBuffer(*wr);
        if (!buffer.ok()) return refuse(EINVAL, buffer.status().message());
        // The count the software reports is applied before the tag joins.
        if (wr->flags & IBV_OPS_TM_SYNC) e.tags->Sync(wr->tm.unexpected_cnt);
        auto handle = e.tags->Add(std::move(*buffer));
        if (!handle.ok()) return refuse(ENOMEM, handle.status().message());
        wr->tm.handle = *handle;
        c.opcode = objects::WcOpcode::kTmAdd;
        // Unexpected messages arrived that the software had not counted
        // when it posted this tag: it may be for one of them, so the
        // software must look at them and sync before matching resumes.
        if (wr->tm.unexpected_cnt != e.tags->unexpected()) c.wc_flags |= objects::kWcTmSyncReq;
        break;
      }
      case IBV_WR_TAG_DEL: {
        Status s = e.tags->Remove(wr->tm.handle);
        if (!s.ok()) return refuse(EINVAL, fmt::format("IBV_WR_TAG_DEL: {}", s.message()));
        if (wr->flags & IBV_OPS_TM_SYNC) e.tags->Sync(wr->tm.unexpected_cnt);
        c.opcode = objects::WcOpcode::kTmDel;
        break;
      }
      case IBV_WR_TAG_SYNC:
        // The operation is the sync: its count is always applied.
        e.tags->Sync(wr->tm.unexpected_cnt);
        c.opcode = objects::WcOpcode::kTmSync;
        break;
      default:
        return refuse(EINVAL, fmt::format("opcode {} is none of IBV_WR_TAG_ADD, _DEL, _SYNC",
                                          static_cast<int>(wr->opcode)));
    }
    if (engine::DebugOn()) {
      Log().debug("{} srq#{}: {} WR {} handle {}; unexpected {} acknowledged {}",
                  ToContext(ibv->context)->device->name(), srq->number,
                  engine::WcOpcodeName(c.opcode), wr->wr_id, wr->tm.handle, e.tags->unexpected(),
                  e.tags->acknowledged());
    }
    if (!(wr->flags & IBV_OPS_SIGNALED)) continue;
    if (!e.cq->Push(c)) {
      Log().warn("ibv_post_srq_ops: srq#{}: its CQ is full (overrun): the completion of WR {} is "
                 "lost",
                 srq->number, wr->wr_id);
    }
  }
  return 0;
}

}  // namespace

void InstallSrqOps(verbs_context* vctx) {
  vctx->context.ops.post_srq_recv = PostSrqRecv;
  vctx->post_srq_ops = PostSrqOps;
}

namespace {

// What an XRC or a tag-matching SRQ has beside a basic one: the CQ its
// receives complete on; an XRC SRQ's XRC domain; a TM SRQ's list size.
struct XrcParts {
  Xrcd* xrcd = nullptr;
  ibv_cq* cq = nullptr;
  uint32_t max_num_tags = 0;  // 0: not tag matching
};

Result<ibv_srq*> NewSrq(ibv_pd* pd, ibv_srq_init_attr* attr, const XrcParts* xrc) {
  const char* verb = xrc != nullptr ? "ibv_create_srq_ex" : "ibv_create_srq";
  if (Status dead = DeadDevice(pd->context, verb); !dead.ok()) return dead;
  const ibv_srq_attr& a = attr->attr;
  if (a.max_wr < 1 || a.max_wr > static_cast<uint32_t>(device::kMaxSrqWr) ||
      a.max_sge > static_cast<uint32_t>(device::kMaxSrqSge)) {
    Log().warn("{}: max_wr {} / max_sge {} outside the device's 1..{} / 0..{}", verb, a.max_wr,
               a.max_sge, device::kMaxSrqWr, device::kMaxSrqSge);
    return InvalidArgument("srq attributes");
  }
  ObjectSlot slot(*ToContext(pd->context)->device, ObjectSlot::Limited::kSrq, verb);
  if (!slot.ok()) return NoMemory("max_srq");
  auto* srq = new Srq{};
  srq->ibv.context = pd->context;
  srq->ibv.srq_context = attr->srq_context;
  srq->ibv.pd = pd;
  pthread_mutex_init(&srq->ibv.mutex, nullptr);
  pthread_cond_init(&srq->ibv.cond, nullptr);
  srq->ibv.events_completed = 0;
  srq->srq = std::make_shared<engine::Srq>(ToPd(pd)->handle, a.max_wr, a.max_sge,
                                           reinterpret_cast<uint64_t>(&srq->ibv));
  auto number = ToContext(pd->context)->device->directory().Add(objects::ObjectKind::kSrq,
                                                                reinterpret_cast<uint64_t>(&srq->ibv));
  if (!number.ok()) {
    Log().warn("{}: {}", verb, number.status().message());
    pthread_mutex_destroy(&srq->ibv.mutex);
    pthread_cond_destroy(&srq->ibv.cond);
    delete srq;
    return number.status();
  }
  srq->number = *number;
  ++ToPd(pd)->users;
  if (xrc != nullptr) {
    // Published by number: targets find it through the XRCETH.
    srq->xrcd = xrc->xrcd;
    srq->cq = xrc->cq;
    ++ToCq(xrc->cq)->users;
    engine::Srq& e = *srq->srq;
    e.srqn = srq->number;
    e.cq = ToCq(xrc->cq)->cq.get();
    if (xrc->max_num_tags != 0) {
      // Before any QP can use it: the engine reads the pointer unlocked.
      e.tags = std::make_unique<engine::TagList>(xrc->max_num_tags);
      Log().debug("{} srq#{}: tag-matching SRQ, {} tags", ToContext(pd->context)->device->name(),
                  srq->number, xrc->max_num_tags);
    } else {
      ++xrc->xrcd->users;
      e.xrcd = xrc->xrcd->domain->number;
      ToContext(pd->context)->engine->AddSrq(srq->srq);
      Log().debug("{} srq#{}: XRC SRQ of XRC domain {}", ToContext(pd->context)->device->name(),
                  srq->number, e.xrcd);
    }
  }
  AddHandle(&srq->ibv, Kind::kSrq, pd->context);
  slot.Keep();
  return &srq->ibv;
}

}  // namespace

Result<ibv_srq*> CreateSrq(ibv_pd* pd, ibv_srq_init_attr* attr) { return NewSrq(pd, attr, nullptr); }

Result<ibv_srq*> CreateSrqEx(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  auto fail = [](int code, std::string why) -> Status {
    Log().warn("ibv_create_srq_ex: {}", why);
    return Status::Error(code, std::move(why));
  };
  constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                              IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                              IBV_SRQ_INIT_ATTR_TM;
  if (attr->comp_mask & ~kKnown) {
    return fail(EINVAL, fmt::format("comp_mask {:#x} has unknown bits", attr->comp_mask & ~kKnown));
  }
  const ibv_srq_type type =
      (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM) {
    return fail(EINVAL, fmt::format("srq_type {} is not IBV_SRQT_BASIC, _XRC or _TM",
                                    static_cast<int>(type)));
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr) {
    return fail(EINVAL, "an SRQ needs a protection domain (IBV_SRQ_INIT_ATTR_PD and pd)");
  }
  if (!HandleOf(attr->pd, Kind::kPd, context, "ibv_create_srq_ex", "pd")) {
    return InvalidArgument("not a PD of this context");
  }
  ibv_srq_init_attr basic{};
  basic.srq_context = attr->srq_context;
  basic.attr = attr->attr;
  if (type == IBV_SRQT_BASIC) return NewSrq(attr->pd, &basic, nullptr);
  if (type == IBV_SRQT_TM) {
    constexpr uint32_t kTmNeeds = IBV_SRQ_INIT_ATTR_TM | IBV_SRQ_INIT_ATTR_CQ;
    if ((attr->comp_mask & kTmNeeds) != kTmNeeds || attr->cq == nullptr) {
      return fail(EINVAL, "a tag-matching SRQ needs its list sizes (IBV_SRQ_INIT_ATTR_TM with "
                          "tm_cap) and the CQ its operations and messages complete on "
                          "(IBV_SRQ_INIT_ATTR_CQ with cq)");
    }
    const ibv_tm_cap& tm = attr->tm_cap;
    if (tm.max_num_tags < 1 || tm.max_num_tags > static_cast<uint32_t>(device::kMaxNumTags) ||
        tm.max_ops < 1 || tm.max_ops > static_cast<uint32_t>(device::kMaxTmOps)) {
      return fail(EINVAL, fmt::format("tm_cap max_num_tags {} / max_ops {} outside the device's "
                                      "1..{} / 1..{} (ibv_query_device_ex's tm_caps)",
                                      tm.max_num_tags, tm.max_ops, device::kMaxNumTags,
                                      device::kMaxTmOps));
    }
    if (!HandleOf(attr->cq, Kind::kCq, context, "ibv_create_srq_ex", "cq")) {
      return InvalidArgument("the CQ is not one of this context");
    }
    XrcParts parts{nullptr, attr->cq, tm.max_num_tags};
    return NewSrq(attr->pd, &basic, &parts);
  }
  constexpr uint32_t kXrcNeeds = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  if ((attr->comp_mask & kXrcNeeds) != kXrcNeeds || attr->xrcd == nullptr || attr->cq == nullptr) {
    return fail(EINVAL, "an XRC SRQ needs an XRC domain and the CQ its receives complete on "
                        "(IBV_SRQ_INIT_ATTR_XRCD with xrcd, IBV_SRQ_INIT_ATTR_CQ with cq)");
  }
  if (!HandleOf(attr->xrcd, Kind::kXrcd, context, "ibv_create_srq_ex", "xrcd") ||
      !HandleOf(attr->cq, Kind::kCq, context, "ibv_create_srq_ex", "cq")) {
    return InvalidArgument("the XRCD or the CQ is not one of this context");
  }
  XrcParts xrc{ToXrcd(attr->xrcd), attr->cq};
  return NewSrq(attr->pd, &basic, &xrc);
}

int GetSrqNum(ibv_srq* srq, uint32_t* srq_num) {
  *srq_num = ToSrq(srq)->number;
  return 0;
}

int ModifySrq(ibv_srq* ibv, ibv_srq_attr* attr, int mask) {
  if (Status dead = DeadDevice(ibv->context, "ibv_modify_srq"); !dead.ok()) return dead.code();
  engine::Srq& srq = *ToSrq(ibv)->srq;
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) {
    Log().warn("ibv_modify_srq: unknown attribute mask bits {:#x}", mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT));
    return EINVAL;
  }
  std::lock_guard lock(srq.mu);
  uint32_t max_wr = (mask & IBV_SRQ_MAX_WR) ? attr->max_wr : srq.max_wr;
  // Check everything, then apply.
  if ((mask & IBV_SRQ_MAX_WR) &&
      (max_wr < 1 || max_wr > static_cast<uint32_t>(device::kMaxSrqWr) || max_wr < srq.rq.size())) {
    Log().warn("ibv_modify_srq: max_wr {} must be 1..{} and hold the {} receives already posted",
               max_wr, device::kMaxSrqWr, srq.rq.size());
    return EINVAL;
  }
  if ((mask & IBV_SRQ_LIMIT) && attr->srq_limit > max_wr) {
    Log().warn("ibv_modify_srq: srq_limit {} exceeds max_wr {}", attr->srq_limit, max_wr);
    return EINVAL;
  }
  srq.max_wr = max_wr;
  if (mask & IBV_SRQ_LIMIT) srq.limit = attr->srq_limit;
  return 0;
}

int QuerySrq(ibv_srq* ibv, ibv_srq_attr* attr) {
  if (Status dead = DeadDevice(ibv->context, "ibv_query_srq"); !dead.ok()) return dead.code();
  engine::Srq& srq = *ToSrq(ibv)->srq;
  std::lock_guard lock(srq.mu);
  attr->max_wr = srq.max_wr;
  attr->max_sge = srq.max_sge;
  attr->srq_limit = srq.limit;
  return 0;
}

int DetachSrq(ibv_srq* ibv) {
  if (int users = ToSrq(ibv)->users.load(); users != 0) {
    Log().warn("ibv_destroy_srq: {} QP(s) still use this SRQ; destroy them first", users);
    return EBUSY;
  }
  // No control-plane event names it after this (see DetachCq), and no
  // XRC target delivers into it.
  if (ToSrq(ibv)->xrcd != nullptr) ToContext(ibv->context)->engine->RemoveSrq(ToSrq(ibv)->number);
  ToContext(ibv->context)->device->directory().Remove(objects::ObjectKind::kSrq, ToSrq(ibv)->number);
  RetireHandle(ibv);
  return 0;
}

void FreeSrq(ibv_srq* ibv) {
  RemoveHandle(ibv);
  ToContext(ibv->context)->device->ReturnObject(device::Device::Limited::kSrq);
  --ToPd(ibv->pd)->users;
  if (Srq* srq = ToSrq(ibv); srq->cq != nullptr) {
    if (srq->xrcd != nullptr) --srq->xrcd->users;
    --ToCq(srq->cq)->users;
  }
  pthread_mutex_destroy(&ibv->mutex);
  pthread_cond_destroy(&ibv->cond);
  check::Dispose(ToSrq(ibv));
}

}  // namespace rdmaemu::provider
