// The control server in this process: requests and replies, bad clients,
// concurrency, no CPU while idle, the socket's removal (stop, exit, SIGTERM),
// fork, and clients' removal of stale sockets.
#include "emulator/control/server.h"

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "emulator/control/protocol.h"

namespace rdmaemu::control {
namespace {

using namespace std::chrono_literals;

std::string g_runtime;  // XDG_RUNTIME_DIR of this test

class Env : public ::testing::Environment {
 public:
  void SetUp() override {
    // A short private path (sun_path holds 108 bytes; the long-path case
    // has its own test).
    char tmpl[] = "/tmp/rdmaemu-server-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    g_runtime = tmpl;
    ::unsetenv("RDMAEMU_CONTROL_DIR");
    ::setenv("XDG_RUNTIME_DIR", tmpl, 1);
  }
  void TearDown() override {
    StopServer();
    std::string dir = g_runtime + "/rdmaemu";
    ::rmdir(dir.c_str());
    ::rmdir(g_runtime.c_str());
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new Env);

bool Exists(const std::string& path) {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string Serving() {
  EnsureServer();
  std::string path = ServingPath();
  EXPECT_FALSE(path.empty());
  return path;
}

Result<Reply> Ask(const std::string& path, std::vector<std::string> words) {
  return Call(path, words, 5s);
}

int RawConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_TRUE(ConnectPath(fd, path).ok());
  return fd;
}

TEST(ServerTest, ServesItsSocketInTheRuntimeDirectory) {
  std::string path = Serving();
  EXPECT_EQ(path, g_runtime + "/rdmaemu/" + std::to_string(::getpid()) + ".sock");
  struct stat st{};
  ASSERT_EQ(::stat((g_runtime + "/rdmaemu").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EnsureServer();  // idempotent
  EXPECT_EQ(ServingPath(), path);
}

TEST(ServerTest, AnswersCommandsAndRefusesUnknownOnes) {
  std::string path = Serving();
  auto help = Ask(path, {"help"});
  ASSERT_TRUE(help.ok()) << help.status().message();
  EXPECT_EQ(help->status, 0);
  EXPECT_NE(help->out.find("port"), std::string::npos);
  EXPECT_NE(help->out.find("event"), std::string::npos);
  EXPECT_NE(help->out.find("list"), std::string::npos);

  auto unknown = Ask(path, {"frobnicate", "x"});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 2);
  EXPECT_NE(unknown->err.find("frobnicate: unknown command"), std::string::npos) << unknown->err;

  auto list = Ask(path, {"list"});
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->status, 0);
  EXPECT_EQ(list->out.rfind("process " + std::to_string(::getpid()) + " ", 0), 0u) << list->out;
}

TEST(ServerTest, MalformedRequestGetsAnErrorReply) {
  std::string path = Serving();
  int fd = RawConnect(path);
  std::string junk = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  auto reply = ReadReply(fd, Clock::now() + 5s);
  ::close(fd);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 2);
  EXPECT_NE(reply->err.find("malformed request"), std::string::npos) << reply->err;
  EXPECT_TRUE(Ask(path, {"help"}).ok()) << "the server survives";
}

TEST(ServerTest, AStalledClientCostsOthersAtMostTheDeadline) {
  std::string path = Serving();
  int silent = RawConnect(path);  // connects, then says nothing
  int half = RawConnect(path);    // sends half a header, then nothing
  ASSERT_EQ(::write(half, "RDEQ", 4), 4);
  auto start = Clock::now();
  auto reply = Call(path, std::vector<std::string>{"help"}, 20s);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 0);
  EXPECT_LT(Clock::now() - start, 8s) << "two stalled clients of 2 s each, at most (and a busy machine)";
  EXPECT_GT(Clock::now() - start, 3500ms) << "the stalled clients were given their time";
  // The stalled ones were answered with a timeout and closed.
  auto timed_out = ReadReply(silent, Clock::now() + 1s);
  ::close(silent);
  ::close(half);
  if (timed_out.ok()) {
    EXPECT_NE(timed_out->err.find("timed out"), std::string::npos);
  }
}

TEST(ServerTest, AClientThatLeavesEarlyDoesNotHurtTheServer) {
  std::string path = Serving();
  for (int i = 0; i < 20; ++i) {
    int fd = RawConnect(path);
    std::string req = EncodeRequest(std::vector<std::string>{"list"});
    ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    ::close(fd);  // before the reply
  }
  auto reply = Ask(path, {"help"});
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 0);
}

TEST(ServerTest, ConcurrentClientsAreAllAnswered) {
  std::string path = Serving();
  std::atomic<int> good{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        auto r = Call(path, std::vector<std::string>{"list"}, 10s);
        if (r.ok() && r->status == 0 && r->out.starts_with("process ")) ++good;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(good.load(), 200);
}

// The control thread, found by name: its CPU time and context switches
// stay unchanged while nobody calls (no busy loop, no periodic wakeup).
TEST(ServerTest, AnIdleServerDoesNotRun) {
  Serving();
  auto stats = []() -> std::string {
    DIR* d = ::opendir("/proc/self/task");
    std::string out;
    while (dirent* e = ::readdir(d)) {
      std::string task = std::string("/proc/self/task/") + e->d_name;
      std::ifstream comm(task + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name != "rdmaemu-ctl") continue;
      std::ifstream status(task + "/status");
      std::string line;
      while (std::getline(status, line)) {
        if (line.find("ctxt_switches") != std::string::npos) out += line + "\n";
      }
    }
    ::closedir(d);
    return out;
  };
  // Let the thread settle from earlier tests' requests.
  std::this_thread::sleep_for(300ms);
  std::string before = stats();
  ASSERT_FALSE(before.empty()) << "no thread called rdmaemu-ctl";
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(stats(), before);
}

TEST(ServerTest, StopRemovesTheSocketAndAStartMakesANewOne) {
  std::string path = Serving();
  StopServer();
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(ServingPath().empty());
  EXPECT_FALSE(Ask(path, {"help"}).ok());
  EXPECT_EQ(Serving(), path);
  EXPECT_TRUE(Ask(path, {"help"}).ok());
}

// Runs `child` in a forked process, which reports on a pipe; returns the
// wait status and what it wrote.
std::pair<int, std::string> InChild(const std::function<void(int report_fd)>& child, bool terminate = false) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    child(fds[1]);
    ::_exit(99);  // child() must end the process itself
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, n);
    if (terminate && got.find('\n') != std::string::npos) {
      ::kill(pid, SIGTERM);
      terminate = false;
    }
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!got.empty() && got.back() == '\n') got.pop_back();
  return {status, got};
}

void Report(int fd, const std::string& s) {
  std::string line = s + "\n";
  if (::write(fd, line.data(), line.size()) < 0) ::_exit(98);
}

// Another user cannot reach the socket (the directory is 0700, the socket
// 0600), and were both opened up by mistake, the server still refuses them
// by their credentials (SO_PEERCRED) with a line saying who may.
TEST(ServerTest, AnotherUserIsRefused) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to act as another user (CI runs the tests as root)";
  }
  std::string path = Serving();
  std::string dir = g_runtime + "/rdmaemu";
  constexpr uid_t kNobody = 65534;
  auto as_nobody = [&](int report) {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
      Report(report, fmt::format("setuid: {}", std::strerror(errno)));
      ::_exit(0);
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    Status c = ConnectPath(fd, path);
    if (!c.ok()) {
      Report(report, fmt::format("connect: {}", std::strerror(c.code())));
      ::_exit(0);
    }
    ::close(fd);
    auto reply = Ask(path, {"list"});
    if (!reply.ok()) Report(report, "call failed: " + reply.status().message());
    else Report(report, fmt::format("status {}: {}", reply->status, reply->err.substr(0, reply->err.find('\n'))));
    ::_exit(0);
  };
  auto [status, got] = InChild(as_nobody);
  EXPECT_EQ(got, "connect: Permission denied");
  // Opened up by mistake: the credentials check still refuses.
  ASSERT_EQ(::chmod(g_runtime.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  std::tie(status, got) = InChild(as_nobody);
  EXPECT_EQ(got, fmt::format("status 1: uid {} may not control this process", kNobody)) << got;
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(g_runtime.c_str(), 0700), 0);
}

TEST(ServerTest, TheSocketIsRemovedAtExit) {
  // No server thread in the parent at fork(): one still answering an
  // earlier test's client holds heap strings on its stack, which the child
  // inherits without the thread, and LeakSanitizer at the child's exit()
  // reported them as leaks (once, in CI).
  StopServer();
  auto [status, path] = InChild([](int fd) {
    EnsureServer();
    Report(fd, ServingPath());
    std::exit(0);
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_FALSE(path.empty());
  EXPECT_FALSE(Exists(path)) << path;
}

TEST(ServerTest, TheSocketIsRemovedOnSigterm) {
  auto [status, path] = InChild(
      [](int fd) {
        ::signal(SIGTERM, SIG_DFL);
        EnsureServer();
        Report(fd, ServingPath());
        for (;;) ::pause();
      },
      /*terminate=*/true);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM) << "the signal still does what it would have done";
  ASSERT_FALSE(path.empty());
  EXPECT_FALSE(Exists(path)) << path;
}

std::atomic<bool> g_app_handler_ran{false};
void AppHandler(int) { ::_exit(42); }

TEST(ServerTest, AnApplicationsSignalHandlerStaysItsOwnAndClientsRemoveTheStaleSocket) {
  auto [status, path] = InChild(
      [](int fd) {
        ::signal(SIGTERM, AppHandler);
        EnsureServer();
        struct sigaction now{};
        ::sigaction(SIGTERM, nullptr, &now);
        Report(fd, now.sa_handler == AppHandler ? ServingPath() : "handler replaced");
        for (;;) ::pause();
      },
      /*terminate=*/true);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 42) << "the application's handler ran";
  ASSERT_NE(path, "handler replaced");
  // _exit in the application's handler: nobody removed the socket...
  ASSERT_TRUE(Exists(path)) << path;
  // ...so the next client does, seeing its process gone.
  std::vector<std::string> removed;
  auto servers = FindServers(g_runtime + "/rdmaemu", &removed);
  EXPECT_EQ(removed, std::vector<std::string>{path});
  EXPECT_FALSE(Exists(path));
  for (const auto& s : servers) EXPECT_NE(s.path, path);
}

TEST(ServerTest, AForkedChildDoesNotServeItsParentsSocket) {
  std::string parent_path = Serving();
  auto [status, report] = InChild([&](int fd) {
    // Not serving, and not holding the parent's listening socket.
    std::string own = ServingPath();
    int held = 0;
    for (int f = 0; f < 1024; ++f) {
      sockaddr_un addr{};
      socklen_t len = sizeof addr;
      int listening = 0;
      socklen_t ll = sizeof listening;
      if (::getsockname(f, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && addr.sun_family == AF_UNIX &&
          ::getsockopt(f, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) == 0 && listening) {
        ++held;
      }
    }
    EnsureServer();  // a child that opens a device serves its own
    Report(fd, own + "|" + std::to_string(held) + "|" + ServingPath());
    std::exit(0);  // must not remove the parent's socket
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::stringstream ss(report);
  std::string own, held, child_path;
  std::getline(ss, own, '|');
  std::getline(ss, held, '|');
  std::getline(ss, child_path, '|');
  EXPECT_EQ(own, "");
  EXPECT_EQ(held, "0");
  EXPECT_NE(child_path, parent_path);
  EXPECT_NE(child_path.find(g_runtime + "/rdmaemu/"), std::string::npos) << child_path;
  EXPECT_FALSE(Exists(child_path));
  EXPECT_TRUE(Exists(parent_path));
  auto reply = Ask(parent_path, {"list"});
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->out.rfind("process " + std::to_string(::getpid()) + " ", 0), 0u);
}

TEST(ServerTest, ALongRuntimeDirectoryStillWorks) {
  StopServer();
  std::string dir = g_runtime + "/" + std::string(120, 'd');
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  std::string path = Serving();
  ::setenv("XDG_RUNTIME_DIR", g_runtime.c_str(), 1);
  EXPECT_GT(path.size(), sizeof(sockaddr_un{}.sun_path));
  auto reply = Ask(path, {"help"});
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 0);
  auto found = FindServers(dir + "/rdmaemu");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].pid, ::getpid());
  StopServer();
  EXPECT_FALSE(Exists(path));
  ::rmdir((dir + "/rdmaemu").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace rdmaemu::control
