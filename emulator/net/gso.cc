// BuildGso: which queued datagrams leave together as one UDP GSO send.
// Runs on the thread that flushes the sends: the loop thread, or an
// application thread that drives (Loop::Drive).
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "emulator/net/loop_internal.h"

namespace rdmaemu::net::internal {
namespace {

bool SameDestination(const SendSlot& a, const SendSlot& b) {
  return a.socket == b.socket && a.tos == b.tos && a.to.sin_addr.s_addr == b.to.sin_addr.s_addr &&
         a.to.sin_port == b.to.sin_port;
}

bool Multicast(const sockaddr_in& to) { return (ntohl(to.sin_addr.s_addr) >> 28) == 0xe; }

}  // namespace

void BuildGso(SendPool& pool, const std::function<int(int)>& id_at, int available, bool gso,
              GsoMessage* out) {
  SendSlot& first = pool[id_at(0)];
  out->count = 1;
  out->msg = first.msg;
  // A group's datagrams go out one by one: its members' sockets
  // (UdpSocket::OpenGroup) do not turn on UDP_GRO, and multicast with GSO
  // (looped back to local members as a copy) was never tried.
  if (!gso || Multicast(first.to)) return;
  const size_t segment = first.length;
  if (segment == 0 || segment > kMaxGsoBytes / 2) return;
  size_t total = segment;
  size_t pieces = 0;
  // Pieces that lie end to end (copies in the pool's CopyArena) become one.
  auto add = [&](const SendSlot& s) {
    for (size_t i = 0; i < s.msg.msg_iovlen; ++i) {
      if (pieces > 0 && static_cast<uint8_t*>(out->iov[pieces - 1].iov_base) + out->iov[pieces - 1].iov_len ==
                            s.iov[i].iov_base) {
        out->iov[pieces - 1].iov_len += s.iov[i].iov_len;
      } else {
        out->iov[pieces++] = s.iov[i];
      }
    }
  };
  add(first);
  int n = 1;
  while (n < available && n < kMaxGsoSegments) {
    const SendSlot& next = pool[id_at(n)];
    const size_t size = next.length;
    if (!SameDestination(first, next) || size == 0 || size > segment || total + size > kMaxGsoBytes ||
        pieces + next.msg.msg_iovlen > out->iov.size()) {
      break;
    }
    add(next);
    ++n;
    total += size;
    if (size < segment) break;  // only the last may be shorter
  }
  if (n == 1) return;

  msghdr& m = out->msg;
  m = {};
  m.msg_name = &first.to;
  m.msg_namelen = sizeof(first.to);
  m.msg_iov = out->iov.data();
  m.msg_iovlen = pieces;
  m.msg_control = out->control;
  m.msg_controllen = CMSG_SPACE(sizeof(uint16_t)) + (first.tos != 0 ? CMSG_SPACE(sizeof(int)) : 0);
  std::memset(out->control, 0, sizeof(out->control));
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  const auto gso_size = static_cast<uint16_t>(segment);
  std::memcpy(CMSG_DATA(c), &gso_size, sizeof(gso_size));
  if (first.tos != 0) {
    c = CMSG_NXTHDR(&m, c);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int value = first.tos;
    std::memcpy(CMSG_DATA(c), &value, sizeof(value));
  }
  out->count = n;
}

bool GsoRefused(int err) {
  // EINVAL: no UDP_SEGMENT (before Linux 4.18) or a segment larger than the
  // route's MTU; EIO: a device without checksum offload, or IPsec;
  // ENOPROTOOPT/EOPNOTSUPP: a kernel built without it; EMSGSIZE: more
  // than the route takes at once.
  return err == EINVAL || err == EIO || err == ENOPROTOOPT || err == EOPNOTSUPP || err == EMSGSIZE;
}

}  // namespace rdmaemu::net::internal
