// The kernel's own ceiling for the emulator's bandwidth rows (issue 13):
// how fast Linux moves the same bytes over loopback when they are cut into
// RoCE-sized datagrams, as the emulator must send them, with no RDMA work
// at all (no headers built, no ICRC, no copy into registered memory).
//
// Why: `uc_bw` is compared with qperf's `udp_bw` at 32 KiB, where the
// kernel carries each message as one 32 KiB datagram. The emulator may not:
// RoCE's largest MTU is 4096, so a 32 KiB UC message is eight datagrams,
// sent as one UDP GSO send. If the kernel alone moves those eight slower
// than the one, no emulator over UDP sockets reaches 1.0 on that row, and
// the bench says so next to the ratio instead of leaving it to be guessed.
//
// Every case uses the same receiver, as qperf's udp_bw has one: a thread
// that sleeps in recvmmsg until datagrams come (with UDP_GRO on, as the
// emulator's sockets have it). Run by tools/bench; a benchmark, not a test.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

using Clock = std::chrono::steady_clock;

// A UC SEND_MIDDLE packet's UDP payload: BTH, 4096 bytes, ICRC.
constexpr size_t kHeader = 12;
constexpr size_t kPayload = 4096;
constexpr size_t kTrailer = 4;
constexpr size_t kSegment = kHeader + kPayload + kTrailer;

// How one message's bytes are handed to the kernel.
enum class Shape {
  kDatagram,  // one datagram of the whole message (qperf udp_bw)
  kGsoOnePiece,  // RoCE-sized GSO datagrams from one contiguous buffer
  kGsoCopied,    // ... one iovec per datagram (each in its own buffer)
  kGsoGathered,  // ... three iovecs per datagram: header, payload, trailer
};

struct Case {
  std::string name;
  std::string what;
  Shape shape;
  size_t message;  // payload bytes per message
};

size_t PiecesPerSegment(Shape shape) {
  switch (shape) {
    case Shape::kGsoCopied: return 1;
    case Shape::kGsoGathered: return 3;
    default: return 0;  // one iovec for the whole message
  }
}

[[noreturn]] void Fail(const std::string& what) {
  fmt::print(stderr, "udp_ceiling: {}: {}\n", what, std::strerror(errno));
  std::exit(1);
}

// Bytes of payload (RoCE payload for the GSO shapes) received per second.
double Measure(const Case& c, double seconds) {
  const int rx = socket(AF_INET, SOCK_DGRAM, 0);
  const int tx = socket(AF_INET, SOCK_DGRAM, 0);
  if (rx < 0 || tx < 0) Fail("socket");
  const int buffer = 4 << 20;
  const int on = 1;
  // Not fatal: SO_RCVBUF is capped by net.core.rmem_max and UDP_GRO needs
  // Linux 5.0; qperf's receiver has neither.
  setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  setsockopt(rx, IPPROTO_UDP, UDP_GRO, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(rx, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Fail("bind");
  if (getsockname(rx, reinterpret_cast<sockaddr*>(&addr), &len) != 0) Fail("getsockname");
  if (connect(tx, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Fail("connect");

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  std::thread receiver([&] {
    constexpr int kBatch = 16;
    std::vector<uint8_t> buffers(kBatch * 65536);
    mmsghdr msgs[kBatch]{};
    iovec iovs[kBatch];
    for (int i = 0; i < kBatch; ++i) {
      iovs[i] = {buffers.data() + static_cast<size_t>(i) * 65536, 65536};
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t bytes = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const int n = recvmmsg(rx, msgs, kBatch, MSG_WAITFORONE, nullptr);
      if (n < 0) {
        if (errno == EINTR) continue;
        Fail("recvmmsg");
      }
      for (int i = 0; i < n; ++i) bytes += msgs[i].msg_len;
    }
    received.store(bytes);
  });

  // The message's bytes, laid out as the shape hands them over.
  const size_t segments = (c.message + kPayload - 1) / kPayload;
  std::vector<uint8_t> contiguous(segments * kSegment, 0x5a);
  std::vector<std::vector<uint8_t>> copies(segments, std::vector<uint8_t>(kSegment, 0x5a));
  std::vector<uint8_t> payload(c.message, 0x5a);
  std::vector<uint8_t> headers(segments * (kHeader + kTrailer), 0);
  std::vector<iovec> iov;
  switch (c.shape) {
    case Shape::kDatagram:
      iov.push_back({payload.data(), payload.size()});
      break;
    case Shape::kGsoOnePiece:
      iov.push_back({contiguous.data(), contiguous.size()});
      break;
    case Shape::kGsoCopied:
      for (auto& copy : copies) iov.push_back({copy.data(), copy.size()});
      break;
    case Shape::kGsoGathered:
      for (size_t s = 0; s < segments; ++s) {
        uint8_t* h = headers.data() + s * (kHeader + kTrailer);
        iov.push_back({h, kHeader});
        iov.push_back({payload.data() + s * kPayload, kPayload});
        iov.push_back({h + kHeader, kTrailer});
      }
      break;
  }
  // A GSO send carries at most 65507 bytes (an IPv4 datagram's payload):
  // a longer message leaves in several, as the emulator sends it.
  const size_t pieces = PiecesPerSegment(c.shape);
  const size_t per_send = pieces == 0 ? iov.size() : 65507 / kSegment * pieces;
  std::vector<msghdr> sends;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(uint16_t))]{};
  for (size_t at = 0; at < iov.size(); at += per_send) {
    msghdr msg{};
    msg.msg_iov = iov.data() + at;
    msg.msg_iovlen = std::min(per_send, iov.size() - at);
    if (c.shape != Shape::kDatagram) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    sends.push_back(msg);
  }
  if (c.shape != Shape::kDatagram) {
    cmsghdr* cm = CMSG_FIRSTHDR(&sends.front());
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const uint16_t size = kSegment;
    std::memcpy(CMSG_DATA(cm), &size, sizeof(size));
  }

  const Clock::time_point start = Clock::now();
  const auto budget = std::chrono::duration<double>(seconds);
  Clock::duration spent{};
  do {
    for (int i = 0; i < 16; ++i) {
      for (const msghdr& msg : sends) {
        if (sendmsg(tx, &msg, 0) < 0 && errno != ENOBUFS && errno != EAGAIN) Fail("sendmsg");
      }
    }
    spent = Clock::now() - start;
  } while (spent < budget);
  stop.store(true);
  // Wakes the receiver if it sleeps; a zero-length datagram adds no bytes.
  if (send(tx, "", 0, 0) < 0) Fail("send");
  receiver.join();
  close(rx);
  close(tx);
  double bytes = static_cast<double>(received.load());
  // The GSO shapes' datagrams carry headers and trailers too: count only
  // the message's bytes, as qperf counts only its messages'.
  if (c.shape != Shape::kDatagram) bytes = bytes * kPayload / kSegment;
  return bytes / std::chrono::duration<double>(spent).count();
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1;
  if (argc == 3 && std::string_view(argv[1]) == "--seconds") seconds = std::atof(argv[2]);
  if (argc != 1 && !(argc == 3 && seconds > 0)) {
    std::fprintf(stderr, "usage: udp_ceiling [--seconds S]   (per case, default 1)\n");
    return 2;
  }
  const Case cases[] = {
      {"udp_32k", "32 KiB datagrams (qperf udp_bw -m 32K)", Shape::kDatagram, 32768},
      {"gso_32k", "32 KiB as 8 GSO datagrams of 4 KiB, one buffer", Shape::kGsoOnePiece, 32768},
      {"gso_32k_copied", "32 KiB as 8 GSO datagrams, one iovec each", Shape::kGsoCopied, 32768},
      {"gso_32k_gathered", "32 KiB as 8 GSO datagrams, three iovecs each", Shape::kGsoGathered, 32768},
      {"gso_64k_gathered", "64 KiB as 16 datagrams in 2 GSO sends, 3 iovecs each", Shape::kGsoGathered, 65536},
  };
  // One line per case: NAME GB/s DESCRIPTION (tools/bench reads the first two).
  for (const Case& c : cases) {
    fmt::print("{:<18} {:>8.3f} Gb/s  {}\n", c.name, Measure(c, seconds) * 8 / 1e9, c.what);
    std::fflush(stdout);
  }
  return 0;
}
