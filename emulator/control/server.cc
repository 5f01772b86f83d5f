#include "emulator/control/server.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/control/command.h"
#include "emulator/control/protocol.h"

namespace rdmaemu::control {
namespace {

// How long one client may take to send its request, and to take the reply.
constexpr auto kRequestTime = std::chrono::seconds(2);
constexpr auto kReplyTime = std::chrono::seconds(2);

struct State {
  std::mutex mu;  // guards everything below; held across fork (see Prepare)
  pid_t pid = 0;         // the process serving (0: none)
  pid_t failed_pid = 0;  // the process whose start failed (logged once)
  int listen_fd = -1;
  int stop_fd = -1;  // eventfd: readable once the server must stop
  pthread_t thread{};
  std::string path;
  bool hooks_installed = false;
};

State& S() {
  static State* s = new State();  // never destroyed: used at exit
  return *s;
}

// For the signal handler, which may only use async-signal-safe calls.
char g_signal_path[4096];
std::atomic<pid_t> g_signal_pid{0};

void OnTerminatingSignal(int sig) {
  int saved = errno;
  if (::getpid() == g_signal_pid.load()) ::unlink(g_signal_path);
  // SA_RESETHAND restored the default action: the re-raised signal does
  // what it would have done without us, once this handler returns.
  ::raise(sig);
  errno = saved;
}

// Only where the application has none: never take its handler's place.
void InstallSignalHandlers() {
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old{};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO)) {
      continue;
    }
    struct sigaction sa{};
    sa.sa_handler = OnTerminatingSignal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

void Prepare() { S().mu.lock(); }
void Parent() { S().mu.unlock(); }
// The child has no server thread; it must not hold, serve or remove the
// parent's socket.
void Child() {
  State& s = S();
  if (s.listen_fd >= 0) ::close(s.listen_fd);
  if (s.stop_fd >= 0) ::close(s.stop_fd);
  s.listen_fd = s.stop_fd = -1;
  s.pid = 0;
  s.failed_pid = 0;
  s.path.clear();
  s.mu.unlock();
}

void AtExit() { StopServer(); }

// Also when the library is unloaded, or a static destructor runs first.
struct ExitGuard {
  ~ExitGuard() { StopServer(); }
} g_exit_guard;

void Answer(int fd, const Reply& reply, int stop_fd) {
  Status s = WriteAll(fd, EncodeReply(reply), Clock::now() + kReplyTime, stop_fd);
  if (!s.ok()) Log().debug("control: the reply was not delivered: {}", s.message());
}

void ServeConnection(int fd, int stop_fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid != ::getuid() &&
      cred.uid != 0) {
    Log().warn("control: refused a request from uid {} (only uid {} and root may control this process)",
               cred.uid, ::getuid());
    // Read the request first, bounded as any other: closing with it unread
    // makes the client's send fail with EPIPE, and the refusal is never seen.
    (void)ReadRequest(fd, Clock::now() + kRequestTime, stop_fd);
    Answer(fd, {kStatusFailure, "", fmt::format("uid {} may not control this process\n", cred.uid)}, stop_fd);
    return;
  }
  auto words = ReadRequest(fd, Clock::now() + kRequestTime, stop_fd);
  if (!words.ok()) {
    const Status& s = words.status();
    if (s.code() == ECANCELED) return;
    Log().debug("control: bad request: {}", s.message());
    Answer(fd, {kStatusUsage, "", fmt::format("malformed request: {}\n", s.message())}, stop_fd);
    return;
  }
  Reply reply;
  try {
    reply = Dispatch(*words);
  } catch (const std::exception& e) {
    reply = {kStatusFailure, "", fmt::format("{}: internal error: {}\n", (*words)[0], e.what())};
  }
  Log().info("control: {} -> status {}", fmt::join(*words, " "), reply.status);
  Answer(fd, reply, stop_fd);
}

void* Serve(void*) {
  State& s = S();
  // Constant while this thread runs: StopServer joins before closing them.
  const int listen_fd = s.listen_fd, stop_fd = s.stop_fd;
  for (;;) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log().error("control: poll failed: {}; the control socket stops answering", std::strerror(errno));
      return nullptr;
    }
    if (fds[1].revents != 0) return nullptr;
    if (fds[0].revents == 0) continue;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the client gave up, or EMFILE: the next poll tells
    ServeConnection(fd, stop_fd);
    ::close(fd);
  }
}

Status Start(State& s) {
  std::string dir = RuntimeDir();
  Status prepared = PrepareDir(dir);
  if (!prepared.ok() && prepared.code() == ENOENT && std::getenv("XDG_RUNTIME_DIR") != nullptr &&
      std::getenv("RDMAEMU_CONTROL_DIR") == nullptr) {
    // XDG_RUNTIME_DIR names a directory that does not exist (a su session).
    dir = fmt::format("/tmp/rdmaemu-{}", ::getuid());
    prepared = PrepareDir(dir);
  }
  if (!prepared.ok()) return prepared;
  std::string path = SocketPath(dir, ::getpid());
  ::unlink(path.c_str());  // left by an earlier process with our pid
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::Error(errno, fmt::format("socket: {}", std::strerror(errno)));
  if (Status b = BindPath(fd, path); !b.ok()) {
    ::close(fd);
    return b;
  }
  // The directory (0700) already keeps other users out; the socket is the
  // owner's alone too, should the directory ever be opened up.
  if (::chmod(path.c_str(), 0600) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::Error(e, fmt::format("chmod {}: {}", path, std::strerror(e)));
  }
  if (::listen(fd, 64) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::Error(e, fmt::format("listen {}: {}", path, std::strerror(e)));
  }
  int stop = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0) {
    int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::Error(e, fmt::format("eventfd: {}", std::strerror(e)));
  }
  s.listen_fd = fd;
  s.stop_fd = stop;
  s.path = path;
  // The thread takes no signals: they stay the application's.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = ::pthread_create(&s.thread, nullptr, Serve, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    ::close(fd);
    ::close(stop);
    ::unlink(path.c_str());
    s.listen_fd = s.stop_fd = -1;
    s.path.clear();
    return Status::Error(rc, fmt::format("cannot start the control thread: {}", std::strerror(rc)));
  }
  ::pthread_setname_np(s.thread, "rdmaemu-ctl");
  std::snprintf(g_signal_path, sizeof g_signal_path, "%s", path.c_str());
  g_signal_pid.store(::getpid());
  InstallSignalHandlers();
  return Status::Ok();
}

}  // namespace

void EnsureServer() {
  State& s = S();
  std::lock_guard lock(s.mu);
  const pid_t self = ::getpid();
  if (s.pid == self || s.failed_pid == self) return;
  if (!s.hooks_installed) {
    // Registered once; a forked child inherits them.
    ::pthread_atfork(Prepare, Parent, Child);
    std::atexit(AtExit);
    s.hooks_installed = true;
  }
  if (Status st = Start(s); !st.ok()) {
    s.failed_pid = self;
    Log().error("control: {}; `rdmaemu port/event/list` cannot reach this process", st.message());
    return;
  }
  s.pid = self;
  Log().info("control: serving {}", s.path);
}

std::string ServingPath() {
  State& s = S();
  std::lock_guard lock(s.mu);
  return s.pid == ::getpid() ? s.path : std::string();
}

void StopServer() {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (s.pid != ::getpid()) return;  // not serving here (or a forked child)
  uint64_t one = 1;
  if (::write(s.stop_fd, &one, sizeof one) < 0) { /* an eventfd write cannot fail here */ }
  if (!pthread_equal(pthread_self(), s.thread)) ::pthread_join(s.thread, nullptr);
  else ::pthread_detach(s.thread);
  g_signal_pid.store(0);
  ::unlink(s.path.c_str());
  ::close(s.listen_fd);
  ::close(s.stop_fd);
  s.listen_fd = s.stop_fd = -1;
  s.path.clear();
  s.pid = 0;
}

}  // namespace rdmaemu::control
