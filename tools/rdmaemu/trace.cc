// `rdmaemu trace`: follows a running program's log lines without restarting
// it. The tool makes a private file, asks the program (control socket,
// `trace start FILE LEVEL`) to send its log lines there too, prints what
// arrives until interrupted, the program ends or --seconds pass, then asks
// it to stop and removes the file.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "emulator/control/protocol.h"
#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = 1; }

// Prints what `file` holds past `*offset` and moves the offset on.
void Follow(const std::string& file, std::streamoff* offset) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return;
  in.seekg(*offset);
  char buf[8192];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    const size_t n = static_cast<size_t>(in.gcount());
    // A reader that went away (`| head`) ends the trace like Ctrl-C, so the
    // program is told to stop rather than left writing a file nobody reads.
    if (std::fwrite(buf, 1, n, stdout) != n) g_interrupted = 1;
    *offset += in.gcount();
  }
  if (std::fflush(stdout) != 0) g_interrupted = 1;
}

}  // namespace

std::string TraceHelp() {
  return "Usage: rdmaemu trace [--pid PID] [--level LEVEL] [--seconds N]\n"
         "\n"
         "Follows a running program's log lines without restarting it: from LEVEL\n"
         "up (trace, debug, info, warn, error; default trace: a line per packet,\n"
         "work request, completion, state change, event and fault decision, as\n"
         "RDMAEMU_LOG=trace gives) they are printed here as the program logs them,\n"
         "until Ctrl-C, the program ends or N seconds pass. What the program prints\n"
         "on its own stderr does not change. With several programs running, --pid\n"
         "picks one.\n"
         "\n"
         "Options:\n"
         "  --pid PID      the program to follow (needed when several run)\n"
         "  --level LEVEL  the least severe lines to follow (default trace)\n"
         "  --seconds N    stop after N seconds (default: until interrupted)\n"
         "  -h, --help     show this help and exit\n"
         "\n"
         "Exit status: 0 followed until stopped, 1 no such program or it refused,\n"
         "2 usage error.\n";
}

int TraceMain(std::span<const std::string> args, const char*) {
  std::optional<pid_t> only;
  std::string level = "trace";
  int seconds = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(TraceHelp().c_str(), stdout);
      return kExitOk;
    }
    if (a != "--pid" && a != "--level" && a != "--seconds") {
      return UsageError("trace", fmt::format("unknown argument '{}'", a));
    }
    if (i + 1 >= args.size()) return UsageError("trace", fmt::format("'{}' needs a value", a));
    const std::string& v = args[++i];
    if (a == "--level") {
      static const std::set<std::string, std::less<>> kLevels = {"trace", "debug", "info", "warn",
                                                                "error"};
      if (!kLevels.contains(v)) {
        return UsageError("trace", fmt::format("--level: '{}' is not one of trace, debug, info, "
                                               "warn, error", v));
      }
      level = v;
      continue;
    }
    auto n = PositiveNumber(v);
    if (!n) return UsageError("trace", fmt::format("{}: '{}' is not a positive number", a, v));
    if (a == "--pid") only = *n;
    else seconds = *n;
  }

  const std::vector<control::Server> servers = RunningPrograms(only);
  if (servers.empty()) {
    PrintError("trace", only ? fmt::format("no rdmaemu process with pid {}", *only)
                             : std::string("no running rdmaemu process found"));
    return kExitFailure;
  }
  if (servers.size() > 1) {
    std::string pids;
    for (const auto& s : servers) pids += fmt::format(" {}", s.pid);
    return UsageError("trace", fmt::format("{} programs are running (pids{}): pick one with --pid",
                                           servers.size(), pids));
  }
  const control::Server& target = servers[0];

  const char* tmpdir = std::getenv("TMPDIR");
  std::string file = fmt::format("{}/rdmaemu-trace-{}-XXXXXX", tmpdir ? tmpdir : "/tmp", target.pid);
  const int fd = ::mkstemp(file.data());  // 0600: only we and the program (same user) read it
  if (fd < 0) {
    PrintError("trace", fmt::format("cannot make a file for the lines: {}", std::strerror(errno)));
    return kExitFailure;
  }
  ::close(fd);
  auto started = control::Call(target.path, std::vector<std::string>{"trace", "start", file, level},
                               std::chrono::seconds(5));
  if (!started.ok() || started->status != kExitOk) {
    PrintError("trace", started.ok() ? started->err : started.status().message());
    ::unlink(file.c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "rdmaemu trace: following pid %d from level %s (Ctrl-C stops)\n",
               static_cast<int>(target.pid), level.c_str());
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::streamoff offset = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  bool gone = false;
  while (!g_interrupted && (seconds == 0 || std::chrono::steady_clock::now() < until)) {
    Follow(file, &offset);
    if (::kill(target.pid, 0) != 0 && errno == ESRCH) {
      gone = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!gone) {
    (void)control::Call(target.path, std::vector<std::string>{"trace", "stop"},
                        std::chrono::seconds(5));
  }
  Follow(file, &offset);
  ::unlink(file.c_str());
  if (gone) std::fprintf(stderr, "rdmaemu trace: pid %d has ended\n", static_cast<int>(target.pid));
  return kExitOk;
}

}  // namespace rdmaemu::cli
