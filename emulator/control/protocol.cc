#include "emulator/control/protocol.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace rdmaemu::control {
namespace {

constexpr char kRequestMagic[4] = {'R', 'D', 'E', 'Q'};
constexpr char kReplyMagic[4] = {'R', 'D', 'E', 'P'};
constexpr size_t kRequestHeader = 12;  // magic, version, length
constexpr size_t kReplyHeader = 20;    // magic, version, status, out length, err length

void PutU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

Status Protocol(std::string m) { return Status::Error(EPROTO, std::move(m)); }

// Waits until `fd` is ready for `events`, the deadline passes (ETIMEDOUT) or
// cancel_fd becomes readable (ECANCELED).
Status Wait(int fd, short events, Clock::time_point deadline, int cancel_fd) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Status::Error(ETIMEDOUT, "timed out");
    pollfd fds[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    int n = ::poll(fds, cancel_fd >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 60000)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error(errno, fmt::format("poll: {}", std::strerror(errno)));
    }
    if (cancel_fd >= 0 && fds[1].revents != 0) return Status::Error(ECANCELED, "cancelled");
    if (fds[0].revents != 0) return Status::Ok();
  }
}

// Reads exactly `n` bytes.
Status ReadExact(int fd, char* buf, size_t n, Clock::time_point deadline, int cancel_fd) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, buf + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Protocol(fmt::format("the connection closed after {} of {} bytes", got, n));
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Error(errno, fmt::format("recv: {}", std::strerror(errno)));
    }
    if (Status s = Wait(fd, POLLIN, deadline, cancel_fd); !s.ok()) return s;
  }
  return Status::Ok();
}

bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Runs fn on a sockaddr_un for `path`; a path too long for sun_path goes
// through an O_PATH descriptor of its directory.
template <typename F>
Status WithAddress(const std::string& path, F fn) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  int dir_fd = -1;
  std::string target = path;
  if (path.size() >= sizeof addr.sun_path) {
    auto slash = path.rfind('/');
    if (slash == std::string::npos) return InvalidArgument(fmt::format("socket path '{}' is too long", path));
    std::string dir = slash == 0 ? "/" : path.substr(0, slash);
    dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) return Status::Error(errno, fmt::format("{}: {}", dir, std::strerror(errno)));
    target = fmt::format("/proc/self/fd/{}/{}", dir_fd, path.substr(slash + 1));
    if (target.size() >= sizeof addr.sun_path) {
      ::close(dir_fd);
      return InvalidArgument(fmt::format("socket name in '{}' is too long", path));
    }
  }
  std::memcpy(addr.sun_path, target.c_str(), target.size() + 1);
  Status s = fn(reinterpret_cast<const sockaddr*>(&addr), static_cast<socklen_t>(sizeof addr));
  if (dir_fd >= 0) ::close(dir_fd);
  return s;
}

}  // namespace

std::string EncodeRequest(std::span<const std::string> words) {
  std::string payload;
  for (const auto& w : words) {
    payload += w;
    payload.push_back('\0');
  }
  std::string out(kRequestMagic, 4);
  PutU32(out, kVersion);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}

std::string EncodeReply(const Reply& reply) {
  auto cut = [](const std::string& s) {
    if (s.size() <= kMaxReplyText) return s;
    constexpr std::string_view kNote = "\n(output cut: it exceeds the control socket's limit)\n";
    return s.substr(0, kMaxReplyText - kNote.size()) + std::string(kNote);
  };
  std::string out_text = cut(reply.out), err_text = cut(reply.err);
  std::string out(kReplyMagic, 4);
  PutU32(out, kVersion);
  PutU32(out, static_cast<uint32_t>(reply.status));
  PutU32(out, static_cast<uint32_t>(out_text.size()));
  PutU32(out, static_cast<uint32_t>(err_text.size()));
  return out + out_text + err_text;
}

Result<std::vector<std::string>> ReadRequest(int fd, Clock::time_point deadline, int cancel_fd) {
  char header[kRequestHeader];
  if (Status s = ReadExact(fd, header, sizeof header, deadline, cancel_fd); !s.ok()) return s;
  if (std::memcmp(header, kRequestMagic, 4) != 0) return Protocol("not a control request (bad magic)");
  if (uint32_t v = GetU32(header + 4); v != kVersion) {
    return Protocol(fmt::format("protocol version {} (this process speaks {})", v, kVersion));
  }
  uint32_t length = GetU32(header + 8);
  if (length == 0) return Protocol("empty request: no command");
  if (length > kMaxRequestBytes) {
    return Protocol(fmt::format("request of {} bytes (at most {})", length, kMaxRequestBytes));
  }
  std::string payload(length, '\0');
  if (Status s = ReadExact(fd, payload.data(), length, deadline, cancel_fd); !s.ok()) return s;
  if (payload.back() != '\0') return Protocol("the request's last word is not NUL-terminated");
  std::vector<std::string> words;
  size_t start = 0;
  while (start < payload.size()) {
    size_t end = payload.find('\0', start);
    if (words.size() == kMaxWords) return Protocol(fmt::format("more than {} words", kMaxWords));
    words.emplace_back(payload, start, end - start);
    start = end + 1;
  }
  return words;
}

Result<Reply> ReadReply(int fd, Clock::time_point deadline, int cancel_fd) {
  char header[kReplyHeader];
  if (Status s = ReadExact(fd, header, sizeof header, deadline, cancel_fd); !s.ok()) return s;
  if (std::memcmp(header, kReplyMagic, 4) != 0) return Protocol("not a control reply (bad magic)");
  if (uint32_t v = GetU32(header + 4); v != kVersion) {
    return Protocol(fmt::format("protocol version {} (this tool speaks {})", v, kVersion));
  }
  Reply reply;
  reply.status = static_cast<int32_t>(GetU32(header + 8));
  uint32_t out_len = GetU32(header + 12), err_len = GetU32(header + 16);
  if (out_len > kMaxReplyText || err_len > kMaxReplyText) {
    return Protocol(fmt::format("reply of {}+{} bytes (at most {} each)", out_len, err_len, kMaxReplyText));
  }
  reply.out.resize(out_len);
  reply.err.resize(err_len);
  if (Status s = ReadExact(fd, reply.out.data(), out_len, deadline, cancel_fd); !s.ok()) return s;
  if (Status s = ReadExact(fd, reply.err.data(), err_len, deadline, cancel_fd); !s.ok()) return s;
  return reply;
}

Status WriteAll(int fd, std::string_view data, Clock::time_point deadline, int cancel_fd) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t r = ::send(fd, data.data() + sent, data.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) {
      sent += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Error(errno, fmt::format("send: {}", std::strerror(errno)));
    }
    if (Status s = Wait(fd, POLLOUT, deadline, cancel_fd); !s.ok()) return s;
  }
  return Status::Ok();
}

std::string RuntimeDir() {
  const char* dir = std::getenv("RDMAEMU_CONTROL_DIR");
  if (dir != nullptr && dir[0] == '/') return dir;
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return fmt::format("{}/rdmaemu", xdg);
  return fmt::format("/tmp/rdmaemu-{}", ::getuid());
}

std::vector<std::string> SearchDirs() {
  std::vector<std::string> dirs = {RuntimeDir()};
  const char* dir = std::getenv("RDMAEMU_CONTROL_DIR");
  if (dir != nullptr && dir[0] == '/') return dirs;
  std::string tmp = fmt::format("/tmp/rdmaemu-{}", ::getuid());
  if (dirs[0] != tmp) dirs.push_back(tmp);
  return dirs;
}

std::string SocketPath(const std::string& dir, pid_t pid) { return fmt::format("{}/{}.sock", dir, pid); }

Status PrepareDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::Error(errno, fmt::format("cannot create {}: {}", dir, std::strerror(errno)));
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) {
    return Status::Error(errno, fmt::format("{}: {}", dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::Error(EPERM, fmt::format("{} is not a directory (a symbolic link or file is in the way)", dir));
  }
  if (st.st_uid != ::getuid()) {
    return Status::Error(EPERM, fmt::format("{} belongs to uid {}, not to this user (uid {}); "
                                            "remove it or set XDG_RUNTIME_DIR", dir, st.st_uid, ::getuid()));
  }
  if ((st.st_mode & 0077) != 0) {
    return Status::Error(EPERM, fmt::format("{} is open to other users (mode {:o}); it must be 0700",
                                            dir, st.st_mode & 0777));
  }
  return Status::Ok();
}

Status BindPath(int fd, const std::string& path) {
  return WithAddress(path, [&](const sockaddr* a, socklen_t len) {
    if (::bind(fd, a, len) != 0) return Status::Error(errno, fmt::format("bind {}: {}", path, std::strerror(errno)));
    return Status::Ok();
  });
}

Status ConnectPath(int fd, const std::string& path) {
  return WithAddress(path, [&](const sockaddr* a, socklen_t len) {
    if (::connect(fd, a, len) != 0) {
      return Status::Error(errno, fmt::format("connect {}: {}", path, std::strerror(errno)));
    }
    return Status::Ok();
  });
}

std::vector<Server> FindServers(const std::string& dir, std::vector<std::string>* removed) {
  std::vector<Server> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (!name.ends_with(".sock")) continue;
    std::string_view digits = name.substr(0, name.size() - 5);
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    pid_t pid = static_cast<pid_t>(std::stol(std::string(digits)));
    std::string path = fmt::format("{}/{}", dir, name);
    if (pid <= 0) continue;
    if (!ProcessAlive(pid)) {
      // Its process ended without removing it (killed, or crashed).
      if (::unlink(path.c_str()) == 0 && removed != nullptr) removed->push_back(path);
      continue;
    }
    out.push_back({pid, std::move(path)});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const Server& a, const Server& b) { return a.pid < b.pid; });
  return out;
}

Result<Reply> Call(const std::string& path, std::span<const std::string> words,
                   std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::Error(errno, fmt::format("socket: {}", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  for (;;) {
    Status s = ConnectPath(fd, path);
    if (s.ok()) break;
    // A full backlog refuses a non-blocking connect with EAGAIN: the server
    // is busy with other clients, so try again until the deadline.
    if (s.code() != EAGAIN || Clock::now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (Status s = WriteAll(fd, EncodeRequest(words), deadline); !s.ok()) return s;
  return ReadReply(fd, deadline);
}

}  // namespace rdmaemu::control
