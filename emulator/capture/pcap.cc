#include "emulator/capture/pcap.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>

#include <fmt/format.h>

#include "emulator/base/endian.h"
#include "emulator/base/log.h"

namespace rdmaemu::capture {
namespace {

constexpr uint32_t kMagicMicroseconds = 0xa1b2c3d4;
// Big enough that a busy engine writes rarely, small enough to stay cheap.
constexpr size_t kBufferBytes = 256 * 1024;

void StoreLe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void StoreLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// A locally administered unicast MAC carrying the IPv4 address, so each
// host's frames are told apart in Wireshark's Ethernet columns.
void WriteMac(uint8_t* p, uint32_t ip) {
  p[0] = 0x02;
  p[1] = 0x00;
  StoreBe32(p + 2, ip);
}

// Writers still open, flushed when the process exits normally (a program
// may exit without closing its device, and the engine is then never torn
// down). Leaked on purpose: it must outlive every static destructor.
std::mutex& LiveMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::set<PcapWriter*>& Live() {
  static auto* live = new std::set<PcapWriter*>;
  return *live;
}
void FlushAllAtExit() {
  std::lock_guard lock(LiveMu());
  for (PcapWriter* w : Live()) (void)w->Flush();
}

}  // namespace

uint16_t Ipv4Checksum(std::span<const uint8_t> header) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < header.size(); i += 2) sum += LoadBe16(header.data() + i);
  if (header.size() % 2) sum += uint32_t{header.back()} << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

void WriteFrameHeader(const Endpoints& e, size_t payload_bytes, uint16_t ip_id, uint8_t* out) {
  uint8_t* eth = out;
  WriteMac(eth, e.dst_ip);
  WriteMac(eth + 6, e.src_ip);
  StoreBe16(eth + 12, 0x0800);  // IPv4

  uint8_t* ip = eth + kEthernetBytes;
  std::memset(ip, 0, kIpv4Bytes);
  ip[0] = 0x45;  // version 4, 5 words
  ip[1] = e.tos;
  StoreBe16(ip + 2, static_cast<uint16_t>(kIpv4Bytes + kUdpBytes + payload_bytes));
  StoreBe16(ip + 4, ip_id);
  StoreBe16(ip + 6, 0x4000);  // don't fragment, as RoCEv2 NICs send
  ip[8] = 64;                 // TTL
  ip[9] = 17;                 // UDP
  StoreBe32(ip + 12, e.src_ip);
  StoreBe32(ip + 16, e.dst_ip);
  StoreBe16(ip + 10, Ipv4Checksum(std::span<const uint8_t>(ip, kIpv4Bytes)));

  uint8_t* udp = ip + kIpv4Bytes;
  StoreBe16(udp, e.src_port);
  StoreBe16(udp + 2, e.dst_port);
  StoreBe16(udp + 4, static_cast<uint16_t>(kUdpBytes + payload_bytes));
  StoreBe16(udp + 6, 0);  // no UDP checksum: allowed on IPv4, and RoCEv2 NICs send none
}

std::string ExpandPath(std::string_view pattern, pid_t pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

Result<std::unique_ptr<PcapWriter>> PcapWriter::Open(std::string_view pattern) {
  if (pattern.empty()) return InvalidArgument("the capture file name is empty");
  std::string path = ExpandPath(pattern, getpid());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return Status::Error(err, fmt::format("cannot create the capture file '{}': {}", path,
                                          std::strerror(err)));
  }
  std::unique_ptr<PcapWriter> w(new PcapWriter(fd, std::move(path)));
  uint8_t h[kFileHeaderBytes] = {};
  StoreLe32(h, kMagicMicroseconds);
  StoreLe16(h + 4, 2);   // version 2.4
  StoreLe16(h + 6, 4);
  // h[8..15]: time zone and accuracy, 0 as every writer sets them.
  StoreLe32(h + 16, kSnapLen);
  StoreLe32(h + 20, kLinktypeEthernet);
  w->buffer_.insert(w->buffer_.end(), h, h + sizeof(h));
  if (Status s = w->Flush(); !s.ok()) return s;
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(FlushAllAtExit); });
  {
    std::lock_guard lock(LiveMu());
    Live().insert(w.get());
  }
  return w;
}

PcapWriter::PcapWriter(int fd, std::string path)
    : fd_(fd), path_(std::move(path)), last_write_(std::chrono::steady_clock::now()) {
  buffer_.reserve(kBufferBytes + kRecordHeaderBytes + kFrameHeaderBytes + 65536);
}

PcapWriter::~PcapWriter() {
  {
    std::lock_guard lock(LiveMu());
    Live().erase(this);
  }
  (void)Flush();
  ::close(fd_);
}

void PcapWriter::Record(const Endpoints& e, std::span<const uint8_t> udp_payload) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const size_t frame = kFrameHeaderBytes + udp_payload.size();
  const uint32_t caplen = static_cast<uint32_t>(std::min<size_t>(frame, kSnapLen));
  std::lock_guard lock(mu_);
  if (failed_) return;
  const size_t at = buffer_.size();
  buffer_.resize(at + kRecordHeaderBytes + caplen);
  uint8_t* r = buffer_.data() + at;
  StoreLe32(r, static_cast<uint32_t>(ts.tv_sec));
  StoreLe32(r + 4, static_cast<uint32_t>(ts.tv_nsec / 1000));
  StoreLe32(r + 8, caplen);
  StoreLe32(r + 12, static_cast<uint32_t>(frame));
  WriteFrameHeader(e, udp_payload.size(), ip_id_++, r + kRecordHeaderBytes);
  std::memcpy(r + kRecordHeaderBytes + kFrameHeaderBytes, udp_payload.data(),
              caplen - kFrameHeaderBytes);
  ++packets_;
  if (buffer_.size() >= kBufferBytes) (void)FlushLocked();
}

Status PcapWriter::Flush() {
  std::lock_guard lock(mu_);
  return FlushLocked();
}

Status PcapWriter::FlushLocked() {
  last_write_ = std::chrono::steady_clock::now();
  size_t done = 0;
  while (done < buffer_.size() && !failed_) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      failed_ = true;
      buffer_.clear();
      Log().error("capture to '{}' stopped: cannot write: {}", path_, std::strerror(err));
      return Status::Error(err, fmt::format("cannot write the capture file '{}': {}", path_,
                                            std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return failed_ ? Status::Error(EIO, fmt::format("capture to '{}' failed earlier", path_))
                 : Status::Ok();
}

bool PcapWriter::FlushDue(std::chrono::steady_clock::time_point now) const {
  std::lock_guard lock(mu_);
  return !buffer_.empty() && now - last_write_ >= kFlushInterval;
}

bool PcapWriter::HasPending() const {
  std::lock_guard lock(mu_);
  return !buffer_.empty();
}

uint64_t PcapWriter::packets() const {
  std::lock_guard lock(mu_);
  return packets_;
}

}  // namespace rdmaemu::capture
