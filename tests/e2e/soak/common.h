// What every part of the soak program shares: options, how it fails, and
// the exit codes the test scripts read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "tests/e2e/soak/plan.h"

namespace soak {

// Exit codes: the scripts tell a wrong byte from a broken setup.
inline constexpr int kExitOk = 0;
inline constexpr int kExitMismatch = 1;  // data, order, count or status wrong
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 3;
inline constexpr int kExitSetup = 4;     // verbs or socket setup failed, peer vanished

enum class Mode { kRc, kUd };

struct Options {
  bool server = false;
  Mode mode = Mode::kRc;
  std::string host = "127.0.0.1";  // client: the server's TCP address
  uint16_t port = 18515;           // TCP port of the control connection
  std::string device;              // empty: the first device
  int gid_index = 0;
  unsigned timeout_s = 300;
  uint8_t qp_timeout = 14;
  // Self-test of the checks: the client alters one byte of the first
  // SEND/WRITE payload at or after this message (UINT32_MAX: never).
  uint32_t flip_byte_at = UINT32_MAX;         // RC local ACK timeout exponent (4.096 us * 2^n)
  Params params;                   // client: what the run does (sent to the server)
};

// "client" or "server", for messages.
const char* Role();
void SetRole(bool server);

// Prints "soak[ROLE]: error: ..." and exits with kExitSetup.
[[noreturn]] void Die(const std::string& what);
// Prints "soak[ROLE]: MISMATCH: ..." and exits with kExitMismatch.
[[noreturn]] void Mismatch(const std::string& what);

// Where the run is, for the timeout message (set as the run proceeds).
void SetProgress(uint32_t done, uint32_t total);
// Arms the global timeout: after `seconds` the process prints where it was
// and exits with kExitTimeout, whatever it is blocked in.
void ArmTimeout(unsigned seconds);

}  // namespace soak
