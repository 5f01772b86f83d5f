// DirectIo: recvmmsg and sendmmsg on the drive lock holder's thread.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emulator/base/log.h"
#include "emulator/net/loop_internal.h"

namespace rdmaemu::net::internal {
namespace {

// What a receive's control messages say, read in one walk: the destination
// address (IP_PKTINFO), the TOS byte, and the size of each datagram of a
// UDP GRO receive (0 if it holds one).
struct ControlFields {
  in_addr dst{INADDR_ANY};
  uint8_t tos = 0;
  size_t gro_segment = 0;
};

ControlFields ReadControl(const msghdr& msg) {
  ControlFields out;
  for (const cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo info;
      std::memcpy(&info, CMSG_DATA(c), sizeof(info));
      out.dst = info.ipi_addr;
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
      out.tos = *CMSG_DATA(c);
    } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int segment;
      std::memcpy(&segment, CMSG_DATA(c), sizeof(segment));
      out.gro_segment = segment > 0 ? static_cast<size_t>(segment) : 0;
    }
  }
  return out;
}

}  // namespace

DirectIo::~DirectIo() {
  if (buffers_ != nullptr) munmap(buffers_, size_t{kBatch} * kReceiveBufferBytes);
}

bool DirectIo::ReceiveAll(int fd, int owner, LoopHandler& handler, const std::atomic<bool>& stop) {
  if (buffers_ == nullptr) {
    // Mapped, not allocated: the kernel writes only what arrives, so the
    // pages of room kept for GRO receives cost nothing until used.
    void* p = mmap(nullptr, size_t{kBatch} * kReceiveBufferBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      Add(counters_.receive_errors);
      RDMAEMU_WARN_LIMITED("cannot map receive buffers: {}", ErrnoText(errno));
      return false;
    }
    buffers_ = static_cast<uint8_t*>(p);
  }
  bool delivered = false;
  for (int round = 0; round < kReceiveRounds && !stop.load(std::memory_order_relaxed); ++round) {
    for (int i = 0; i < kBatch; ++i) {
      iovs_[i] = {buffers_ + static_cast<size_t>(i) * kReceiveBufferBytes, kReceiveBufferBytes};
      msghdr& m = msgs_[i].msg_hdr;
      m = {};
      m.msg_name = &names_[i];
      m.msg_namelen = sizeof(names_[i]);
      m.msg_iov = &iovs_[i];
      m.msg_iovlen = 1;
      m.msg_control = controls_[i].bytes;
      m.msg_controllen = sizeof(controls_[i].bytes);
    }
    const int n = recvmmsg(fd, msgs_.data(), kBatch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // ECONNREFUSED and friends: an ICMP error for an earlier send.
      Add(counters_.receive_errors);
      Log().debug("recvmmsg: {}", ErrnoText(errno));
      continue;
    }
    batch_.clear();
    uint64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      const msghdr& m = msgs_[i].msg_hdr;
      if (m.msg_flags & MSG_TRUNC) {
        Add(counters_.receive_errors);
        RDMAEMU_WARN_LIMITED("dropped a datagram larger than {} bytes", kReceiveBufferBytes);
        continue;
      }
      const ControlFields control = ReadControl(m);
      Datagram d;
      d.src = names_[i];
      d.dst = control.dst;
      d.tos = control.tos;
      d.socket = owner;
      const size_t segment = control.gro_segment;
      const std::span<const uint8_t> data{static_cast<const uint8_t*>(iovs_[i].iov_base), msgs_[i].msg_len};
      if (segment != 0 && data.size() > segment) Add(counters_.gro_receives);
      ForEachDatagram(data, segment, [&](std::span<const uint8_t> piece) {
        d.data = piece;
        batch_.push_back(d);
      });
      bytes += msgs_[i].msg_len;
    }
    if (!batch_.empty() && !stop.load(std::memory_order_relaxed)) {
      Add(counters_.datagrams_received, batch_.size());
      Add(counters_.bytes_received, bytes);
      Add(counters_.batches);
      handler.OnDatagrams(batch_);
      delivered = true;
    }
    if (n < kBatch) break;
  }
  return delivered;
}

bool DirectIo::Queue(int socket, const sockaddr_in& to, std::span<const iovec> iov, uint8_t tos,
                     Gathered gathered) {
  const int id = pool_.Acquire(socket, to, iov, tos, gathered);
  if (id < 0) {
    Add(counters_.send_drops);
    return false;
  }
  queue_[(queue_head_ + queue_size_) % queue_.size()] = id;
  ++queue_size_;
  return queue_size_ >= static_cast<size_t>(kBatch);
}

DirectIo::Flushed DirectIo::Flush(std::span<const int> fds, int* blocked_socket) {
  while (queue_size_ > 0) {
    // One sendmmsg carries consecutive datagrams of one socket, runs of
    // them as one GSO send each.
    const int socket = pool_[queue_[queue_head_]].socket;
    const int most = static_cast<int>(std::min<size_t>(queue_size_, kBatch));
    auto id_at = [&](int k) { return queue_[(queue_head_ + k) % queue_.size()]; };
    int k = 0;
    for (int taken = 0; taken < most; ++k) {
      if (pool_[id_at(taken)].socket != socket) break;
      BuildGso(
          pool_, [&](int j) { return id_at(taken + j); }, most - taken, gso_, &gso_messages_[k]);
      send_msgs_[k] = {};
      send_msgs_[k].msg_hdr = gso_messages_[k].msg;
      taken += gso_messages_[k].count;
    }
    const int n = sendmmsg(fds[socket], send_msgs_.data(), k, MSG_DONTWAIT);
    int done = 0;  // datagrams sent or dropped, from the head
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        Add(counters_.send_retries);
        *blocked_socket = socket;
        return Flushed::kWouldBlock;
      }
      if (err == ENOBUFS) {
        Add(counters_.send_retries);
        return Flushed::kNoBuffers;
      }
      if (gso_messages_[0].count > 1 && GsoRefused(err)) {
        // The datagrams go again one by one: each then meets its own fate.
        gso_ = false;
        Log().info("UDP GSO refused by the kernel ({}): sending one datagram per packet", ErrnoText(err));
        continue;
      }
      // Refused for good (ECONNREFUSED from an ICMP error, EMSGSIZE, ...):
      // count it, drop that datagram and go on with the rest.
      Add(counters_.send_errors);
      Log().debug("sendmmsg to {}: {}", ToString(pool_[queue_[queue_head_]].to), ErrnoText(err));
      done = 1;
    } else {
      uint64_t bytes = 0;
      for (int i = 0; i < n; ++i) {
        bytes += send_msgs_[i].msg_len;
        done += gso_messages_[i].count;
        if (gso_messages_[i].count > 1) Add(counters_.gso_sends);
      }
      Add(counters_.datagrams_sent, done);
      Add(counters_.bytes_sent, bytes);
    }
    for (int i = 0; i < done; ++i) {
      pool_.Release(queue_[queue_head_]);
      queue_head_ = (queue_head_ + 1) % queue_.size();
      --queue_size_;
    }
  }
  return Flushed::kAll;
}

}  // namespace rdmaemu::net::internal
