// rdma_getaddrinfo(3) and rdma_freeaddrinfo: getaddrinfo(3) in RDMA terms, as
// rdma-core 44's librdmacm/addrinfo.c behaves.
//
//  - The hints' QP type picks the socket type (RC, UC, XRC: SOCK_STREAM; UD:
//    SOCK_DGRAM) and their port space the protocol (TCP: IPPROTO_TCP; UDP and
//    IPoIB: IPPROTO_UDP; IB: the socket type's). RAI_PASSIVE and
//    RAI_NUMERICHOST become AI_PASSIVE and AI_NUMERICHOST; no other flag
//    reaches getaddrinfo (so no canonical name is asked for). NULL hints give
//    getaddrinfo NULL hints, so glibc's defaults apply.
//  - Only the first answer is kept: the result is one rdma_addrinfo, never a
//    chain. A QP type and port space the hints leave 0 come from that
//    answer's socket type and protocol. A passive answer fills ai_src_addr
//    (and flags RAI_PASSIVE), an active one ai_dst_addr; a source address in
//    the hints fills ai_src_addr when the answer did not.
//  - RAI_FAMILY with ai_family AF_IB and RAI_NUMERICHOST turns an IPv6 answer
//    into a struct sockaddr_ib (the address as GID, P_Key 0xffff, the service
//    ID of the port space and port).
//  - With neither node nor service, the result is the hints themselves (their
//    flags, family, QP type, port space and addresses).
//  - Failures: neither node, service nor hints is EINVAL; no RDMA device is
//    ENODEV (both -1 with errno, as rdma-core's ucma_init); a failed lookup
//    returns getaddrinfo's own EAI_* code; memory is ENOMEM.
//  - rdma-core asks ibacm for path records (ai_route) and connection data
//    (ai_connect) on active lookups. There is no ibacm here: those stay empty,
//    as they do on rdma-core without a running ibacm.

#include <endian.h>
#include <errno.h>
#include <infiniband/ib.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

// errno = `error`, and the -1 that rdma-core's ERR() returns.
int Fail(int error) {
  errno = error;
  return -1;
}

// rdma-core's ucma_init fails with ENODEV when libibverbs lists no device.
bool HaveDevice() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return false;
  ibv_free_device_list(list);
  return n > 0;
}

addrinfo ToSocketHints(const rdma_addrinfo& hints) {
  addrinfo ai;
  std::memset(&ai, 0, sizeof(ai));
  if (hints.ai_flags & RAI_PASSIVE) ai.ai_flags |= AI_PASSIVE;
  if (hints.ai_flags & RAI_NUMERICHOST) ai.ai_flags |= AI_NUMERICHOST;
  // getaddrinfo knows no AF_IB: an AF_IB lookup resolves any IP family.
  if (hints.ai_family != AF_IB) ai.ai_family = hints.ai_family;

  switch (hints.ai_qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      ai.ai_socktype = SOCK_STREAM;
      break;
    case IBV_QPT_UD:
      ai.ai_socktype = SOCK_DGRAM;
      break;
    default:
      break;
  }

  switch (hints.ai_port_space) {
    case RDMA_PS_TCP:
      ai.ai_protocol = IPPROTO_TCP;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      ai.ai_protocol = IPPROTO_UDP;
      break;
    case RDMA_PS_IB:
      if (ai.ai_socktype == SOCK_STREAM) ai.ai_protocol = IPPROTO_TCP;
      if (ai.ai_socktype == SOCK_DGRAM) ai.ai_protocol = IPPROTO_UDP;
      break;
    default:
      break;
  }
  return ai;
}

// A malloc'ed copy of `src` (rdma_freeaddrinfo frees it).
int CopyAddress(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t src_len) {
  *dst = static_cast<sockaddr*>(std::malloc(src_len));
  if (*dst == nullptr) return Fail(ENOMEM);
  std::memcpy(*dst, src, src_len);
  *dst_len = src_len;
  return 0;
}

// An IPv6 answer as an AF_IB address: the IPv6 address is the GID, and the
// service ID is the port space's prefix plus the port (rdma-core's
// ucma_set_sid), with the masks of the parts that are set.
int ToIbAddress(int port_space, sockaddr** dst, socklen_t* dst_len, const sockaddr_in6& src) {
  auto* sib = static_cast<sockaddr_ib*>(std::calloc(1, sizeof(sockaddr_ib)));
  if (sib == nullptr) return Fail(ENOMEM);
  sib->sib_family = AF_IB;
  sib->sib_pkey = htobe16(0xffff);
  sib->sib_flowinfo = src.sin6_flowinfo;
  std::memcpy(sib->sib_addr.sib_raw, src.sin6_addr.s6_addr, sizeof(sib->sib_addr.sib_raw));
  const uint16_t port = be16toh(src.sin6_port);
  sib->sib_sid = htobe64((static_cast<uint64_t>(port_space) << 16) + port);
  uint64_t mask = 0;
  if (port_space != 0) mask |= RDMA_IB_IP_PS_MASK;
  if (port != 0) mask |= RDMA_IB_IP_PORT_MASK;
  sib->sib_sid_mask = htobe64(mask);
  sib->sib_scope_id = src.sin6_scope_id;
  *dst = reinterpret_cast<sockaddr*>(sib);
  *dst_len = sizeof(sockaddr_ib);
  return 0;
}

// Fills `rai` from getaddrinfo's first answer.
int FromSocketAnswer(rdma_addrinfo* rai, const rdma_addrinfo& hints, const addrinfo& ai) {
  if (hints.ai_qp_type != 0) {
    rai->ai_qp_type = hints.ai_qp_type;
  } else if (ai.ai_socktype == SOCK_STREAM) {
    rai->ai_qp_type = IBV_QPT_RC;
  } else if (ai.ai_socktype == SOCK_DGRAM) {
    rai->ai_qp_type = IBV_QPT_UD;
  }

  if (hints.ai_port_space != 0) {
    rai->ai_port_space = hints.ai_port_space;
  } else if (ai.ai_protocol == IPPROTO_TCP) {
    rai->ai_port_space = RDMA_PS_TCP;
  } else if (ai.ai_protocol == IPPROTO_UDP) {
    rai->ai_port_space = RDMA_PS_UDP;
  }

  const bool passive = (ai.ai_flags & AI_PASSIVE) != 0;
  if (passive) rai->ai_flags = RAI_PASSIVE;
  sockaddr** addr = passive ? &rai->ai_src_addr : &rai->ai_dst_addr;
  socklen_t* len = passive ? &rai->ai_src_len : &rai->ai_dst_len;
  char** canonname = passive ? &rai->ai_src_canonname : &rai->ai_dst_canonname;

  if (ai.ai_canonname != nullptr) {
    *canonname = strdup(ai.ai_canonname);
    if (*canonname == nullptr) return Fail(ENOMEM);
  }

  // rdma-core converts whatever came back; only an IPv6 answer has the GID an
  // AF_IB address needs, so any other stays an IP address.
  const bool want_ib = (hints.ai_flags & RAI_FAMILY) && hints.ai_family == AF_IB &&
                       (hints.ai_flags & RAI_NUMERICHOST);
  if (want_ib && ai.ai_family == AF_INET6 && ai.ai_addrlen >= sizeof(sockaddr_in6)) {
    rai->ai_family = AF_IB;
    sockaddr_in6 in6;
    std::memcpy(&in6, ai.ai_addr, sizeof(in6));
    return ToIbAddress(rai->ai_port_space, addr, len, in6);
  }
  rai->ai_family = ai.ai_family;
  return CopyAddress(addr, len, ai.ai_addr, ai.ai_addrlen);
}

}  // namespace

extern "C" {

int rdma_getaddrinfo(const char* node, const char* service, const struct rdma_addrinfo* hints,
                     struct rdma_addrinfo** res) {
  if (node == nullptr && service == nullptr && hints == nullptr) return Fail(EINVAL);
  if (!HaveDevice()) return Fail(ENODEV);

  auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (rai == nullptr) return Fail(ENOMEM);

  static const rdma_addrinfo kNoHints{};
  const rdma_addrinfo& h = hints != nullptr ? *hints : kNoHints;

  int ret = 0;
  if (node != nullptr || service != nullptr) {
    addrinfo* answers = nullptr;
    if (hints != nullptr) {
      const addrinfo ai_hints = ToSocketHints(*hints);
      ret = getaddrinfo(node, service, &ai_hints, &answers);
    } else {
      ret = getaddrinfo(node, service, nullptr, &answers);
    }
    if (ret != 0) {
      std::free(rai);
      return ret;  // the EAI_* code itself (callers use gai_strerror)
    }
    ret = FromSocketAnswer(rai, h, *answers);
    freeaddrinfo(answers);
  } else {
    rai->ai_flags = h.ai_flags;
    rai->ai_family = h.ai_family;
    rai->ai_qp_type = h.ai_qp_type;
    rai->ai_port_space = h.ai_port_space;
    if (h.ai_dst_len != 0) {
      ret = CopyAddress(&rai->ai_dst_addr, &rai->ai_dst_len, h.ai_dst_addr, h.ai_dst_len);
    }
  }

  if (ret == 0 && rai->ai_src_len == 0 && h.ai_src_len != 0) {
    ret = CopyAddress(&rai->ai_src_addr, &rai->ai_src_len, h.ai_src_addr, h.ai_src_len);
  }
  if (ret != 0) {
    rdma_freeaddrinfo(rai);
    return ret;
  }
  *res = rai;
  return 0;
}

void rdma_freeaddrinfo(struct rdma_addrinfo* res) {
  while (res != nullptr) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_connect);
    std::free(res->ai_route);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res);
    res = next;
  }
}

}  // extern "C"
