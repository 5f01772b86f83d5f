// The commands that act on running processes (`rdmaemu list|port|event|...`):
// the tool finds each emulating process's control socket, sends it the words
// and prints what the process answers. The work is done inside the process
// (emulator/control/); this file only knows each command's help, so that
// `--help` works with no process running.
//
// Adding a forwarded command: one entry in kForwarded below.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "emulator/control/protocol.h"
#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {

struct Forwarded {
  std::string_view name;
  std::string_view summary;  // one line, for `rdmaemu --help`
  std::string_view usage;    // "Usage: rdmaemu NAME ..." and what the words mean
};

constexpr Forwarded kForwarded[] = {
    {"list", "list the devices, ports and objects (QPs, CQs, ...) of running programs",
     "Usage: rdmaemu list [--pid PID]\n"
     "\n"
     "Lists, for each running program that has an emulated device open, one line\n"
     "each: the process, its devices' ports and their state, and its objects by\n"
     "the numbers `rdmaemu event` takes:\n"
     "  process PID NAME\n"
     "  DEV port N STATE\n"
     "  DEV qp QPN (0xQPN) TYPE STATE\n"
     "  DEV cq N    DEV srq N    DEV wq N\n"},
    {"port", "take a port of running programs down or up",
     "Usage: rdmaemu port [--pid PID] DEV PORT ACTION [VALUE]\n"
     "\n"
     "Acts on port PORT of device DEV in running programs, as pulling or plugging\n"
     "a cable would; every context of the device gets the async event.\n"
     "Actions:\n"
     "  down        the port goes DOWN: IBV_EVENT_PORT_ERR, and no packet crosses\n"
     "              it (RC QPs retry, then fail with IBV_WC_RETRY_EXC_ERR)\n"
     "  up          the port goes ACTIVE: IBV_EVENT_PORT_ACTIVE\n"
     "\n"
     "Example: rdmaemu port emu0 1 down; sleep 1; rdmaemu port emu0 1 up\n"},
    {"event", "raise any async event on a QP, CQ, SRQ, WQ, port or device",
     "Usage: rdmaemu event [--pid PID] TYPE TARGET\n"
     "\n"
     "Raises async event TYPE in running programs, delivered exactly as one from a\n"
     "real cause (ibv_get_async_event returns it to the context that owns the\n"
     "object, or to every context of the device for port and device events), for\n"
     "testing event handlers. Nothing else changes: `event port_err` leaves the\n"
     "port ACTIVE (`rdmaemu port DEV PORT down` is the real thing).\n"
     "\n"
     "TYPE is an ibv_event_type name, in any case, with or without IBV_EVENT_\n"
     "(qp_fatal, QP_FATAL, IBV_EVENT_QP_FATAL). TARGET, by the kind of event:\n"
     "  --qp QPN         QP_FATAL QP_REQ_ERR QP_ACCESS_ERR COMM_EST SQ_DRAINED\n"
     "                   PATH_MIG PATH_MIG_ERR QP_LAST_WQE_REACHED\n"
     "  --cq N           CQ_ERR\n"
     "  --srq N          SRQ_ERR SRQ_LIMIT_REACHED\n"
     "  --wq N           WQ_FATAL\n"
     "  --port DEV PORT  PORT_ACTIVE PORT_ERR LID_CHANGE PKEY_CHANGE SM_CHANGE\n"
     "                   CLIENT_REREGISTER GID_CHANGE DEVICE_SPEED_CHANGE\n"
     "  --device DEV     DEVICE_FATAL; with --qp/--cq/--srq/--wq it picks the\n"
     "                   device when two have an object of that number\n"
     "QPNs and numbers are decimal or 0x-hex; `rdmaemu list` shows them. QPNs\n"
     "and CQ numbers are per process: use --pid to pick the program.\n"
     "\n"
     "Example: rdmaemu list --pid 4242; rdmaemu event --pid 4242 qp_fatal --qp 17\n"},
};

constexpr std::string_view kCommonHelp =
    "\n"
    "Options:\n"
    "  --pid PID    act on that process only (default: every running program)\n"
    "  -h, --help   show this help and exit\n"
    "\n"
    "The command runs inside each program that has an emulated device open, reached\n"
    "through its control socket: $XDG_RUNTIME_DIR/rdmaemu/PID.sock, or\n"
    "/tmp/rdmaemu-UID/PID.sock without XDG_RUNTIME_DIR (the tool looks in both);\n"
    "RDMAEMU_CONTROL_DIR, if set, replaces both, for programs and the tool alike.\n"
    "With several programs, each one's output starts with a line `pid PID:`.\n"
    "\n"
    "Exit status: 0 every program did it, 1 one failed or none is running,\n"
    "2 usage error.\n";

const Forwarded* Find(std::string_view name) {
  for (const auto& f : kForwarded) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// Prints `text` line by line, each after `prefix`.
void PrintLines(FILE* stream, std::string_view prefix, std::string_view text) {
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    std::fprintf(stream, "%.*s%.*s\n", static_cast<int>(prefix.size()), prefix.data(),
                 static_cast<int>(line.size()), line.data());
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

std::string Joined(const std::vector<std::string>& dirs) {
  return dirs.size() == 1 ? dirs[0] : fmt::format("{} and {}", dirs[0], dirs[1]);
}

}  // namespace

std::vector<std::pair<std::string_view, std::string_view>> ForwardedSummaries() {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  for (const auto& f : kForwarded) out.emplace_back(f.name, f.summary);
  return out;
}

bool IsForwarded(std::string_view name) { return Find(name) != nullptr; }

std::string ForwardedHelp(std::string_view name) {
  const Forwarded* f = Find(name);
  return f == nullptr ? std::string() : std::string(f->usage) + std::string(kCommonHelp);
}

int ForwardedMain(std::string_view name, std::span<const std::string> args) {
  // --pid and --help are the tool's; every other word goes to the process
  // (event's targets are options too).
  std::vector<std::string> words = {std::string(name)};
  std::optional<pid_t> only;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(ForwardedHelp(name).c_str(), stdout);
      return kExitOk;
    }
    std::optional<std::string> value;
    if (a == "--pid") {
      if (i + 1 >= args.size()) return UsageError(name, "'--pid' needs a value");
      value = args[++i];
    } else if (a.starts_with("--pid=")) {
      value = a.substr(6);
    }
    if (!value) {
      words.push_back(a);
      continue;
    }
    int pid = 0;
    auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), pid);
    if (ec != std::errc() || end != value->data() + value->size() || pid <= 0) {
      return UsageError(name, fmt::format("--pid: '{}' is not a process id", *value));
    }
    only = pid;
  }

  std::vector<std::string> dirs = control::SearchDirs();
  std::vector<control::Server> servers;
  std::set<pid_t> seen;
  for (const auto& dir : dirs) {
    for (auto& s : control::FindServers(dir)) {
      if (only && s.pid != *only) continue;
      if (seen.insert(s.pid).second) servers.push_back(std::move(s));
    }
  }
  std::sort(servers.begin(), servers.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  if (servers.empty()) {
    if (only) {
      PrintError(name, fmt::format("no rdmaemu process with pid {} (looked in {})", *only, Joined(dirs)));
    } else {
      PrintError(name, fmt::format("no running rdmaemu process found (looked in {})", Joined(dirs)));
    }
    return kExitFailure;
  }

  bool usage = false, failed = false;
  int answered = 0;
  const bool several = servers.size() > 1;
  for (const auto& s : servers) {
    auto reply = control::Call(s.path, words, std::chrono::seconds(10));
    if (!reply.ok() && reply.status().code() == ECONNREFUSED) {
      // Nobody listens: its process is gone and the pid reused, or it is
      // starting up. Look again shortly before calling it stale.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      reply = control::Call(s.path, words, std::chrono::seconds(10));
      if (!reply.ok() && reply.status().code() == ECONNREFUSED) {
        ::unlink(s.path.c_str());
        continue;
      }
    }
    ++answered;
    const std::string pid_prefix = several ? fmt::format("pid {}: ", s.pid) : "";
    if (!reply.ok()) {
      PrintError(name, fmt::format("{}cannot reach the process through {}: {}", pid_prefix, s.path,
                                   reply.status().message()));
      failed = true;
      continue;
    }
    if (!reply->out.empty()) {
      if (several) std::printf("pid %d:\n", static_cast<int>(s.pid));
      std::fputs(reply->out.c_str(), stdout);
      if (reply->out.back() != '\n') std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    PrintLines(stderr, "rdmaemu " + pid_prefix, reply->err);
    if (reply->status == kExitUsage) usage = true;
    else if (reply->status != kExitOk) failed = true;
  }
  if (answered == 0) {
    PrintError(name, fmt::format("no running rdmaemu process found (looked in {})", Joined(dirs)));
    return kExitFailure;
  }
  if (usage) {
    std::fprintf(stderr, "Try 'rdmaemu %.*s --help'.\n", static_cast<int>(name.size()), name.data());
    return kExitUsage;
  }
  return failed ? kExitFailure : kExitOk;
}

}  // namespace rdmaemu::cli
