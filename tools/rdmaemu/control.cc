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
#include <chrono>
#include <ctime>
#include <cstdio>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "emulator/control/protocol.h"
#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {

// What the tool does to a command's words before sending them to
// `processes` programs; a message is a usage error.
using Prepare = std::optional<std::string> (*)(std::vector<std::string>& words, size_t processes);

struct Forwarded {
  std::string_view name;
  std::string_view summary;  // one line, for `rdmaemu --help`
  std::string_view usage;    // "Usage: rdmaemu NAME ..." and what the words mean
  Prepare prepare = nullptr;
};

// `capture start FILE`: FILE is the tool's, so a relative one is made
// absolute here (the program's working directory is another). Several
// programs writing one file would garble it: they need %p in it.
std::optional<std::string> PrepareCapture(std::vector<std::string>& words, size_t processes) {
  if (words.size() < 3 || words[1] != "start" || words[2].empty()) return std::nullopt;
  std::string& file = words[2];
  if (file[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) return "cannot tell the current directory for '" + file + "'";
    file = std::string(cwd) + "/" + file;
  }
  if (processes > 1 && file.find("%p") == std::string::npos) {
    return fmt::format("{} programs are running and would all write '{}': give --pid PID, or put %p "
                       "(the process id) in FILE",
                       processes, file);
  }
  return std::nullopt;
}

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
     "  DEV wq WQN (0xWQN) STATE\n"
     "  DEV cq N    DEV srq N\n"},
    {"port", "take a port of running programs down or up, change its LID, P_Keys, speed, ...",
     "Usage: rdmaemu port [--pid PID] DEV PORT ACTION [VALUE...]\n"
     "\n"
     "Acts on port PORT of device DEV in running programs, as a cable, the subnet\n"
     "manager or link training would; every context of the device gets the async\n"
     "event (none when nothing changes).\n"
     "Actions:\n"
     "  down              the port goes DOWN: IBV_EVENT_PORT_ERR, and no packet\n"
     "                    crosses it (RC QPs retry, then fail with\n"
     "                    IBV_WC_RETRY_EXC_ERR)\n"
     "  up                the port goes ACTIVE: IBV_EVENT_PORT_ACTIVE\n"
     "  lid N             the port's LID becomes N (1..0xbfff, unused by other\n"
     "                    ports): IBV_EVENT_LID_CHANGE\n"
     "  sm_lid N          the subnet manager moves to LID N: IBV_EVENT_SM_CHANGE\n"
     "  rereg             the subnet manager asks every client to register again:\n"
     "                    IBV_EVENT_CLIENT_REREGISTER\n"
     "  pkey INDEX VALUE  P_Key table entry INDEX (0..15) becomes VALUE; 0 empties\n"
     "                    it, 0x8001 is a full member of partition 1:\n"
     "                    IBV_EVENT_PKEY_CHANGE\n"
     "  speed SPEED       the active link speed: SDR DDR QDR FDR10 FDR EDR HDR NDR,\n"
     "                    or the lane rate ibv_devinfo -v prints as active_speed\n"
     "                    (2.5 5.0 10.0 14.0 25.0 50.0 100.0, with or without Gbps;\n"
     "                    10.0 is QDR): IBV_EVENT_DEVICE_SPEED_CHANGE\n"
     "  width WIDTH       the active link width as ibv_devinfo prints it: 1X 2X 4X\n"
     "                    8X 12X: IBV_EVENT_DEVICE_SPEED_CHANGE\n"
     "lid, sm_lid, rereg and pkey need an InfiniBand port (link_layer=infiniband\n"
     "in the RDMAEMU_CONFIG file): a RoCE port has no LIDs, subnet manager or\n"
     "P_Key table. Names any case; numbers decimal or 0x-hex.\n"
     "\n"
     "Example: rdmaemu port emu0 1 down; sleep 1; rdmaemu port emu0 1 up\n"
     "         rdmaemu port emu0 1 speed 25.0Gbps; rdmaemu port emu0 1 width 1X\n"},
    {"gid", "set or clear a GID table entry of a port of running programs",
     "Usage: rdmaemu gid [--pid PID] DEV PORT INDEX set GID\n"
     "       rdmaemu gid [--pid PID] DEV PORT INDEX clear\n"
     "\n"
     "Sets or clears entry INDEX (1..15) of the GID table of port PORT of device\n"
     "DEV in running programs, as adding or removing an address on a RoCE\n"
     "interface does: ibv_query_gid shows it and every context gets\n"
     "IBV_EVENT_GID_CHANGE (none when nothing changes). GID is an IPv6 address\n"
     "(fe80::1, or the eight groups ibv_devinfo -v prints) or an IPv4 address,\n"
     "which becomes ::ffff:a.b.c.d as in a RoCEv2 GID table. Entry 0 is the\n"
     "port's own address and cannot change.\n"
     "\n"
     "Example: rdmaemu gid emu0 1 1 set 192.0.2.7; rdmaemu gid emu0 1 1 clear\n"},
    {"device", "a fatal error of a device in running programs (DEVICE_FATAL)",
     "Usage: rdmaemu device [--pid PID] DEV fatal\n"
     "\n"
     "A fatal error of device DEV in running programs, for good: every QP moves\n"
     "to IBV_QPS_ERR and its posted work completes with IBV_WC_WR_FLUSH_ERR,\n"
     "nothing is sent or received, and every context gets IBV_EVENT_DEVICE_FATAL.\n"
     "Afterwards verbs fail with EIO as on a dead device, while destroy, close,\n"
     "ibv_poll_cq and ibv_get_async_event still work so that programs can clean\n"
     "up. The device stays dead until the program closes every context of it.\n"},
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
     "  --wq WQN         WQ_FATAL\n"
     "  --port DEV PORT  PORT_ACTIVE PORT_ERR LID_CHANGE PKEY_CHANGE SM_CHANGE\n"
     "                   CLIENT_REREGISTER GID_CHANGE DEVICE_SPEED_CHANGE\n"
     "  --device DEV     DEVICE_FATAL; with --qp/--cq/--srq/--wq it picks the\n"
     "                   device when two have an object of that number\n"
     "QPNs, WQNs and numbers are decimal or 0x-hex; `rdmaemu list` shows them.\n"
     "They are per process: use --pid to pick the program.\n"
     "\n"
     "Example: rdmaemu list --pid 4242; rdmaemu event --pid 4242 qp_fatal --qp 17\n"},
    {"fault", "add, clear or list fault rules (drop, delay, corrupt, ...) of running programs",
     "Usage: rdmaemu fault [--pid PID] [DEV] add RULES\n"
     "       rdmaemu fault [--pid PID] [DEV] clear\n"
     "       rdmaemu fault [--pid PID] [DEV] list\n"
     "\n"
     "Adds fault rules to device DEV of running programs, removes them all, or\n"
     "lists the active ones with how many packets each has matched, one line each\n"
     "after the device's name (`emu0: no fault rules` when there are none).\n"
     "Without DEV: every device the program has open (a rule for one device of\n"
     "several says dev=NAME). `add` prints the device's rules afterwards.\n"
     "\n"
     "RULES is the syntax of RDMAEMU_FAULTS (docs/faults.md): drop, dup, corrupt,\n"
     "reorder, delay, rnr, nak, error, rate, latency and seed, with triggers (0.05,\n"
     "5%, #3, #3..5) and filters after @ (dir= dev= port= qpn= dst_qpn= op=);\n"
     "several words are joined with spaces. A rule that does not parse (exit 2) or\n"
     "does not fit a device (exit 1: a port it lacks) is refused, naming the bad\n"
     "token, and nothing changes on any device.\n"
     "\n"
     "Example: rdmaemu fault --pid 4242 emu0 add 'drop=0.05@op=SEND'\n"
     "         rdmaemu fault list; rdmaemu fault clear\n",
     nullptr},
    {"stats", "counters of the devices, ports and QPs of running programs (--json)",
     "Usage: rdmaemu stats [--pid PID] [DEV [PORT]] [--qp QPN] [--json] [--watch]\n"
     "\n"
     "Prints the counters of running programs: of each open device (the sum of\n"
     "its ports) with what its fault rules did (fault_dropped, ...), of port PORT\n"
     "of device DEV, or of one QP (--qp QPN, decimal or 0x-hex, as `rdmaemu list`\n"
     "shows it; DEV picks the device when two have that QPN). One `name value`\n"
     "per line, under a header line naming the process, device and port or QP:\n"
     "  process 4242 ibv_rc_pingpong device emu0\n"
     "  packets_sent 2004\n"
     "  ...\n"
     "The counters are those of rdmaemu_query_counters (rdmaemu/rdmaemu.h).\n"
     "\n"
     "--json prints one JSON object per program instead,\n"
     "  {\"pid\": N, \"program\": NAME, \"stats\": [{\"device\": DEV, [\"port\": N |\n"
     "   \"qp\": N,] \"counters\": {...}}, ...]},\n"
     "and, without --pid, a JSON array of them (one element per program).\n"
     "\n"
     "--watch prints them again every second, under a line with the time (on a\n"
     "terminal, redrawing the screen), until interrupted; `rdmaemu top` shows\n"
     "them as rates.\n",
     nullptr},
    {"capture", "start or stop a pcap capture of every packet of running programs",
     "Usage: rdmaemu capture [--pid PID] start FILE\n"
     "       rdmaemu capture [--pid PID] stop\n"
     "       rdmaemu capture [--pid PID] status\n"
     "\n"
     "Starts writing every packet a running program sends and receives, on all\n"
     "its devices, to the pcap file FILE, as RDMAEMU_PCAP=FILE does from the\n"
     "start; `tshark -r FILE` decodes each packet's RoCE headers. `%p` in FILE\n"
     "becomes the program's process id; with several programs and no --pid FILE\n"
     "must have it. A relative FILE is relative to where rdmaemu runs. `stop`\n"
     "flushes and closes the file and says how many packets it holds; `status`\n"
     "says whether and where the program captures and how many packets so far.\n"
     "Starting while a capture runs (RDMAEMU_PCAP's too) is refused: stop it\n"
     "first, so that nobody's capture is ended behind their back.\n"
     "\n"
     "Example: rdmaemu capture start /tmp/run-%p.pcap; ...; rdmaemu capture stop\n",
     PrepareCapture},
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

// `stats --watch`: the same stats every second until interrupted.
std::vector<control::Server> RunningPrograms(std::optional<pid_t> only) {
  std::vector<control::Server> servers;
  std::set<pid_t> seen;
  for (const auto& dir : control::SearchDirs()) {
    for (auto& s : control::FindServers(dir)) {
      if (only && s.pid != *only) continue;
      if (seen.insert(s.pid).second) servers.push_back(std::move(s));
    }
  }
  std::sort(servers.begin(), servers.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return servers;
}

std::optional<int> PositiveNumber(std::string_view text) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v <= 0) return std::nullopt;
  return v;
}

static int WatchStats(std::span<const std::string> args) {
  std::vector<std::string> rest;
  for (const auto& a : args) {
    if (a != "--watch") rest.push_back(a);
  }
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  for (int n = 0;; ++n) {
    if (n > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    const std::time_t t = std::time(nullptr);
    char when[32];
    std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&t));
    if (tty) std::fputs("\033[H\033[2J", stdout);
    std::printf("%s-- rdmaemu stats at %s\n", n > 0 && !tty ? "\n" : "", when);
    std::fflush(stdout);
    const int rc = ForwardedMain("stats", rest);
    if (rc == kExitUsage || (n == 0 && rc != kExitOk)) return rc;
  }
}

int ForwardedMain(std::string_view name, std::span<const std::string> args) {
  auto has = [&](const char* word) { return std::find(args.begin(), args.end(), word) != args.end(); };
  if (name == "stats" && has("--watch") && !has("-h") && !has("--help")) {
    return WatchStats(args);
  }
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
    only = PositiveNumber(*value);
    if (!only) return UsageError(name, fmt::format("--pid: '{}' is not a process id", *value));
  }

  const std::vector<std::string> dirs = control::SearchDirs();
  std::vector<control::Server> servers = RunningPrograms(only);
  if (servers.empty()) {
    if (only) {
      PrintError(name, fmt::format("no rdmaemu process with pid {} (looked in {})", *only, Joined(dirs)));
    } else {
      PrintError(name, fmt::format("no running rdmaemu process found (looked in {})", Joined(dirs)));
    }
    return kExitFailure;
  }

  if (const Forwarded* f = Find(name); f != nullptr && f->prepare != nullptr) {
    if (auto problem = f->prepare(words, servers.size())) return UsageError(name, *problem);
  }

  bool usage = false, failed = false;
  int answered = 0;
  const bool several = servers.size() > 1;
  // --json without --pid: one JSON array of the programs' objects, however
  // many there are, so that a script always reads the same shape.
  const bool json_array = !only && std::find(words.begin(), words.end(), "--json") != words.end();
  int json_items = 0;
  if (json_array) std::fputs("[\n", stdout);
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
    if (!reply->out.empty() && json_array) {
      if (json_items++ > 0) std::fputs(",\n", stdout);
      std::string item = reply->out;
      while (!item.empty() && item.back() == '\n') item.pop_back();
      std::fputs(item.c_str(), stdout);
    } else if (!reply->out.empty()) {
      if (several) std::printf("pid %d:\n", static_cast<int>(s.pid));
      std::fputs(reply->out.c_str(), stdout);
      if (reply->out.back() != '\n') std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    PrintLines(stderr, "rdmaemu " + pid_prefix, reply->err);
    if (reply->status == kExitUsage) usage = true;
    else if (reply->status != kExitOk) failed = true;
  }
  if (json_array) std::fputs(json_items > 0 ? "\n]\n" : "]\n", stdout);
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
