#include "tests/e2e/soak/common.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace soak {
namespace {

bool g_server = false;
std::atomic<uint32_t> g_done{0};
std::atomic<uint32_t> g_total{0};
unsigned g_timeout_s = 0;

// Async-signal-safe: formats by hand and writes with write(2).
void AppendNumber(char* buf, size_t* len, uint64_t v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) buf[(*len)++] = digits[--n];
}
void Append(char* buf, size_t* len, const char* s) {
  while (*s) buf[(*len)++] = *s++;
}

void OnAlarm(int) {
  char buf[256];
  size_t len = 0;
  Append(buf, &len, "soak[");
  Append(buf, &len, Role());
  Append(buf, &len, "]: TIMEOUT: no result after ");
  AppendNumber(buf, &len, g_timeout_s);
  Append(buf, &len, " s; progress ");
  AppendNumber(buf, &len, g_done.load());
  Append(buf, &len, " of ");
  AppendNumber(buf, &len, g_total.load());
  Append(buf, &len, " messages\n");
  (void)!write(STDERR_FILENO, buf, len);
  _exit(kExitTimeout);
}

}  // namespace

const char* Role() { return g_server ? "server" : "client"; }
void SetRole(bool server) { g_server = server; }

void Die(const std::string& what) {
  fmt::print(stderr, "soak[{}]: error: {}\n", Role(), what);
  std::fflush(stdout);
  std::exit(kExitSetup);
}

void Mismatch(const std::string& what) {
  fmt::print(stderr, "soak[{}]: MISMATCH: {}\n", Role(), what);
  std::fflush(stdout);
  std::exit(kExitMismatch);
}

void SetProgress(uint32_t done, uint32_t total) {
  g_done.store(done, std::memory_order_relaxed);
  g_total.store(total, std::memory_order_relaxed);
}

void ArmTimeout(unsigned seconds) {
  g_timeout_s = seconds;
  struct sigaction sa {};
  sa.sa_handler = OnAlarm;
  sigaction(SIGALRM, &sa, nullptr);
  alarm(seconds);
}

}  // namespace soak
