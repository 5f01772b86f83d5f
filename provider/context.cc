// Device list, contexts, and the device/port/GID queries.
#include <arpa/inet.h>
#include <endian.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/control/server.h"
#include "emulator/device/attributes.h"
#include "emulator/device/clock.h"
#include "emulator/engine/rss.h"
#include "emulator/engine/trace.h"
#include "provider/cmd_file.h"
#include "provider/domain.h"
#include "provider/handles.h"
#include "provider/check/quarantine.h"
#include "provider/objects.h"
#include "provider/ops.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

EventHooks g_hooks{};

ibv_mtu ToIbvMtu(uint32_t mtu) {
  switch (mtu) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
  }
}

ibv_port_state ToIbvPortState(device::PortState s) {
  switch (s) {
    case device::PortState::kDown: return IBV_PORT_DOWN;
    case device::PortState::kInit: return IBV_PORT_INIT;
    case device::PortState::kArmed: return IBV_PORT_ARMED;
    case device::PortState::kActive: return IBV_PORT_ACTIVE;
  }
  return IBV_PORT_NOP;
}

bool IsObjectEvent(device::AsyncEventType t) {
  using T = device::AsyncEventType;
  switch (t) {
    case T::kCqErr: case T::kQpFatal: case T::kQpReqErr: case T::kQpAccessErr:
    case T::kCommEst: case T::kSqDrained: case T::kPathMig: case T::kPathMigErr:
    case T::kSrqErr: case T::kSrqLimitReached: case T::kQpLastWqeReached: case T::kWqFatal:
      return true;
    case T::kDeviceFatal: case T::kPortActive: case T::kPortErr: case T::kLidChange:
    case T::kPkeyChange: case T::kSmChange: case T::kClientReregister: case T::kGidChange:
    case T::kDeviceSpeedChange:
      return false;
  }
  return false;
}

// Every object event's handle is the ibv_* pointer the application holds;
// all of them start with their context pointer.
ibv_context* OwnerOf(const device::AsyncEvent& e) {
  return *reinterpret_cast<ibv_context* const*>(e.handle);
}

// "qp#17", "cq#2", "srq#1", "wq#5", "port 1" or "" (a device event): what
// the event's debug line names.
std::string EventObject(const ibv_async_event& ev) {
  using T = device::AsyncEventType;
  switch (static_cast<T>(ev.event_type)) {
    case T::kCqErr: return fmt::format("cq#{}", ToCq(ev.element.cq)->number);
    case T::kSrqErr: case T::kSrqLimitReached:
      return fmt::format("srq#{}", ToSrq(ev.element.srq)->number);
    case T::kWqFatal: return fmt::format("wq#{}", ev.element.wq->wq_num);
    case T::kDeviceFatal: return "";
    default:
      if (IsObjectEvent(static_cast<T>(ev.event_type))) return fmt::format("qp#{}", ev.element.qp->qp_num);
      return fmt::format("port {}", ev.element.port_num);
  }
}

void Deliver(Context* ctx, const device::AsyncEvent& e) {
  if (IsObjectEvent(e.type) && OwnerOf(e) != &ctx->vctx.context) return;
  ibv_async_event ev{};
  ev.event_type = static_cast<ibv_event_type>(e.type);
  using T = device::AsyncEventType;
  switch (e.type) {
    case T::kCqErr:
      ev.element.cq = reinterpret_cast<ibv_cq*>(e.handle);
      break;
    case T::kSrqErr: case T::kSrqLimitReached:
      ev.element.srq = reinterpret_cast<ibv_srq*>(e.handle);
      break;
    case T::kWqFatal:
      ev.element.wq = reinterpret_cast<ibv_wq*>(e.handle);
      break;
    default:
      if (IsObjectEvent(e.type)) {
        ev.element.qp = reinterpret_cast<ibv_qp*>(e.handle);
      } else {
        ev.element.port_num = e.port;
      }
  }
  if (engine::DebugOn()) {
    const std::string object = EventObject(ev);
    Log().debug("{}{}{} event {}", ctx->device->name(), object.empty() ? "" : " ", object,
                engine::EventName(e.type));
  }
  if (g_hooks.async == nullptr) return;
  g_hooks.async(&ctx->vctx.context, ev);
}

int QueryDeviceEx(ibv_context* context, const ibv_query_device_ex_input* input,
                  ibv_device_attr_ex* attr, size_t attr_size) {
  if (Status dead = DeadDevice(context, "ibv_query_device"); !dead.ok()) return dead.code();
  if (input != nullptr && input->comp_mask != 0) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  const device::Device& dev = *ToContext(context)->device;
  ibv_device_attr_ex a{};
  ibv_device_attr& o = a.orig_attr;
  std::snprintf(o.fw_ver, sizeof o.fw_ver, "%s", device::kFirmwareVersion);
  o.node_guid = htobe64(dev.node_guid());
  o.sys_image_guid = htobe64(dev.node_guid());
  o.max_mr_size = device::kMaxMrSize;
  o.page_size_cap = device::kPageSizeCap;
  o.vendor_id = device::kVendorId;
  o.vendor_part_id = device::kVendorPartId;
  o.hw_ver = device::kHwVersion;
  o.max_qp = device::kMaxQp;
  o.max_qp_wr = device::kMaxQpWr;
  o.device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR |
                       IBV_DEVICE_CHANGE_PHY_PORT | IBV_DEVICE_UD_AV_PORT_ENFORCE |
                       IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                       IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
                       IBV_DEVICE_AUTO_PATH_MIG | IBV_DEVICE_MEM_WINDOW |
                       // Type 2B only: a type 2 window answers on the QP that
                       // bound it and no other, the rule the responder
                       // enforces. A device is one kind or the other (mlx4
                       // sets one of the two bits; rxe and mlx5 set 2B).
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC;
  o.max_sge = device::kMaxSge;
  o.max_sge_rd = device::kMaxSgeRd;
  o.max_cq = device::kMaxCq;
  o.max_cqe = device::kMaxCqe;
  o.max_mr = device::kMaxMr;
  o.max_pd = device::kMaxPd;
  o.max_qp_rd_atom = device::kMaxQpRdAtom;
  o.max_res_rd_atom = device::kMaxResRdAtom;
  o.max_qp_init_rd_atom = device::kMaxQpRdAtom;
  o.atomic_cap = IBV_ATOMIC_HCA;
  o.max_mw = device::kMaxMw;
  o.max_mcast_grp = device::kMaxMcastGrp;
  o.max_mcast_qp_attach = device::kMaxMcastQpAttach;
  o.max_total_mcast_qp_attach = device::kMaxMcastGrp * device::kMaxMcastQpAttach;
  o.max_ah = device::kMaxAh;
  o.max_srq = device::kMaxSrq;
  o.max_srq_wr = device::kMaxSrqWr;
  o.max_srq_sge = device::kMaxSrqSge;
  o.max_pkeys = device::kMaxPkeys;
  o.local_ca_ack_delay = device::kLocalCaAckDelay;
  o.phys_port_cnt = static_cast<uint8_t>(dev.num_ports());
  a.completion_timestamp_mask = device::kCompletionTimestampMask;
  a.hca_core_clock = device::kCoreClockKhz;
  a.phys_port_cnt_ex = static_cast<uint32_t>(dev.num_ports());
  // The 64-bit flags repeat the 32 classic ones; above them, the Memory
  // Placement Extensions (the kernel's IB_UVERBS_DEVICE_FLUSH_GLOBAL and
  // _ATOMIC_WRITE, bits 38 and 40; Debian 12's headers predate them). No
  // FLUSH_PERSISTENT: this device has no persistent memory.
  a.device_cap_flags_ex = o.device_cap_flags | device::kCapFlushGlobal | device::kCapAtomicWrite;
  // On-demand paging: every region may be on demand (its pages faulted in
  // as the device touches them), the whole address space too (implicit).
  a.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  a.odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                              IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                                              IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  a.odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
  a.odp_caps.per_transport_caps.ud_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  // XRC runs RC's requester and responder, and faults pages in the same way.
  a.xrc_odp_caps = a.odp_caps.per_transport_caps.rc_odp_caps;
  a.max_dm_size = device::kMaxDmSize;  // device memory (provider/dm.cc)
  // Tag matching on RC (provider/srq.cc, docs/tag-matching.md).
  a.tm_caps.max_rndv_hdr_size = device::kMaxRndvHdrSize;
  a.tm_caps.max_num_tags = device::kMaxNumTags;
  a.tm_caps.flags = IBV_TM_CAP_RC;
  a.tm_caps.max_ops = device::kMaxTmOps;
  a.tm_caps.max_sge = device::kMaxTmSge;
  // Receive-side scaling on UD QPs through WQs (provider/wq.cc).
  a.max_wq_type_rq = device::kMaxWq;
  a.rss_caps.supported_qpts = (1u << IBV_QPT_UD) | (1u << IBV_QPT_RAW_PACKET);
  // Raw packet QPs (engine/raw.cc) have none of the offloads raw_packet_caps
  // names: no VLAN stripping, no FCS scatter, no checksum offload, no delay
  // drop. The zero is the truth, left as it is.
  a.raw_packet_caps = 0;
  a.rss_caps.max_rwq_indirection_tables = device::kMaxRwqIndTables;
  a.rss_caps.max_rwq_indirection_table_size = 1u << device::kLogMaxRwqIndTableSize;
  a.rss_caps.rx_hash_fields_mask = engine::kRxHashSupportedFields;
  a.rss_caps.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
  std::memcpy(attr, &a, std::min(attr_size, sizeof a));
  return 0;
}

// The raw clock is the core clock completions are stamped with
// (device/clock.h), so a raw value and a completion's timestamp compare
// directly. As libmlx5 (the one provider with this verb) does: the ticks are
// in tv_nsec with tv_sec 0 (pyverbs reads tv_nsec as the device timestamp),
// a comp_mask bit the device does not know is EINVAL, and one asking for
// nothing succeeds with nothing filled.
int QueryRtValues(ibv_context* context, ibv_values_ex* values) {
  if (Status dead = DeadDevice(context, "ibv_query_rt_values_ex"); !dead.ok()) return dead.code();
  if (values == nullptr) {
    Log().warn("ibv_query_rt_values_ex: values is NULL");
    return EINVAL;
  }
  if (uint32_t unknown = values->comp_mask & ~uint32_t{IBV_VALUES_MASK_RAW_CLOCK}; unknown != 0) {
    Log().warn("ibv_query_rt_values_ex: comp_mask bits {:#x} are unknown (IBV_VALUES_MASK_RAW_CLOCK "
               "is the only value a device reports)", unknown);
    return EINVAL;
  }
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(device::CoreClockNow());
  }
  return 0;
}

int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr, size_t attr_size) {
  if (Status dead = DeadDevice(context, "ibv_query_port"); !dead.ok()) return dead.code();
  const device::Device& dev = *ToContext(context)->device;
  if (!dev.ValidPort(port)) {
    Log().warn("ibv_query_port: {} has no port {} (ports are 1..{})", dev.name(), port, dev.num_ports());
    return EINVAL;
  }
  device::PortAttr p = dev.QueryPort(port);
  const bool roce = p.link_layer == device::LinkLayer::kEthernet;
  ibv_port_attr a{};
  a.state = ToIbvPortState(p.state);
  a.max_mtu = ToIbvMtu(p.max_mtu);
  a.active_mtu = ToIbvMtu(p.active_mtu);
  a.gid_tbl_len = device::kGidTableLength;
  a.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_SYS_IMAGE_GUID_SUP |
                     (roce ? IBV_PORT_IP_BASED_GIDS : IBV_PORT_CLIENT_REG_SUP);
  a.max_msg_sz = device::kMaxMsgSize;
  a.bad_pkey_cntr = p.bad_pkey_count;
  a.qkey_viol_cntr = p.qkey_violation_count;
  a.pkey_tbl_len = p.pkey_table_len;
  a.lid = p.lid;
  a.sm_lid = p.sm_lid;
  a.lmc = 0;
  a.max_vl_num = 1;
  a.active_width = p.width;
  a.active_speed = p.speed;
  a.phys_state = p.state == device::PortState::kActive ? 5 /* LinkUp */ : 3 /* Disabled */;
  a.link_layer = roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  a.flags = roce ? IBV_QPF_GRH_REQUIRED : 0;
  std::memcpy(attr, &a, std::min(attr_size, sizeof a));
  return 0;
}

}  // namespace

const EventHooks& Hooks() { return g_hooks; }
void SetEventHooks(const EventHooks& hooks) { g_hooks = hooks; }

Result<std::vector<DeviceEntry>> ListDevices() {
  auto config = device::Registry::Get().config();
  if (!config.ok()) return config.status();
  std::vector<DeviceEntry> out;
  int index = 0;
  for (const auto& d : (*config)->devices) {
    out.push_back(DeviceEntry{d.name, device::Registry::GuidFor(d.name, index++)});
  }
  return out;
}

Result<verbs_context*> AllocContext(int index, ibv_context* imported_from) {
  auto engine = engine::AcquireEngine(index);
  if (!engine.ok()) return engine.status();
  if ((*engine)->device().dead()) {
    // Until its last context closes (the device is then opened afresh, as
    // after a reset), a dead device cannot be opened again.
    Log().warn("ibv_open_device: {} had a fatal error and still has open contexts; close them all to "
               "reset it", (*engine)->device().name());
    return Status::Error(EIO, "dead device");
  }
  auto* ctx = new Context{};
  ctx->engine = std::move(engine).value();
  ctx->device = &ctx->engine->device();
  ctx->file = imported_from != nullptr ? ToContext(imported_from)->file : std::make_shared<CmdFile>();
  AddHandle(&ctx->vctx.context, Kind::kContext, &ctx->vctx.context);
  return &ctx->vctx;
}

void StartContext(verbs_context* vctx) {
  Context* ctx = reinterpret_cast<Context*>(vctx);
  ctx->listener_id = ctx->device->AddListener([ctx](const device::AsyncEvent& e) { Deliver(ctx, e); });
  // A process with a device open answers `rdmaemu port|event|list|...`.
  control::EnsureServer();
}

void FreeContext(verbs_context* vctx) {
  Context* ctx = reinterpret_cast<Context*>(vctx);
  if (ctx->listener_id != 0) ctx->device->RemoveListener(ctx->listener_id);
  ctx->file->pds.Forget(&vctx->context);
  ctx->file->mrs.Forget(&vctx->context);
  ctx->file->dms.Forget(&vctx->context);
  CloseHandles(&vctx->context);
  RemoveHandle(&vctx->context);
  check::Dispose(ctx);
}

void InstallOps(verbs_context* vctx) {
  vctx->query_device_ex = QueryDeviceEx;
  vctx->query_port = QueryPort;
  vctx->query_rt_values = QueryRtValues;
  vctx->context.num_comp_vectors = device::kNumCompVectors;
  InstallCqOps(vctx);
  InstallQpOps(vctx);
  InstallSrqOps(vctx);
  InstallMwOps(vctx);
  InstallMemoryOps(vctx);
  InstallDmOps(vctx);
  InstallFlowOps(vctx);
  InstallDomainOps(vctx);
}

int SetPortState(ibv_context* context, uint8_t port, ibv_port_state state) {
  device::Device& dev = *ToContext(context)->device;
  if (state != IBV_PORT_DOWN && state != IBV_PORT_ACTIVE) {
    Log().warn("rdmaemu_set_port_state: state {} is neither IBV_PORT_DOWN nor IBV_PORT_ACTIVE",
               static_cast<int>(state));
    return EINVAL;
  }
  Status s = dev.SetPortState(port, state == IBV_PORT_ACTIVE ? device::PortState::kActive
                                                             : device::PortState::kDown);
  if (!s.ok()) Log().warn("rdmaemu_set_port_state: {}", s.message());
  return s.code();
}

Result<engine::CounterValues> QueryCounters(ibv_context* context, uint8_t port) {
  const engine::Engine& e = *ToContext(context)->engine;
  if (port == 0) return e.counters();
  return e.port_counters(port);
}

int FaultAdd(ibv_context* context, const char* rules) {
  Context* ctx = ToContext(context);
  Status s = ctx->engine->faults().Add(rules);
  if (!s.ok()) {
    Log().warn("rdmaemu_fault_add: {}", s.message());
    return s.code();
  }
  Log().info("{}: fault rules now:\n{}", ctx->device->name(), ctx->engine->faults().List());
  return 0;
}

int FaultClear(ibv_context* context) {
  ToContext(context)->engine->faults().Clear();
  return 0;
}

int FaultList(ibv_context* context, char* buf, size_t len) {
  const std::string text = ToContext(context)->engine->faults().List();
  if (len == 0) return ERANGE;
  const size_t n = std::min(text.size(), len - 1);
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
  return n < text.size() ? ERANGE : 0;
}

int RaiseAsyncEvent(ibv_context* context, const ibv_async_event& event) {
  if (Status dead = DeadDevice(context, "rdmaemu_raise_async_event"); !dead.ok()) return dead.code();
  using T = device::AsyncEventType;
  const int type = static_cast<int>(event.event_type);
  if (type < 0 || type > static_cast<int>(T::kDeviceSpeedChange)) {
    Log().warn("rdmaemu_raise_async_event: {} is not an async event type", type);
    return EINVAL;
  }
  device::AsyncEvent e{static_cast<T>(type)};
  device::Device& dev = *ToContext(context)->device;
  const void* object = nullptr;
  Kind kind = Kind::kQp;
  switch (e.type) {
    case T::kCqErr:
      object = event.element.cq;
      kind = Kind::kCq;
      break;
    case T::kSrqErr: case T::kSrqLimitReached:
      object = event.element.srq;
      kind = Kind::kSrq;
      break;
    case T::kWqFatal:
      object = event.element.wq;
      kind = Kind::kWq;
      break;
    default:
      if (IsObjectEvent(e.type)) {
        object = event.element.qp;
      } else if (e.type != T::kDeviceFatal && !dev.ValidPort(static_cast<int>(event.element.port_num))) {
        Log().warn("rdmaemu_raise_async_event: {} has no port {}", dev.name(), event.element.port_num);
        return EINVAL;
      }
  }
  if (IsObjectEvent(e.type)) {
    if (!HandleOf(object, kind, context, "rdmaemu_raise_async_event", "the event's element")) {
      return EINVAL;
    }
    e.handle = reinterpret_cast<uint64_t>(object);
  } else {
    e.port = static_cast<uint8_t>(event.element.port_num);
  }
  dev.Raise(e);
  return 0;
}

int QueryGidEntry(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry) {
  if (Status dead = DeadDevice(context, "ibv_query_gid"); !dead.ok()) return dead.code();
  const device::Device& dev = *ToContext(context)->device;
  if (port > 255 || !dev.ValidPort(static_cast<int>(port)) || index >= device::kGidTableLength) {
    return EINVAL;
  }
  auto gid = dev.QueryGid(static_cast<int>(port), static_cast<int>(index));
  if (!gid.ok()) return gid.status().code();
  std::memset(entry, 0, sizeof *entry);
  std::memcpy(entry->gid.raw, gid->raw.data(), 16);
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = dev.QueryPort(static_cast<int>(port)).link_layer == device::LinkLayer::kEthernet
                        ? IBV_GID_TYPE_ROCE_V2
                        : IBV_GID_TYPE_IB;
  entry->ndev_ifindex = 0;
  return 0;
}

int QueryGidTableLength(ibv_context* context, uint32_t port) {
  if (Status dead = DeadDevice(context, "ibv_query_gid_table"); !dead.ok()) return -dead.code();
  const device::Device& dev = *ToContext(context)->device;
  if (port > 255 || !dev.ValidPort(static_cast<int>(port))) return -EINVAL;
  return device::kGidTableLength;
}

int QueryPkey(ibv_context* context, uint8_t port, int index, uint16_t* pkey_be) {
  if (Status dead = DeadDevice(context, "ibv_query_pkey"); !dead.ok()) return dead.code();
  const device::Device& dev = *ToContext(context)->device;
  auto pkey = dev.QueryPkey(port, index);
  if (!pkey.ok()) return pkey.status().code();
  *pkey_be = htons(*pkey);
  return 0;
}

}  // namespace rdmaemu::provider
