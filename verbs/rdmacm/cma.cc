// What remains of rdma_cma.h: rdma_set_option, rdma_migrate_id,
// rdma_get_devices / rdma_free_devices, rdma_get_src_port /
// rdma_get_dst_port and ECE (multicast is multicast.cc's).
#include <infiniband/sa.h>
#include <rdma/rdma_cma.h>

#include <cstdlib>
#include <cstring>

#include "verbs/rdmacm/address.h"
#include "verbs/rdmacm/id.h"
#include "verbs/rdmacm/library.h"

namespace rdmaemu::rdmacm {
namespace {

// RDMA_OPTION_IB_PATH: the first primary path of `paths` becomes the
// route, and ROUTE_RESOLVED follows (the kernel's ucma_set_ib_path).
int SetIbPath(Id* p, const void* optval, size_t optlen) {
  if (optlen == 0 || optlen % sizeof(ibv_path_data) != 0) {
    Log().warn("rdma_set_option(RDMA_OPTION_IB_PATH): {} bytes is not an array of "
               "struct ibv_path_data ({} bytes each)", optlen, sizeof(ibv_path_data));
    return Fail(EINVAL);
  }
  if (p->state != State::kAddrResolved) {
    Log().warn("rdma_set_option(RDMA_OPTION_IB_PATH): id {} is {}: set the path after "
               "ADDR_RESOLVED", p->handle, StateName(p->state));
    return Fail(EINVAL);
  }
  const auto* paths = static_cast<const ibv_path_data*>(optval);
  size_t count = optlen / sizeof(ibv_path_data);
  const ibv_path_data* chosen = nullptr;
  for (size_t i = 0; i < count && chosen == nullptr; ++i) {
    if (paths[i].flags & IBV_PATH_FLAG_PRIMARY) chosen = &paths[i];
  }
  if (chosen == nullptr) chosen = &paths[0];
  const ibv_path_record& r = chosen->path;
  ibv_sa_path_rec& path = p->path;
  path = {};
  std::memcpy(path.dgid.raw, r.dgid.raw, 16);
  std::memcpy(path.sgid.raw, r.sgid.raw, 16);
  path.dlid = r.dlid;
  path.slid = r.slid;
  uint32_t flow_hop = ntohl(r.flowlabel_hoplimit);
  path.flow_label = htonl((flow_hop >> 8) & 0xfffff);
  path.hop_limit = static_cast<uint8_t>(flow_hop & 0xff);
  path.traffic_class = r.tclass;
  path.reversible = (r.reversible_numpath >> 7) & 1;
  path.numb_path = r.reversible_numpath & 0x7f;
  path.pkey = r.pkey;
  path.sl = static_cast<uint8_t>(ntohs(r.qosclass_sl) & 0xf);
  path.mtu_selector = r.mtu >> 6;
  path.mtu = r.mtu & 0x3f;
  path.rate_selector = r.rate >> 6;
  path.rate = r.rate & 0x3f;
  path.packet_life_time_selector = r.packetlifetime >> 6;
  path.packet_life_time = r.packetlifetime & 0x3f;
  path.preference = r.preference;
  p->id.route.path_rec = &p->path;
  p->id.route.num_paths = 1;
  if (path.mtu >= IBV_MTU_256 && path.mtu <= IBV_MTU_4096) p->path_mtu = path.mtu;
  p->state = State::kRouteResolved;
  if (int error = QueueLibraryEvent(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 0); error != 0) {
    return Fail(error);
  }
  return 0;
}

int DeviceOption(Id* p, int name, uint32_t value, const char* what) {
  if (int error = rdmaemu_cm_set_option(p->handle, name, value); error != 0) {
    Log().warn("rdma_set_option({}): id {}: {}", what, p->handle, std::strerror(error));
    return Fail(error);
  }
  return 0;
}

__be16 PortOf(const sockaddr* addr) {
  switch (addr->sa_family) {
    case AF_INET:
      return reinterpret_cast<const sockaddr_in*>(addr)->sin_port;
    case AF_INET6:
      return reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port;
    default:
      return 0;
  }
}

}  // namespace
}  // namespace rdmaemu::rdmacm

using namespace rdmaemu;
using namespace rdmaemu::rdmacm;

extern "C" {

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (id == nullptr || optval == nullptr) {
    Log().warn("rdma_set_option: {} is NULL", id == nullptr ? "the id" : "the value");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_set_option")) return Fail(EINVAL);
  Id* p = ToId(id);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS: {
        if (optlen != sizeof(uint8_t)) {
          Log().warn("rdma_set_option(RDMA_OPTION_ID_TOS): the value is a uint8_t, not {} bytes",
                     optlen);
          return Fail(EINVAL);
        }
        uint8_t tos = *static_cast<uint8_t*>(optval);
        if (DeviceOption(p, RDMAEMU_CM_OPT_TOS, tos, "RDMA_OPTION_ID_TOS") != 0) return -1;
        p->tos = tos;
        p->tos_set = true;
        return 0;
      }
      case RDMA_OPTION_ID_REUSEADDR:
      case RDMA_OPTION_ID_AFONLY: {
        const char* what = optname == RDMA_OPTION_ID_REUSEADDR ? "RDMA_OPTION_ID_REUSEADDR"
                                                                : "RDMA_OPTION_ID_AFONLY";
        if (optlen != sizeof(int)) {
          Log().warn("rdma_set_option({}): the value is an int, not {} bytes", what, optlen);
          return Fail(EINVAL);
        }
        int value = *static_cast<int*>(optval);
        return DeviceOption(p,
                            optname == RDMA_OPTION_ID_REUSEADDR ? RDMAEMU_CM_OPT_REUSEADDR
                                                                : RDMAEMU_CM_OPT_AFONLY,
                            value != 0, what);
      }
      case RDMA_OPTION_ID_ACK_TIMEOUT: {
        if (optlen != sizeof(uint8_t)) {
          Log().warn("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT): the value is a uint8_t, not "
                     "{} bytes", optlen);
          return Fail(EINVAL);
        }
        uint8_t timeout = *static_cast<uint8_t*>(optval);
        if (id->qp_type != IBV_QPT_RC) {
          Log().warn("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT): id {} is not RC", p->handle);
          return Fail(EINVAL);
        }
        if (timeout > 31) {
          Log().warn("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT): {} is more than 31", timeout);
          return Fail(EINVAL);
        }
        if (DeviceOption(p, RDMAEMU_CM_OPT_ACK_TIMEOUT, timeout, "RDMA_OPTION_ID_ACK_TIMEOUT") !=
            0) {
          return -1;
        }
        p->ack_timeout = timeout;
        return 0;
      }
      default:
        Log().warn("rdma_set_option: RDMA_OPTION_ID option {} is unknown", optname);
        return Fail(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB) {
    if (optname == RDMA_OPTION_IB_PATH) return SetIbPath(p, optval, optlen);
    Log().warn("rdma_set_option: RDMA_OPTION_IB option {} is unknown", optname);
    return Fail(ENOSYS);
  }
  Log().warn("rdma_set_option: level {} is unknown", level);
  return Fail(ENOSYS);
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (id == nullptr) {
    Log().warn("rdma_migrate_id: the id is NULL");
    return Fail(EINVAL);
  }
  if (!LiveId(id, "rdma_migrate_id")) return Fail(EINVAL);
  Id* p = ToId(id);
  if (p->sync && channel == nullptr) {
    Log().warn("rdma_migrate_id: id {} has its own channel already", p->handle);
    return Fail(EINVAL);
  }
  if (channel != nullptr && !LiveChannel(channel, "rdma_migrate_id")) return Fail(EINVAL);
  Channel* to = channel != nullptr ? ToChannel(channel) : NewChannel();
  if (to == nullptr) return -1;
  Channel* from = p->route.load();
  bool was_sync = p->sync;
  MoveEvents(p, from, to);
  if (was_sync && id->event != nullptr) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  p->sync = channel == nullptr;
  id->channel = &to->channel;
  // Events already taken from the old channel must be acked there first.
  WaitForAcks(p, "rdma_migrate_id");
  if (was_sync) DeleteChannel(from);
  return 0;
}

ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices != nullptr) *num_devices = 0;
  if (int error = Init(); error != 0) return FailNull<ibv_context*>(error);
  OpenAllDevices();
  std::vector<Device*> open = OpenDevices();
  auto** list = static_cast<ibv_context**>(std::calloc(open.size() + 1, sizeof(ibv_context*)));
  if (list == nullptr) return FailNull<ibv_context*>(ENOMEM);
  for (size_t i = 0; i < open.size(); ++i) list[i] = open[i]->context.load();
  if (num_devices != nullptr) *num_devices = static_cast<int>(open.size());
  return list;
}

void rdma_free_devices(ibv_context** list) { std::free(list); }

__be16 rdma_get_src_port(rdma_cm_id* id) {
  if (id == nullptr || !LiveId(id, "rdma_get_src_port")) return 0;
  return PortOf(&id->route.addr.src_addr);
}

__be16 rdma_get_dst_port(rdma_cm_id* id) {
  if (id == nullptr || !LiveId(id, "rdma_get_dst_port")) return 0;
  return PortOf(&id->route.addr.dst_addr);
}

int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id != nullptr && !LiveId(id, "rdma_set_local_ece")) return Fail(EINVAL);
  if (id == nullptr || id->qp != nullptr || ece == nullptr || ece->vendor_id == 0 ||
      ece->comp_mask != 0) {
    Log().warn("rdma_set_local_ece: needs an id without a QP yet and an ECE with a vendor_id "
               "and no comp_mask");
    return Fail(EINVAL);
  }
  ToId(id)->local_ece = *ece;
  return 0;
}

int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id != nullptr && !LiveId(id, "rdma_get_remote_ece")) return Fail(EINVAL);
  if (id == nullptr || id->qp != nullptr || ece == nullptr) {
    Log().warn("rdma_get_remote_ece: needs an id without a QP and an ECE to fill");
    return Fail(EINVAL);
  }
  // The device carries no ECE: the peer's is off (vendor_id 0).
  *ece = {};
  return 0;
}

}  // extern "C"
