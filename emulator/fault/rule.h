// Fault rules as data: what a rule does (its effects), to which packets (its
// filter), and when (each effect's trigger). The text syntax is in parse.h
// and docs/faults.md; this header is what the parser produces and what the
// decision logic (decide.h) and the injector (injector.h) read.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "emulator/wire/headers.h"

namespace rdmaemu::fault {

using Duration = std::chrono::nanoseconds;

// Which way a packet crosses the device's socket.
enum Direction : uint8_t { kTx = 1, kRx = 2, kBoth = kTx | kRx };

// What an effect does.
enum class Action : uint8_t {
  // Packet effects, on packets the device sends (tx) or receives (rx).
  kDrop,
  kDup,      // one extra copy of the packet
  kCorrupt,  // a payload (or ICRC) bit flipped: the receiver's ICRC check fails
  kReorder,  // held back until later packets have passed (or 1 ms)
  kDelay,    // held back for a duration (fixed or jittered)
  // Forced protocol events, on what a QP receives.
  kRnr,      // the next request message is answered with an RNR NAK
  kNak,      // ... with a NAK of a chosen code
  kError,    // the QP moves to ERR (QP_FATAL) when the packet arrives
};

// True for the forced protocol events (they act on a QP, not on a packet).
constexpr bool IsForced(Action a) {
  return a == Action::kRnr || a == Action::kNak || a == Action::kError;
}

// When an effect fires among the packets its rule matches.
struct Trigger {
  enum class Kind : uint8_t { kAlways, kProbability, kCount };
  Kind kind = Kind::kAlways;
  double probability = 1.0;  // kProbability: 0..1
  // kCount: the first..last matching packets (1-based, inclusive); last =
  // UINT64_MAX for "from first on".
  uint64_t first = 1;
  uint64_t last = 1;
};

struct Effect {
  Action action = Action::kDrop;
  Trigger trigger;
  Duration delay{0};    // kDelay
  Duration jitter{0};   // kDelay: the delay varies uniformly by +-jitter
  wire::NakCode nak = wire::NakCode::kPsnSequenceError;  // kNak
};

// Which packets a rule applies to. Unset fields match everything.
struct Filter {
  Direction dir = kTx;          // packet effects: tx unless dir= says otherwise
  std::optional<std::string> device;
  std::optional<uint8_t> port;
  std::optional<uint32_t> qpn;      // the local QP (sender on tx, receiver on rx)
  std::optional<uint32_t> dst_qpn;  // the BTH destination QP
  bool any_opcode = true;
  std::array<bool, 256> opcodes{};  // when !any_opcode: the opcode bytes matched
  std::string op_text;              // op= as written (canonical), for listing
};

struct Rule {
  std::vector<Effect> effects;
  Filter filter;
};

// Link shaping of a port (or every port of the matching devices).
struct Shaping {
  std::optional<std::string> device;
  std::optional<uint8_t> port;
  bool rate_set = false;
  bool rate_auto = false;   // the port's speed x width
  uint64_t rate_bps = 0;    // bits per second; 0 with rate_set = off
  bool latency_set = false;
  Duration latency{0};
};

// One parsed RDMAEMU_FAULTS value (or one `fault add`).
struct RuleSet {
  std::optional<uint64_t> seed;
  std::vector<Rule> rules;
  std::vector<Shaping> shaping;
};

// The seed when none is given: runs replay by default.
inline constexpr uint64_t kDefaultSeed = 1;

// Canonical text of a rule / a shaping entry, parseable again.
std::string ToString(const Rule& rule);
std::string ToString(const Shaping& shaping);
std::string_view ToString(Action action);

}  // namespace rdmaemu::fault
