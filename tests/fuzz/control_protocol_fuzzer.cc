// Fuzz target: the control socket's framing (control::ReadRequest, what the
// server reads from any local process that connects, and ReadReply, what the
// `rdmaemu` tool reads back). The first input byte picks the reader; the rest
// is what the peer wrote, delivered through a socketpair and then closed,
// as a client that sends garbage and hangs up. Whatever decodes must encode
// back to a frame that decodes to the same thing, and a decoded request goes
// on to the command table (control::Dispatch) as the server runs it, so each
// command's argument parsing is fuzzed too. No device is open in this
// process, so every command stops at "no such device" after its parsing and
// nothing carries over between inputs; `capture` and `trace` are left out:
// they open files the request names.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/control/command.h"
#include "emulator/control/protocol.h"

namespace {

using rdmaemu::control::Clock;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "control_protocol_fuzzer: %s\n", what);
  std::abort();
}

// A socketpair whose far end has written `bytes` and shut down its side.
// The framing's limits (64 KiB requests) exceed a default socket buffer only
// for inputs far above libFuzzer's -max_len; longer inputs are cut there.
struct Pipe {
  int fds[2] = {-1, -1};
  explicit Pipe(std::string_view bytes) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair failed");
    int buf = 1 << 20;
    setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = send(fds[1], bytes.data() + sent, bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(fds[1], SHUT_WR);
  }
  ~Pipe() {
    close(fds[0]);
    close(fds[1]);
  }
  int reader() const { return fds[0]; }
};

// The deadline only matters if a reader waited for bytes that never come;
// the far end has shut down, so every read ends at once.
Clock::time_point Deadline() { return Clock::now() + std::chrono::seconds(2); }

void Request(std::string_view bytes) {
  Pipe pipe(bytes);
  auto words = rdmaemu::control::ReadRequest(pipe.reader(), Deadline());
  if (!words.ok()) {
    if (words.status().code() == ETIMEDOUT) Fail("a request read timed out on a closed socket");
    return;
  }
  if (words->empty()) Fail("a request decoded to no words");
  const std::string again = rdmaemu::control::EncodeRequest(*words);
  Pipe pipe2(again);
  auto words2 = rdmaemu::control::ReadRequest(pipe2.reader(), Deadline());
  if (!words2.ok() || *words2 != *words) Fail("a decoded request does not survive encoding");
  const std::string& name = words->front();
  if (name == "capture" || name == "trace") return;
  const rdmaemu::control::Reply reply = rdmaemu::control::Dispatch(*words);
  if (reply.status != rdmaemu::control::kStatusOk && reply.err.empty()) {
    Fail("a command refused a request without saying why");
  }
}

void Reply(std::string_view bytes) {
  Pipe pipe(bytes);
  auto reply = rdmaemu::control::ReadReply(pipe.reader(), Deadline());
  if (!reply.ok()) {
    if (reply.status().code() == ETIMEDOUT) Fail("a reply read timed out on a closed socket");
    return;
  }
  const std::string again = rdmaemu::control::EncodeReply(*reply);
  Pipe pipe2(again);
  auto reply2 = rdmaemu::control::ReadReply(pipe2.reader(), Deadline());
  if (!reply2.ok() || reply2->status != reply->status || reply2->out != reply->out ||
      reply2->err != reply->err) {
    Fail("a decoded reply does not survive encoding");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view frame(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    Reply(frame);
  } else {
    Request(frame);
  }
  return 0;
}
