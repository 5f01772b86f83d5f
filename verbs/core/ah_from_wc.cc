// ibv_init_ah_from_wc and ibv_create_ah_from_wc: the address handle that
// answers a received UD message (udaddy, rdma_cm servers). On RoCE v2 over
// IPv4 the 40-byte GRH area of the receive holds 20 unused bytes and then
// the IPv4 header (as the device writes it, as rxe does), so the reply's
// GIDs are the IPv4-mapped source and destination of that header.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/ip.h>

#include <cerrno>
#include <cstring>

#include "emulator/base/log.h"
#include "provider/handles.h"

namespace {

using rdmaemu::Log;

ibv_gid MappedGid(uint32_t ip_be) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  std::memcpy(&g.raw[12], &ip_be, 4);
  return g;
}

// The index of `gid` in the port's table, or -1.
int FindGidIndex(ibv_context* context, uint8_t port_num, const ibv_gid& gid) {
  ibv_port_attr port{};
  if (ibv_query_port(context, port_num, &port) != 0) return -1;
  for (int i = 0; i < port.gid_tbl_len; ++i) {
    ibv_gid entry{};
    if (ibv_query_gid(context, port_num, i, &entry) == 0 && std::memcmp(&entry, &gid, sizeof gid) == 0) return i;
  }
  return -1;
}

}  // namespace

extern "C" {

int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  if (context == nullptr || wc == nullptr || ah_attr == nullptr) {
    Log().warn("ibv_init_ah_from_wc: NULL {}", context == nullptr ? "context" : wc == nullptr ? "wc" : "ah_attr");
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH)) return 0;
  if (grh == nullptr) {
    Log().warn("ibv_init_ah_from_wc: the completion has IBV_WC_GRH but no GRH buffer was given");
    errno = EINVAL;
    return -1;
  }
  ibv_port_attr port{};
  if (ibv_query_port(context, port_num, &port) != 0) return -1;
  ah_attr->is_global = 1;
  ah_attr->grh.hop_limit = 0xff;
  if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    // RoCE v2: the IPv4 header sits in the second half of the GRH area.
    iphdr ip;
    std::memcpy(&ip, reinterpret_cast<const uint8_t*>(grh) + 20, sizeof ip);
    if (ip.version != 4) {
      Log().warn("ibv_init_ah_from_wc: the GRH area holds no IPv4 header (version {})", static_cast<unsigned>(ip.version));
      errno = EINVAL;
      return -1;
    }
    ah_attr->grh.dgid = MappedGid(ip.saddr);
    ah_attr->grh.traffic_class = ip.tos;
    const int index = FindGidIndex(context, port_num, MappedGid(ip.daddr));
    if (index < 0) {
      Log().warn("ibv_init_ah_from_wc: the message was sent to an address port {} has no GID for", port_num);
      errno = ENOENT;
      return -1;
    }
    ah_attr->grh.sgid_index = static_cast<uint8_t>(index);
    return 0;
  }
  // InfiniBand: the GRH as the IBA lays it out.
  ah_attr->grh.dgid = grh->sgid;
  const uint32_t flow = ntohl(grh->version_tclass_flow);
  ah_attr->grh.flow_label = flow & 0xfffff;
  ah_attr->grh.traffic_class = static_cast<uint8_t>(flow >> 20);
  const int index = FindGidIndex(context, port_num, grh->dgid);
  if (index < 0) {
    errno = ENOENT;
    return -1;
  }
  ah_attr->grh.sgid_index = static_cast<uint8_t>(index);
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!rdmaemu::provider::LiveHandle(pd, rdmaemu::provider::Kind::kPd, "ibv_create_ah_from_wc")) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) != 0) return nullptr;
  return ibv_create_ah(pd, &attr);
}

}  // extern "C"
