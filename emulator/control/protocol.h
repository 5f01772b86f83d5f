// The control socket: where it lives and what crosses it. Shared by the
// server every emulating process runs (server.h) and by the `rdmaemu` tool,
// the client.
//
// Location: $XDG_RUNTIME_DIR/rdmaemu/<pid>.sock, or /tmp/rdmaemu-<uid>/<pid>.sock
// without XDG_RUNTIME_DIR; the directory is the user's own, mode 0700.
// RDMAEMU_CONTROL_DIR (an absolute path) replaces both, for servers and
// clients alike: tests use it to see only their own processes.
//
// One request per connection. All integers are little-endian u32 (status s32).
//   request: "RDEQ" version=1 length, then `length` bytes: the command's
//            words, each ended by a NUL (argv words cannot hold one)
//   reply:   "RDEP" version=1 status out_length err_length, then the bytes
//            of out (stdout text) and err (stderr text)
// Status: 0 success, 1 failure, 2 usage error (the tool's exit statuses).
// Sizes are bounded and every read and write has a deadline, so a client or
// server that stalls or sends garbage costs the other side at most that.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::control {

inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kMaxRequestBytes = 64 * 1024;
inline constexpr size_t kMaxWords = 256;
inline constexpr size_t kMaxReplyText = 16 * 1024 * 1024;  // each of out and err

// What a command answers: the exit status and the text for stdout / stderr.
struct Reply {
  int status = 0;
  std::string out;
  std::string err;
};

using Clock = std::chrono::steady_clock;

// --- framing
std::string EncodeRequest(std::span<const std::string> words);
// Longer texts are cut at kMaxReplyText with a note saying so.
std::string EncodeReply(const Reply& reply);

// Reads one frame from `fd` before `deadline`. A readable `cancel_fd`
// (-1: none) abandons the read with ECANCELED. ETIMEDOUT at the deadline,
// EPROTO for a malformed frame (the message says what was wrong).
Result<std::vector<std::string>> ReadRequest(int fd, Clock::time_point deadline, int cancel_fd = -1);
Result<Reply> ReadReply(int fd, Clock::time_point deadline, int cancel_fd = -1);
// Writes all of `data` before `deadline` (never raises SIGPIPE).
Status WriteAll(int fd, std::string_view data, Clock::time_point deadline, int cancel_fd = -1);

// --- locations
// The directory this process's server uses (see above).
std::string RuntimeDir();
// Where clients look: RuntimeDir() and, when XDG_RUNTIME_DIR is set (and
// RDMAEMU_CONTROL_DIR is not), also /tmp/rdmaemu-<uid>, for processes started
// without it (services, tests).
std::vector<std::string> SearchDirs();
std::string SocketPath(const std::string& dir, pid_t pid);
// Creates `dir` mode 0700 if missing; refuses one that is not a directory,
// is owned by another user or is open to others (EPERM, saying which).
Status PrepareDir(const std::string& dir);

// Binds or connects a Unix stream socket to `path`. Paths longer than
// sun_path reach their directory through /proc/self/fd.
Status BindPath(int fd, const std::string& path);
Status ConnectPath(int fd, const std::string& path);

// --- client
struct Server {
  pid_t pid;
  std::string path;
};
// The servers whose sockets are in `dir`, by pid. Sockets of processes that
// are gone are removed (`removed` gets their paths).
std::vector<Server> FindServers(const std::string& dir, std::vector<std::string>* removed = nullptr);
// Sends one request and reads the reply; ECONNREFUSED when nobody listens.
Result<Reply> Call(const std::string& path, std::span<const std::string> words,
                   std::chrono::milliseconds timeout);

}  // namespace rdmaemu::control
