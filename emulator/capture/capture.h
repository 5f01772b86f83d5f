// The process's capture: one pcap file that every device's engine records
// into (several devices of a process share it, so nothing truncates a file
// another engine writes).
//
// It starts from the environment (RDMAEMU_PCAP=FILE, `%p` = the pid) when
// the first engine starts, or on demand (the control socket, tests), and
// stops on demand or at exit. The engines call Record() for every datagram
// that crosses their socket: sent ones after fault rules have acted,
// received ones before. While nothing is captured Record() costs one
// relaxed load.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "emulator/base/status.h"
#include "emulator/capture/pcap.h"

namespace rdmaemu::capture {

namespace internal {
extern std::atomic<bool> active;
void Record(const Endpoints& e, std::span<const uint8_t> udp_payload);
}  // namespace internal

// Once per process: starts the capture RDMAEMU_PCAP names, if any. Every
// call returns the first call's result, so a bad path fails each device
// open with the same message.
Status StartFromEnvironment();

// Starts capturing into `pattern` (see ExpandPath). EBUSY if a capture runs;
// the file's errors otherwise.
Status Start(std::string_view pattern);

// A capture's file and how many packets it has recorded.
struct Summary {
  std::string path;
  uint64_t packets = 0;
};
using Stopped = Summary;
// Stops the capture, flushing and closing the file. ENOENT if none runs.
Result<Stopped> Stop();

// The running capture's file, or "" when none runs.
std::string CurrentPath();
// The running capture, with the packets recorded so far (buffered ones
// included); nullopt when none runs.
std::optional<Summary> Running();

inline bool Active() { return internal::active.load(std::memory_order_relaxed); }

inline void Record(const Endpoints& e, std::span<const uint8_t> udp_payload) {
  if (Active()) internal::Record(e, udp_payload);
}

// For the engine's loop: writes the buffer if it is due (PcapWriter::FlushDue)
// and says whether records still wait, so the loop can come back later.
bool FlushIfDue(std::chrono::steady_clock::time_point now);
// Writes what is buffered.
void Flush();

}  // namespace rdmaemu::capture
