// cm ids and events: the library's initialisation, rdma_create_id,
// rdma_destroy_id, rdma_get_cm_event, rdma_ack_cm_event, and the function
// the device delivers its events through.
#include "verbs/rdmacm/id.h"

#include <pthread.h>
#include <sys/random.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "verbs/rdmacm/address.h"
#include "verbs/rdmacm/check.h"
#include "verbs/rdmacm/library.h"
#include "verbs/rdmacm/multicast.h"

namespace rdmaemu::rdmacm {
namespace {

void ScanAtExit();

pthread_once_t g_once = PTHREAD_ONCE_INIT;
int g_init_error = 0;
std::atomic<uint64_t> g_psn_state{0};

void InitOnce() {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != sizeof seed) {
    seed = static_cast<uint64_t>(time(nullptr)) ^ (static_cast<uint64_t>(getpid()) << 32);
  }
  g_psn_state.store(seed);
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    g_init_error = list == nullptr && errno != 0 ? errno : ENODEV;
    Log().debug("rdma cm: no RDMA device");
    return;
  }
  SetDevices(list, count);  // the list is kept: its devices stay valid
  int error = rdmaemu_cm_init(RDMAEMU_CM_ABI_VERSION, DeliverFromDevice);
  if (error != 0) {
    Log().error("rdma cm: the device's connection manager refused to start: {}",
                std::strerror(error));
    g_init_error = error;
    return;
  }
  if (CheckOn()) rdmaemu_cm_check_at_exit(ScanAtExit);
}

// Every id made and not yet deleted (LiveId).
std::mutex g_live_mu;
std::unordered_set<const rdma_cm_id*> g_live;  // guarded by g_live_mu

void Register(Id* id) {
  std::lock_guard lock(g_live_mu);
  g_live.insert(&id->id);
}

// The events rdma_get_cm_event returned and rdma_ack_cm_event has not taken
// back: an ack of anything else would free what is not (or no longer) an
// event.
std::mutex g_returned_mu;
std::unordered_set<const rdma_cm_event*> g_returned;  // guarded by g_returned_mu

// At exit, with the checker on: ids whose events were never all
// acknowledged. (Ids and channels never destroyed are the checker's leak
// scan's: they are tracked from their creation, check.h.)
void ScanAtExit() {
  std::vector<std::pair<uint32_t, uint32_t>> unacked;  // handle, missing
  {
    std::lock_guard lock(g_live_mu);
    for (const rdma_cm_id* cm_id : g_live) {
      Id* id = ToId(const_cast<rdma_cm_id*>(cm_id));
      std::lock_guard id_lock(id->mu);
      if (id->reported > id->acked) unacked.emplace_back(id->handle, id->reported - id->acked);
    }
  }
  for (auto [handle, missing] : unacked) {
    CheckReport("ack-mismatch",
                fmt::format("{} RDMA CM event(s) returned for cm id {} were never acknowledged when "
                            "the program exited; every event rdma_get_cm_event returns must be "
                            "acknowledged (rdma_ack_cm_event), or rdma_destroy_id waits forever",
                            missing, handle));
  }
}

const char* QpTypeName(int type) {
  switch (type) {
    case IBV_QPT_RC: return "RC";
    case IBV_QPT_UC: return "UC";
    case IBV_QPT_UD: return "UD";
    case IBV_QPT_XRC_SEND: return "XRC_SEND";
    case IBV_QPT_XRC_RECV: return "XRC_RECV";
    default: return "unknown";
  }
}

// A REQ must be for the listener's QP type (an XRC initiator's for an XRC
// target's), a SIDR_REQ (qp_type UD) for a UD listener.
bool RequestFitsListener(const Id& listener, const rdmaemu_cm_param& request) {
  return request.qp_type == listener.id.qp_type;
}

// The new id a CONNECT_REQUEST makes, on the listener's channel with its
// context. Runs on a device thread: it only allocates.
Id* NewChild(Id* listener, const rdmaemu_cm_event& e) {
  auto* child = new (std::nothrow) Id;
  if (child == nullptr) return nullptr;
  Register(child);
  Channel* channel = listener->route.load(std::memory_order_acquire);
  child->handle = e.child;
  child->has_handle = true;
  child->id.channel = listener->id.channel;
  child->route.store(channel, std::memory_order_release);
  channel->ids.fetch_add(1);
  child->id.context = listener->id.context;
  child->id.ps = listener->id.ps;
  child->id.qp_type = listener->id.qp_type;
  child->id.pd = listener->id.pd;
  if (Device* device = DeviceByIndex(e.device_index); device != nullptr) {
    if (const Port* port = FindPort(device, e.port_num); port != nullptr) {
      AttachToDevice(child, device, *port);
    }
  }
  child->id.port_num = e.port_num;
  std::memcpy(&child->id.route.addr.src_sin, &e.src, sizeof e.src);
  std::memcpy(&child->id.route.addr.dst_sin, &e.dst, sizeof e.dst);
  ibv_gid sgid = MappedGid(e.src.sin_addr), dgid = MappedGid(e.dst.sin_addr);
  std::memcpy(child->id.route.addr.addr.ibaddr.sgid.raw, sgid.raw, 16);
  std::memcpy(child->id.route.addr.addr.ibaddr.dgid.raw, dgid.raw, 16);
  child->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
  child->bound = true;
  child->state = State::kRequest;
  child->psn = RandomPsn();
  child->tos = listener->tos;
  child->tos_set = listener->tos_set;
  child->ack_timeout = listener->ack_timeout;
  const rdmaemu_cm_param& req = e.param;
  child->have_peer = true;
  child->peer_qpn = req.qp_num;
  child->peer_psn = req.starting_psn;
  child->path_mtu = req.path_mtu != 0 ? req.path_mtu : uint8_t{IBV_MTU_1024};
  child->qp_timeout = req.local_ack_timeout != 0 ? req.local_ack_timeout : kDefaultAckTimeout;
  child->retry_count = req.retry_count;
  child->rnr_retry_count = req.rnr_retry_count;
  // Ours to grant is what the peer initiates, and vice versa.
  child->responder_resources = req.initiator_depth;
  child->initiator_depth = req.responder_resources;
  FillChildPath(child, child->path_mtu);
  return child;
}

void DeleteId(Id* id) {
  {
    std::lock_guard lock(g_live_mu);
    g_live.erase(&id->id);
  }
  CheckUntrack(id);
  Channel* channel = id->route.load();
  channel->ids.fetch_sub(1);
  if (id->sync) DeleteChannel(channel);
  delete id;
}

// Gives a sync listener's new child its own channel (rdma-core does it
// while processing the request).
void GiveOwnChannel(Id* child) {
  Channel* own = NewChannel();
  if (own == nullptr) {
    Log().warn("rdma cm: id {} stays on its listener's channel: {}", child->handle,
               std::strerror(errno));
    return;
  }
  MoveEvents(child, child->route.load(), own);
  child->id.channel = &own->channel;
  child->sync = true;
}

}  // namespace

bool LiveId(const rdma_cm_id* id, const char* verb) {
  {
    std::lock_guard lock(g_live_mu);
    if (g_live.contains(id)) return true;
  }
  Log().warn("{}: {} is not an rdma_cm_id of this process: destroyed already, a copy, or "
             "never made by rdma_create_id", verb, static_cast<const void*>(id));
  return false;
}

int Init() {
  pthread_once(&g_once, InitOnce);
  return g_init_error;
}

const char* StateName(State state) {
  switch (state) {
    case State::kIdle: return "idle";
    case State::kBound: return "bound";
    case State::kAddrResolved: return "address-resolved";
    case State::kRouteResolved: return "route-resolved";
    case State::kConnect: return "connecting";
    case State::kListen: return "listening";
    case State::kRequest: return "a connection request";
    case State::kAccepted: return "accepted";
    case State::kEstablished: return "connected";
    case State::kDisconnected: return "disconnected";
  }
  return "?";
}

uint32_t RandomPsn() {
  // splitmix64 over an atomic counter: safe on any thread, no system call.
  uint64_t z = g_psn_state.fetch_add(0x9e3779b97f4a7c15ULL) + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<uint32_t>(z) & 0xffffff;
}

Id* NewId(rdma_event_channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  if (channel != nullptr && !LiveChannel(channel, "rdma_create_id")) return FailNull<Id>(EINVAL);
  auto* id = new (std::nothrow) Id;
  if (id == nullptr) return FailNull<Id>(ENOMEM);
  Channel* ch = channel != nullptr ? ToChannel(channel) : NewChannel();
  if (ch == nullptr) {
    int error = errno;
    delete id;
    return FailNull<Id>(error);
  }
  id->sync = channel == nullptr;
  id->id.channel = &ch->channel;
  id->route.store(ch);
  ch->ids.fetch_add(1);
  Register(id);
  id->id.context = context;
  id->id.ps = ps;
  id->id.qp_type = qp_type;
  id->psn = RandomPsn();
  int error = rdmaemu_cm_create_id(reinterpret_cast<uint64_t>(id), static_cast<uint16_t>(ps),
                                   &id->handle);
  if (error != 0) {
    Log().warn("rdma_create_id: the device refused a new id: {}", std::strerror(error));
    DeleteId(id);
    return FailNull<Id>(error);
  }
  id->has_handle = true;
  CheckTrack(id, fmt::format("cm id {}", id->handle));
  return id;
}

int QueueLibraryEvent(Id* id, rdma_cm_event_type type, int status) {
  auto* event = new (std::nothrow) Event;
  if (event == nullptr) return ENOMEM;
  event->owner = event->target = id;
  event->event.event = type;
  event->event.status = status;
  Deliver(event);
  return 0;
}

uint64_t DeliverFromDevice(const rdmaemu_cm_event* e) {
  auto* id = reinterpret_cast<Id*>(e->handle);
  if (id == nullptr) return 0;
  auto* event = new (std::nothrow) Event;
  if (event == nullptr) {
    Log().error("rdma cm: out of memory: an event for id {} is lost", e->id);
    return 0;
  }
  event->owner = event->target = id;
  event->event.event = static_cast<rdma_cm_event_type>(e->event);
  event->event.status = e->status;
  event->param = e->param;
  if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
    if (!RequestFitsListener(*id, e->param)) {
      // As the kernel's cma_ib_check_req_qp_type: the device rejects the
      // request, and the listener never hears of it.
      Log().warn("rdma cm: id {} listens for {} QPs; a connection request for a {} QP from {} is "
                 "rejected", id->handle, QpTypeName(id->id.qp_type), QpTypeName(e->param.qp_type),
                 AddressString(e->dst));
      delete event;
      return 0;
    }
    Id* child = NewChild(id, *e);
    if (child == nullptr) {
      Log().error("rdma cm: out of memory: a connection request on id {} is lost", e->id);
      delete event;
      return 0;
    }
    event->target = child;
    Deliver(event);
    return reinterpret_cast<uint64_t>(child);
  }
  Deliver(event);
  return 0;
}

void CopyConnParam(Event* event) {
  const rdmaemu_cm_param& p = event->param;
  rdma_conn_param& conn = event->event.param.conn;
  conn = {};
  uint8_t len = std::min<uint8_t>(p.private_data_len, RDMAEMU_CM_MAX_PRIVATE_DATA);
  if (len > 0) {
    std::memcpy(event->private_data, p.private_data, len);
    conn.private_data = event->private_data;
  }
  conn.private_data_len = len;
  conn.responder_resources = p.initiator_depth;
  conn.initiator_depth = p.responder_resources;
  conn.flow_control = p.flow_control;
  conn.retry_count = p.retry_count;
  conn.rnr_retry_count = p.rnr_retry_count;
  conn.srq = p.srq;
  conn.qp_num = p.qp_num;
}

void CopyUdParam(Event* event) {
  const rdmaemu_cm_param& p = event->param;
  Id* id = event->target;
  rdma_ud_param& ud = event->event.param.ud;
  ud = {};
  uint8_t len = std::min<uint8_t>(p.private_data_len, RDMAEMU_CM_MAX_PRIVATE_DATA);
  if (len > 0) {
    std::memcpy(event->private_data, p.private_data, len);
    ud.private_data = event->private_data;
  }
  ud.private_data_len = len;
  ibv_ah_attr& ah = ud.ah_attr;
  ah.is_global = 1;
  std::memcpy(ah.grh.dgid.raw, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
  ah.grh.sgid_index = 0;
  ah.grh.hop_limit = kHopLimit;
  ah.grh.traffic_class = id->tos;
  ah.port_num = id->id.port_num;
  ud.qp_num = p.qp_num;
  ud.qkey = p.qkey;
}

void AckInternally(Event* event) {
  Id* owner = event->owner;
  {
    std::lock_guard lock(owner->mu);
    ++owner->acked;
    if (event->mc != nullptr) ++event->mc->acked;
  }
  owner->acked_cv.notify_all();
  delete event;
}

void DiscardAndWait(Id* id, const char* what) {
  for (Event* event : RemoveEvents(id->route.load(), id)) {
    if (event->owner == id && event->target != id) {
      // A queued request the application never saw: its child goes too.
      Id* child = event->target;
      if (child->has_handle) {
        rdmaemu_cm_destroy_id(child->handle);
        child->has_handle = false;
      }
      for (Event* child_event : RemoveEvents(child->route.load(), child)) delete child_event;
      DeleteId(child);
    }
    delete event;
  }
  WaitForAcks(id, what);
}

void WaitForAcks(Id* id, const char* what) {
  std::unique_lock lock(id->mu);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  bool warned = false;
  // != as rdma-core's wait: acking more events than were taken hangs too.
  while (id->acked != id->reported) {
    if (warned) {
      id->acked_cv.wait(lock);
    } else if (id->acked_cv.wait_until(lock, deadline) == std::cv_status::timeout) {
      Log().warn("{}: id {} is waiting for {} unacknowledged event(s): every event returned "
                 "by rdma_get_cm_event must be acknowledged (rdma_ack_cm_event)",
                 what, id->handle, id->reported - id->acked);
      warned = true;
      if (CheckOn()) {
        const uint32_t missing = id->reported - id->acked;
        lock.unlock();
        CheckReport("ack-mismatch",
                    fmt::format("{} of cm id {} has waited a second for {} RDMA CM event(s) "
                                "returned by rdma_get_cm_event and never acknowledged, and "
                                "will wait forever: acknowledge each event (rdma_ack_cm_event) "
                                "before destroying its id",
                                what, id->handle, missing));
        lock.lock();
      }
    }
  }
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                   rdma_port_space ps) {
  if (int error = Init(); error != 0) return Fail(error);
  if (id == nullptr) {
    Log().warn("rdma_create_id: the id pointer is NULL");
    return Fail(EINVAL);
  }
  ibv_qp_type qp_type;
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_IB:
      qp_type = IBV_QPT_RC;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      qp_type = IBV_QPT_UD;
      break;
    default:
      Log().warn("rdma_create_id: port space {:#x} is not one of RDMA_PS_TCP, RDMA_PS_UDP, "
                 "RDMA_PS_IB, RDMA_PS_IPOIB", static_cast<int>(ps));
      return Fail(EINVAL);
  }
  Id* created = NewId(channel, context, ps, qp_type);
  if (created == nullptr) return -1;
  *id = &created->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  if (id == nullptr) {
    Log().warn("rdma_destroy_id: the id is NULL");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_destroy_id")) return Fail(EINVAL);
  Id* p = ToId(id);
  if (id->event != nullptr) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  if (p->has_handle) {
    if (int error = rdmaemu_cm_destroy_id(p->handle); error != 0) {
      Log().warn("rdma_destroy_id: the device could not destroy id {}: {}", p->handle,
                 std::strerror(error));
    }
    p->has_handle = false;
  }
  LeaveAll(p);
  DiscardAndWait(p, "rdma_destroy_id");
  FreeMemberships(p);
  DeleteId(p);
  return 0;
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (event == nullptr) {
    Log().warn("rdma_ack_cm_event: the event is NULL");
    return Fail(EINVAL);
  }
  bool returned;
  {
    std::lock_guard lock(g_returned_mu);
    returned = g_returned.erase(event) != 0;
  }
  if (!returned) {
    const std::string what = fmt::format(
        "rdma_ack_cm_event of {}, which is not an event rdma_get_cm_event returned, or was "
        "acknowledged already: an acknowledgement frees the event, so acknowledge each one "
        "exactly once and do not touch it afterwards",
        static_cast<const void*>(event));
    Log().warn("{}", what);
    if (CheckOn()) CheckReport("ack-mismatch", what);
    return Fail(EINVAL);
  }
  AckInternally(reinterpret_cast<Event*>(event));
  return 0;
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** out) {
  if (int error = Init(); error != 0) return Fail(error);
  if (channel == nullptr || out == nullptr) {
    Log().warn("rdma_get_cm_event: {} is NULL", channel == nullptr ? "the channel" : "the event pointer");
    return Fail(EINVAL);
  }
  for (;;) {
    Event* event;
    if (!LiveChannel(channel, "rdma_get_cm_event")) return Fail(EINVAL);
    if (Take(ToChannel(channel), &event) != 0) return -1;
    Id* id = event->target;
    event->event.id = &id->id;
    bool ud = id->id.qp_type == IBV_QPT_UD;
    switch (event->event.event) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        // The program owns the new id from here: it needs its destroy.
        CheckTrack(id, fmt::format("cm id {} (a CONNECT_REQUEST's)", id->handle));
        event->event.listen_id = &event->owner->id;
        if (ud) {
          CopyUdParam(event);
        } else {
          CopyConnParam(event);
        }
        if (event->owner->sync) GiveOwnChannel(id);
        break;
      case RDMA_CM_EVENT_CONNECT_RESPONSE:
        ProcessConnectResponse(event);
        break;
      case RDMA_CM_EVENT_ESTABLISHED:
        if (ud) {
          CopyUdParam(event);
        } else {
          CopyConnParam(event);
        }
        id->state = State::kEstablished;
        break;
      case RDMA_CM_EVENT_REJECTED:
        if (id->connect_error) {
          AckInternally(event);
          continue;
        }
        if (ud) {
          CopyUdParam(event);
        } else {
          CopyConnParam(event);
        }
        ModifyQpToError(id);
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
        if (id->connect_error) {
          AckInternally(event);
          continue;
        }
        CopyConnParam(event);
        id->state = State::kDisconnected;
        break;
      case RDMA_CM_EVENT_MULTICAST_JOIN:
        // param.ud was filled by the join; the QP is attached now.
        ProcessJoin(event);
        break;
      case RDMA_CM_EVENT_ADDR_RESOLVED:
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
      case RDMA_CM_EVENT_ROUTE_ERROR:
        break;
      default:
        if (ud) {
          CopyUdParam(event);
        } else {
          CopyConnParam(event);
        }
        break;
    }
    {
      std::lock_guard lock(g_returned_mu);
      g_returned.insert(&event->event);
    }
    *out = &event->event;
    return 0;
  }
}

}  // extern "C"

// The device speaks rdma_cma.h's and verbs.h's numbers (uapi.h repeats them).
static_assert(int{RDMAEMU_CM_EVENT_CONNECT_REQUEST} == int{RDMA_CM_EVENT_CONNECT_REQUEST});
static_assert(int{RDMAEMU_CM_EVENT_CONNECT_RESPONSE} == int{RDMA_CM_EVENT_CONNECT_RESPONSE});
static_assert(int{RDMAEMU_CM_EVENT_CONNECT_ERROR} == int{RDMA_CM_EVENT_CONNECT_ERROR});
static_assert(int{RDMAEMU_CM_EVENT_UNREACHABLE} == int{RDMA_CM_EVENT_UNREACHABLE});
static_assert(int{RDMAEMU_CM_EVENT_REJECTED} == int{RDMA_CM_EVENT_REJECTED});
static_assert(int{RDMAEMU_CM_EVENT_ESTABLISHED} == int{RDMA_CM_EVENT_ESTABLISHED});
static_assert(int{RDMAEMU_CM_EVENT_DISCONNECTED} == int{RDMA_CM_EVENT_DISCONNECTED});
static_assert(int{RDMAEMU_CM_EVENT_TIMEWAIT_EXIT} == int{RDMA_CM_EVENT_TIMEWAIT_EXIT});
static_assert(int{RDMAEMU_CM_PS_IPOIB} == int{RDMA_PS_IPOIB} && int{RDMAEMU_CM_PS_TCP} == int{RDMA_PS_TCP} &&
              int{RDMAEMU_CM_PS_UDP} == int{RDMA_PS_UDP} && int{RDMAEMU_CM_PS_IB} == int{RDMA_PS_IB});
static_assert(int{RDMAEMU_CM_QPT_RC} == int{IBV_QPT_RC} && int{RDMAEMU_CM_QPT_UC} == int{IBV_QPT_UC} &&
              int{RDMAEMU_CM_QPT_UD} == int{IBV_QPT_UD});
