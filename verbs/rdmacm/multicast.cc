// Multicast: rdma_join_multicast, rdma_join_multicast_ex,
// rdma_leave_multicast, and the QP's attachments to its id's groups
// (multicast.h says how the pieces fit).
#include "verbs/rdmacm/multicast.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <new>
#include <string>

#include "verbs/rdmacm/id.h"
#include "verbs/rdmacm/library.h"

namespace rdmaemu::rdmacm {
namespace {

// The QPN and Q_Key a group's event carries (the kernel's cma_make_mc_event
// and, on RoCE, RDMA_UDP_QKEY whatever the port space).
constexpr uint32_t kGroupQpn = 0xFFFFFF;

bool SameGid(const ibv_gid& a, const ibv_gid& b) { return std::memcmp(a.raw, b.raw, 16) == 0; }

std::string GidString(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, gid.raw, text, sizeof text);
  return text;
}

// How many bytes of `addr` name a group (rdma-core's ucma_addrlen without
// AF_IB support); 0 for a family it does not know.
size_t AddressLength(const sockaddr* addr) {
  switch (addr->sa_family) {
    case AF_INET: return sizeof(sockaddr_in);
    case AF_INET6: return sizeof(sockaddr_in6);
    default: return 0;
  }
}

// The kernel's checks of a join (ucma_process_join, rdma_join_multicast,
// cma_iboe_join_multicast on a RoCE v2 port), plus ours: only an IPv4
// multicast address names a group here. Returns 0 or an errno value,
// having logged why.
int CheckJoin(Id* p, const sockaddr* addr, const char* what) {
  if (p->device == nullptr) {
    Log().warn("{}: id {} is not on a device: bind it to a local address (rdma_bind_addr) or "
               "resolve an address (rdma_resolve_addr) before joining a group",
               what, p->handle);
    return EINVAL;
  }
  if (p->state != State::kBound && p->state != State::kAddrResolved) {
    Log().warn("{}: id {} is {}: only a bound or address-resolved id joins a group", what,
               p->handle, StateName(p->state));
    return EINVAL;
  }
  if (p->id.qp_type != IBV_QPT_UD) {
    Log().warn("{}: id {} is not UD: multicast is for ids of RDMA_PS_UDP or RDMA_PS_IPOIB",
               what, p->handle);
    return EINVAL;
  }
  if (addr->sa_family == AF_INET6 || addr->sa_family == AF_IB) {
    Log().warn("{}: address family {} is not supported: RoCE v2 groups are IPv4 multicast "
               "addresses", what, addr->sa_family);
    return EAFNOSUPPORT;
  }
  if (addr->sa_family != AF_INET) {
    Log().warn("{}: address family {} is not a group address", what, addr->sa_family);
    return EINVAL;
  }
  in_addr group = reinterpret_cast<const sockaddr_in*>(addr)->sin_addr;
  if (!IN_MULTICAST(ntohl(group.s_addr))) {
    Log().warn("{}: {} is not an IPv4 multicast address (224.0.0.0/4)", what,
               AddressString(group));
    return EINVAL;
  }
  return 0;
}

// The group's event as the kernel makes it for RoCE v2
// (ib_init_ah_from_mcmember over cma_iboe_join_multicast's record):
// global, MGID as dgid, the id's GID (index 0), hop limit 64, LID 0.
Event* NewJoinEvent(Id* p, Membership* m) {
  auto* event = new (std::nothrow) Event;
  if (event == nullptr) return nullptr;
  event->owner = event->target = p;
  event->mc = m;
  event->event.event = RDMA_CM_EVENT_MULTICAST_JOIN;
  rdma_ud_param& ud = event->event.param.ud;
  ud.private_data = m->context;  // librdmacm's: the join's context
  ud.private_data_len = 0;
  ibv_ah_attr& ah = ud.ah_attr;
  ah.is_global = 1;
  ah.grh.dgid = m->mgid;
  ah.grh.sgid_index = 0;
  ah.grh.hop_limit = kHopLimit;
  ah.dlid = 0;
  ah.sl = 0;
  ah.port_num = p->id.port_num;
  ud.qp_num = kGroupQpn;
  ud.qkey = RDMA_UDP_QKEY;
  return event;
}

// Attaches id->qp to the group for `m` if the join wants it; mc_mu held.
// Returns 0 or the errno value of ibv_attach_mcast.
int AttachLocked(Id* p, Membership* m) {
  if (m->left || p->id.qp == nullptr ||
      m->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
    return 0;
  }
  // A QP is attached to a group once however often its id joins it (the
  // kernel's uverbs keeps one attachment per QP and group).
  for (Membership* other : p->memberships) {
    if (other != m && other->attached && SameGid(other->mgid, m->mgid)) {
      m->attached = true;
      return 0;
    }
  }
  int error = ibv_attach_mcast(p->id.qp, &m->mgid, 0);
  if (error == 0) m->attached = true;
  return error;
}

// Detaches id->qp from the group of `m` if it is attached; mc_mu held.
void DetachLocked(Id* p, Membership* m, const char* what) {
  if (!m->attached) return;
  if (p->id.qp != nullptr) {
    if (int error = ibv_detach_mcast(p->id.qp, &m->mgid, 0); error != 0) {
      Log().warn("{}: ibv_detach_mcast of qp {} from {} failed: {}", what, p->id.qp->qp_num,
                 GidString(m->mgid), std::strerror(error));
    }
  }
  // The one attachment is gone for every membership of that group.
  for (Membership* other : p->memberships) {
    if (SameGid(other->mgid, m->mgid)) other->attached = false;
  }
  m->attached = false;
}

// Waits until every event taken for `m` is acked, logging after a second.
void WaitForAcks(Id* p, Membership* m) {
  std::unique_lock lock(p->mu);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  bool warned = false;
  while (m->acked != m->reported) {
    if (warned) {
      p->acked_cv.wait(lock);
    } else if (p->acked_cv.wait_until(lock, deadline) == std::cv_status::timeout) {
      Log().warn("rdma_leave_multicast: id {} is waiting for the acknowledgement of the "
                 "event of its join of {}: every event returned by rdma_get_cm_event must be "
                 "acknowledged (rdma_ack_cm_event)", p->handle, GidString(m->mgid));
      warned = true;
    }
  }
}

int Join(rdma_cm_id* id, const sockaddr* addr, uint16_t join_flags, void* context,
         const char* what) {
  if (id == nullptr || addr == nullptr) {
    Log().warn("{}: {} is NULL", what, id == nullptr ? "the id" : "the address");
    return Fail(EINVAL);
  }
  if (!LiveId(id, what)) return Fail(EINVAL);
  if (int error = Init(); error != 0) return Fail(error);
  Id* p = ToId(id);
  if (int error = CheckJoin(p, addr, what); error != 0) return Fail(error);
  auto* m = new (std::nothrow) Membership;
  if (m == nullptr) return Fail(ENOMEM);
  std::memcpy(&m->addr, addr, sizeof(sockaddr_in));
  m->context = context;
  m->join_flags = join_flags;
  // RoCE v2's MGID of an IPv4 group (the kernel's cma_iboe_set_mgid).
  m->mgid = MappedGid(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr);
  Event* event = NewJoinEvent(p, m);
  if (event == nullptr) {
    delete m;
    return Fail(ENOMEM);
  }
  {
    std::lock_guard lock(p->mc_mu);
    p->memberships.push_back(m);
  }
  Log().debug("rdma cm: id {} joins {} ({})", p->handle, GidString(m->mgid),
              join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER ? "send-only" : "full member");
  Deliver(event);
  return Complete(p);
}

}  // namespace

void ProcessJoin(Event* event) {
  Id* p = event->target;
  Membership* m = event->mc;
  int error;
  {
    std::lock_guard lock(p->mc_mu);
    error = AttachLocked(p, m);
  }
  if (error == 0) return;
  Log().warn("rdma_get_cm_event: id {} joined {}, but attaching its qp {} to the group "
             "failed ({}): the event is RDMA_CM_EVENT_MULTICAST_ERROR",
             p->handle, GidString(m->mgid), p->id.qp->qp_num, std::strerror(error));
  event->event.event = RDMA_CM_EVENT_MULTICAST_ERROR;
  // rdma-core's status here is rdma_seterrno's -1, the reason in errno.
  event->event.status = -1;
  errno = error;
}

void DetachAll(Id* p) {
  std::lock_guard lock(p->mc_mu);
  for (Membership* m : p->memberships) DetachLocked(p, m, "rdma_destroy_qp");
}

void LeaveAll(Id* p) {
  std::lock_guard lock(p->mc_mu);
  for (Membership* m : p->memberships) {
    DetachLocked(p, m, "rdma_destroy_id");
    m->left = true;
  }
}

void FreeMemberships(Id* p) {
  std::lock_guard lock(p->mc_mu);
  for (Membership* m : p->memberships) delete m;
  p->memberships.clear();
}

}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  return Join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context, "rdma_join_multicast");
}

int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
  const char* what = "rdma_join_multicast_ex";
  if (id == nullptr || attr == nullptr) {
    Log().warn("{}: {} is NULL", what, id == nullptr ? "the id" : "the attributes");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_join_multicast_ex")) return Fail(EINVAL);
  if (attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) {
    Log().warn("{}: comp_mask {:#x} has bits this library does not know", what,
               attr->comp_mask);
    return Fail(ENOTSUP);
  }
  if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) {
    Log().warn("{}: comp_mask lacks RDMA_CM_JOIN_MC_ATTR_ADDRESS", what);
    return Fail(EINVAL);
  }
  if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
      attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED) {
    Log().warn("{}: join_flags must be given (RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) and be "
               "RDMA_MC_JOIN_FLAG_FULLMEMBER or RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER", what);
    return Fail(EINVAL);
  }
  return Join(id, attr->addr, static_cast<uint16_t>(attr->join_flags), context, what);
}

int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  const char* what = "rdma_leave_multicast";
  if (id == nullptr || addr == nullptr) {
    Log().warn("{}: {} is NULL", what, id == nullptr ? "the id" : "the address");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_leave_multicast")) return Fail(EINVAL);
  size_t length = AddressLength(addr);
  if (length == 0) {
    Log().warn("{}: address family {} is not a group address", what, addr->sa_family);
    return Fail(EINVAL);
  }
  Id* p = ToId(id);
  Membership* m = nullptr;
  {
    std::lock_guard lock(p->mc_mu);
    // Newest first, as rdma-core's list: a group joined twice is left once
    // per call.
    auto& list = p->memberships;
    auto found = std::find_if(list.rbegin(), list.rend(), [&](const Membership* joined) {
      return std::memcmp(&joined->addr, addr, length) == 0;
    });
    if (found != list.rend()) {
      m = *found;
      DetachLocked(p, m, what);
      m->left = true;
      list.erase(std::next(found).base());
    }
  }
  if (m == nullptr) {
    Log().warn("{}: id {} has not joined that group (the address must be the one given to "
               "rdma_join_multicast, port included)", what, p->handle);
    return Fail(EADDRNOTAVAIL);
  }
  // A sync id holds its join's event in id->event until its next call;
  // waiting for that ack would never end.
  if (p->sync && id->event != nullptr && reinterpret_cast<Event*>(id->event)->mc == m) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  // Its events not taken yet go; those taken must be acked first.
  for (Event* event : RemoveEvents(p->route.load(), m)) delete event;
  WaitForAcks(p, m);
  Log().debug("rdma cm: id {} left {}", p->handle, GidString(m->mgid));
  delete m;
  return 0;
}

}  // extern "C"
