// Pcap: a capture file of RoCEv2 packets that tshark and Wireshark read.
//
// The engine sees UDP payloads (BTH ... ICRC), not frames, so each record
// gets synthetic framing: an Ethernet header (locally administered MACs
// 02:00:a:b:c:d made from the IPv4 addresses), an IPv4 header with a correct
// checksum, and a UDP header, with the datagram's real addresses and ports.
// tshark decodes UDP port 4791 as RoCEv2 (BTH, RETH, AETH, ...). The ICRC
// stays exactly as it crossed the socket.
//
// The file is the classic libpcap format (magic a1b2c3d4, version 2.4,
// microsecond timestamps, LINKTYPE_ETHERNET), written little-endian.
//
// Records are buffered: the engine thread appends to memory and writes only
// when the buffer fills, when Flush() is called (the engine does so at most
// every kFlushInterval while packets come), and when the writer is destroyed
// or the process exits normally. A process killed by a signal loses at most
// the last kFlushInterval of packets.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::capture {

// Ethernet (14) + IPv4 (20) + UDP (8) bytes in front of each UDP payload.
inline constexpr size_t kEthernetBytes = 14;
inline constexpr size_t kIpv4Bytes = 20;
inline constexpr size_t kUdpBytes = 8;
inline constexpr size_t kFrameHeaderBytes = kEthernetBytes + kIpv4Bytes + kUdpBytes;
inline constexpr size_t kFileHeaderBytes = 24;
inline constexpr size_t kRecordHeaderBytes = 16;
inline constexpr uint32_t kLinktypeEthernet = 1;
inline constexpr uint32_t kSnapLen = 65535;
inline constexpr auto kFlushInterval = std::chrono::milliseconds(100);

// One datagram's addressing, host order.
struct Endpoints {
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  uint8_t tos = 0;  // the IP header's TOS byte (RoCE v2's traffic class)
};

// The Internet checksum (RFC 1071) of an IPv4 header whose checksum field
// holds what it holds: 0 when computing, the stored value when verifying
// (a correct header then sums to 0).
uint16_t Ipv4Checksum(std::span<const uint8_t> header);

// Writes the kFrameHeaderBytes of framing for a UDP payload of
// `payload_bytes` into `out`. `ip_id` is the IPv4 identification field.
void WriteFrameHeader(const Endpoints& e, size_t payload_bytes, uint16_t ip_id, uint8_t* out);

// `pattern` with every `%p` replaced by `pid` and `%%` by `%`.
std::string ExpandPath(std::string_view pattern, pid_t pid);

class PcapWriter {
 public:
  // Creates (or truncates) the file named by `pattern` (see ExpandPath) and
  // writes the file header. Errors name the file and the system's reason.
  static Result<std::unique_ptr<PcapWriter>> Open(std::string_view pattern);
  // Flushes and closes.
  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  const std::string& path() const { return path_; }

  // Appends one datagram (its UDP payload) with its framing, stamped with
  // the current time. Buffered; writes when the buffer is full. After a
  // write error the writer records nothing more (the error is logged once).
  void Record(const Endpoints& e, std::span<const uint8_t> udp_payload);
  // Writes what is buffered.
  Status Flush();
  // True when records wait in the buffer and the last write is at least
  // kFlushInterval old: the engine's cue to call Flush().
  bool FlushDue(std::chrono::steady_clock::time_point now) const;
  bool HasPending() const;
  uint64_t packets() const;

 private:
  PcapWriter(int fd, std::string path);
  Status FlushLocked();

  const int fd_;
  const std::string path_;
  mutable std::mutex mu_;
  std::vector<uint8_t> buffer_;  // guarded by mu_
  uint16_t ip_id_ = 0;           // guarded by mu_
  uint64_t packets_ = 0;         // guarded by mu_
  bool failed_ = false;          // guarded by mu_
  std::chrono::steady_clock::time_point last_write_;  // guarded by mu_
};

}  // namespace rdmaemu::capture
