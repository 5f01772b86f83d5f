// Injector: one device's fault rules and link shaping, applied to the
// packets its engine sends and receives.
//
// At RDMAEMU_LOG=debug each decision that changes a packet is one line:
//   emu0 qp#17 fault: drop tx RC_SEND_ONLY psn 4660 → qp#18 (sending #1)
// The decision is a hash of the seed, the rule and the packet's identity
// (direction, opcode, destination QP, PSN, and how often it was seen), so
// the same seed and program give the same lines (decide.h).
//
// The engine hands every packet to the injector while it is active():
//   egress   Transmit built the packet -> Egress -> (faults, then shaping)
//            -> PacketSink::SendNow, now or later from Flush
//   ingress  a datagram arrived -> Ingress -> (faults) -> PacketSink::Deliver,
//            now or later from Flush
// Packets held back (delay, reorder, the shaper) wait in queues the engine
// flushes from its loop's timer (Flush returns the next deadline), so an
// idle engine still sleeps. Forced protocol events are asked for by the
// engine where they act (ForcedOnPacket, ForcedOnRequest).
//
// What the rules did is counted twice: device-wide here (counters()), and
// per port and QP by the engine, to which each decision is reported as it
// is taken (PacketSink::Counted) with the packet's port and local QP: the
// injector knows packets, the engine knows which QPs are its own.
//
// Thread safety: Add, Clear, List, active and counters from any thread;
// everything else on the engine's loop thread.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/log.h"
#include "emulator/base/status.h"
#include "emulator/fault/decide.h"
#include "emulator/fault/rule.h"
#include "emulator/fault/shaper.h"
#include "emulator/net/loop.h"

namespace rdmaemu::fault {

// What the engine knows of a packet crossing its socket.
struct PacketMeta {
  Direction dir = kTx;
  uint8_t port = 1;
  uint32_t local_qpn = 0;  // the sending QP (tx) or the destination QP (rx)
  uint32_t dst_qpn = 0;    // from the BTH
  uint32_t psn = 0;
  uint8_t opcode = 0;
  uint8_t tos = 0;         // tx: the traffic class it leaves with
};

// What fault rules did on one device. Read with relaxed loads: a snapshot.
struct FaultCounters {
  uint64_t dropped = 0;      // drop
  uint64_t duplicated = 0;   // extra copies made by dup
  uint64_t corrupted = 0;    // corrupt
  uint64_t delayed = 0;      // held by delay
  uint64_t reordered = 0;    // held back by reorder
  uint64_t rnr_forced = 0;   // RNR NAKs sent by rnr
  uint64_t naks_forced = 0;  // NAKs sent by nak
  uint64_t errors_forced = 0;  // QPs moved to ERR by error
  uint64_t shaped = 0;       // packets that waited for the link (rate, latency)
  uint64_t overflows = 0;    // packets dropped because a hold queue was full
};

// What the injector did to a packet, as reported to PacketSink::Counted.
enum class FaultEvent : uint8_t {
  kDropped,     // drop
  kDuplicated,  // one extra copy made by dup
  kCorrupted,   // corrupt
  kDelayed,     // held by delay
  kReordered,   // held back by reorder
  kShaped,      // waited for the link (rate, latency)
  kOverflow,    // dropped: a hold queue was full
};

// A forced protocol event for the engine to carry out.
struct Forced {
  Action action = Action::kRnr;
  wire::NakCode nak = wire::NakCode::kPsnSequenceError;
  std::string rule;  // the rule's text, for the log line
};

// Where packets go once the injector lets them pass.
class PacketSink {
 public:
  virtual ~PacketSink() = default;
  // Puts a built packet on the socket of `port` (PacketMeta::port).
  virtual void SendNow(uint8_t port, const sockaddr_in& to, std::span<const uint8_t> bytes, uint8_t tos) = 0;
  // Processes a received datagram.
  virtual void Deliver(const net::Datagram& datagram) = 0;
  // The injector did `what` to `n` packets of port `port` whose local QP
  // (PacketMeta::local_qpn: the sender of a packet sent, the destination of
  // one received; 0 for none) is `local_qpn`. Called as it decides; `port`
  // and `local_qpn` are as the engine gave them and may name nothing.
  virtual void Counted(FaultEvent what, uint8_t port, uint32_t local_qpn, uint64_t n) = 0;
};

class Injector {
 public:
  // `auto_rates`: each port's rate for rate=auto (bits per second), by port-1.
  Injector(std::string device, std::vector<uint64_t> auto_rates);

  // Any thread. Parses `text` and appends its rules (a seed replaces the
  // current one). EINVAL, with the parser's message or a rule that does
  // not fit this device (a port it lacks); nothing changes then.
  Status Add(std::string_view text);
  // Any thread. Removes every rule and shaping setting (and the seed).
  void Clear();
  // Any thread. The active rules, one per line, with how many packets each
  // matched: "seed=7", then "drop=0.05  # matched 1200", ...
  std::string List() const;
  // Any thread, lock-free: false while there is nothing to do (the engine
  // then skips the injector entirely).
  bool active() const { return active_.load(std::memory_order_relaxed); }
  FaultCounters counters() const;

  // Loop thread.
  void Egress(const PacketMeta& meta, std::span<uint8_t> bytes, const sockaddr_in& to,
              Clock::time_point now, PacketSink& sink);
  void Ingress(const PacketMeta& meta, const net::Datagram& datagram, Clock::time_point now,
               PacketSink& sink);
  // Releases every held packet that is due; returns when next to call.
  std::optional<Clock::time_point> Flush(Clock::time_point now, PacketSink& sink);
  // A packet arrived for a QP (after the engine's checks): an `error` rule
  // may move the QP to ERR.
  std::optional<Forced> ForcedOnPacket(const PacketMeta& meta);
  // An RC QP's responder accepted the first packet of a new request
  // message, in sequence: an `rnr` or `nak` rule may answer it instead.
  std::optional<Forced> ForcedOnRequest(const PacketMeta& meta);

  // The most packets held back in one queue (delay/reorder per direction,
  // the shaper per port); more are dropped and counted as overflows.
  static constexpr size_t kMaxHeld = 8192;
  // A reordered packet goes out after this many later packets, or after
  // kReorderMaxHold when traffic stops.
  static constexpr uint32_t kReorderMaxPackets = 3;
  static constexpr Duration kReorderMaxHold = std::chrono::milliseconds(1);

 private:
  struct Installed {
    Rule rule;
    std::string text;
    uint64_t matched = 0;
    bool forced = false;        // rnr/nak/error
    bool on_request = false;    // has rnr or nak: counts request messages
  };
  struct Verdict {
    bool drop = false;
    uint32_t copies = 1;
    bool corrupt = false;
    uint64_t corrupt_hash = 0;
    Duration delay{0};
    uint32_t reorder_after = 0;
    uint32_t occurrence = 0;  // how often this packet was seen before
    bool any() const {
      return drop || copies > 1 || corrupt || delay.count() > 0 || reorder_after > 0;
    }
  };
  struct Held {
    Direction dir = kTx;
    uint8_t port = 1;
    uint32_t local_qpn = 0;  // PacketMeta::local_qpn, for what happens to it later
    sockaddr_in peer{};  // tx: destination; rx: source
    in_addr dst{};       // rx: the destination address
    uint8_t tos = 0;     // the IP header's TOS byte, kept for when it passes
    std::vector<uint8_t> bytes;
    uint32_t after_packets = 0;  // reorder: released after this many later packets
  };
  using HeldKey = std::pair<Clock::time_point, uint64_t>;
  struct PortState {
    Shaper shaper;
    std::deque<std::pair<Clock::time_point, Held>> queue;  // FIFO, by departure
  };

  bool Matches(const Filter& f, const PacketMeta& meta) const;
  // The debug line of a decision that changes a packet (rate-limited).
  void LogDecision(const PacketMeta& meta, const Verdict& v);
  Verdict Decide(const PacketMeta& meta);  // with mu_ held
  std::optional<Forced> DecideForced(const PacketMeta& meta, bool request);
  void Recompute();  // with mu_ held: active_ and the ports' shaping
  // A packet past the faults: tx to the shaper (or wire), rx delivered.
  void Pass(Held&& h, Clock::time_point now, PacketSink& sink);
  void PassNow(const Held& h, PacketSink& sink);
  void Hold(Held&& h, Clock::time_point at, PacketSink& sink);
  // Counts `what` on the device and reports it to the sink.
  void Note(FaultEvent what, uint8_t port, uint32_t local_qpn, PacketSink& sink, uint64_t n = 1);
  // A packet went through in `dir`: counts down the reordered ones.
  void CountPassing(Direction dir, Clock::time_point now, PacketSink& sink);

  const std::string device_;
  const std::vector<uint64_t> auto_rates_;
  // Decision lines: one per packet a rule changes, which a peer's flood can
  // make many (RDMAEMU_LOG=debug).
  static constexpr uint32_t kDecisionLinesPerSecond = 200;
  RateLimit decision_lines_{kDecisionLinesPerSecond};

  mutable std::mutex mu_;
  uint64_t seed_ = kDefaultSeed;           // guarded by mu_
  std::optional<uint64_t> seed_set_;       // guarded by mu_
  std::vector<Installed> rules_;           // guarded by mu_
  std::vector<Shaping> shaping_;           // guarded by mu_
  std::vector<std::pair<uint64_t, Duration>> port_shaping_;  // guarded by mu_: by port-1
  bool shaping_changed_ = false;           // guarded by mu_
  std::atomic<bool> active_{false};

  struct Counters {
    std::atomic<uint64_t> dropped{0}, duplicated{0}, corrupted{0}, delayed{0}, reordered{0},
        rnr_forced{0}, naks_forced{0}, errors_forced{0}, shaped{0}, overflows{0};
  } counters_;

  // Loop thread only.
  OccurrenceTable seen_;
  OccurrenceTable seen_forced_;
  std::map<HeldKey, Held> held_;
  size_t held_count_[4] = {0, 0, 0, 0};     // by Direction
  std::vector<HeldKey> reordering_[4];      // by Direction: held_ keys waiting for later packets
  uint64_t next_seq_ = 0;
  std::vector<PortState> ports_;
};

// Flips one bit of a built packet so that its ICRC no longer matches: a
// payload bit where there is payload, else an ICRC bit (so the packet still
// parses, and the receiver drops it for its ICRC alone). `hash` picks the bit.
void CorruptPacket(std::span<uint8_t> packet, uint64_t hash);

}  // namespace rdmaemu::fault
