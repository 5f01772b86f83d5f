// `rdmaemu top`: a live view of running programs' devices and QPs, built
// from what `list` and `stats` answer through the control sockets, refreshed
// every interval: rates are the difference of two readings.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "emulator/control/protocol.h"
#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {

using Counters = std::map<std::string, uint64_t, std::less<>>;

struct QpRow {
  std::string device;
  uint32_t qpn = 0;
  std::string type, state;
  Counters counters;
};

struct DeviceRow {
  std::string name;
  Counters counters;
};

// One program's reading.
struct Reading {
  pid_t pid = 0;
  std::string program;
  std::vector<DeviceRow> devices;
  std::vector<QpRow> qps;
};

// `name value` lines after a `process PID NAME device DEV ...` header.
Counters ParseCounters(const std::string& text, std::string* program) {
  Counters out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name, value;
    if (!(words >> name >> value)) continue;
    if (name == "process") {
      std::string prog;
      if (program != nullptr && (words >> prog)) *program = prog;
      continue;
    }
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec == std::errc() && end == value.data() + value.size()) out[name] = v;
  }
  return out;
}

std::optional<std::string> Ask(const control::Server& s, std::vector<std::string> words) {
  auto reply = control::Call(s.path, words, std::chrono::seconds(5));
  if (!reply.ok() || reply->status != kExitOk) return std::nullopt;
  return reply->out;
}

// Reads one program: its devices (from `list`'s port lines), each device's
// counters, its QPs and theirs. Empty if the program did not answer.
std::optional<Reading> Read(const control::Server& s, size_t max_qps) {
  auto list = Ask(s, {"list"});
  if (!list) return std::nullopt;
  Reading r;
  r.pid = s.pid;
  std::set<std::string> devices;
  std::istringstream in(*list);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string a, b;
    if (!(w >> a >> b)) continue;
    if (a == "process") {
      std::string pid;
      w >> r.program;
      continue;
    }
    if (b == "port") devices.insert(a);
    if (b == "qp" && r.qps.size() < max_qps) {
      QpRow q;
      q.device = a;
      std::string qpn, hex;
      w >> qpn >> hex >> q.type >> q.state;
      std::from_chars(qpn.data(), qpn.data() + qpn.size(), q.qpn);
      r.qps.push_back(std::move(q));
    }
  }
  for (const auto& dev : devices) {
    auto text = Ask(s, {"stats", dev});
    if (!text) continue;
    r.devices.push_back({dev, ParseCounters(*text, r.program.empty() ? &r.program : nullptr)});
  }
  for (auto& q : r.qps) {
    if (auto text = Ask(s, {"stats", q.device, "--qp", std::to_string(q.qpn)})) {
      q.counters = ParseCounters(*text, nullptr);
    }
  }
  return r;
}

uint64_t Get(const Counters& c, std::string_view name) {
  auto it = c.find(name);
  return it == c.end() ? 0 : it->second;
}

// Per second, from the previous reading (0 for the first).
double Rate(const Counters& now, const Counters* before, std::string_view name, double seconds) {
  if (before == nullptr || seconds <= 0) return 0;
  const uint64_t a = Get(*before, name), b = Get(now, name);
  return b >= a ? static_cast<double>(b - a) / seconds : 0;
}

uint64_t Faults(const Counters& c) {
  uint64_t n = 0;
  for (const auto& [name, value] : c) {
    if (name.starts_with("fault_")) n += value;
  }
  return n;
}

std::string Render(const std::vector<Reading>& now, const std::map<pid_t, Reading>& before,
                   double seconds, int interval_s) {
  std::string out;
  const std::time_t t = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&t));
  out += fmt::format("rdmaemu top - {}, every {} s, {} program{}\n\n", when, interval_s, now.size(),
                     now.size() == 1 ? "" : "s");
  out += fmt::format("{:>7} {:<16} {:<6} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6} {:>8}\n", "PID",
                     "PROGRAM", "DEVICE", "TX pkt/s", "RX pkt/s", "TX MB/s", "RX MB/s", "RETRANS",
                     "RNR", "FAULTS");
  for (const auto& r : now) {
    auto prev = before.find(r.pid);
    for (const auto& d : r.devices) {
      const Counters* pc = nullptr;
      if (prev != before.end()) {
        for (const auto& pd : prev->second.devices) {
          if (pd.name == d.name) pc = &pd.counters;
        }
      }
      out += fmt::format(
          "{:>7} {:<16} {:<6} {:>10.0f} {:>10.0f} {:>9.2f} {:>9.2f} {:>8} {:>6} {:>8}\n", r.pid,
          r.program.substr(0, 16), d.name, Rate(d.counters, pc, "packets_sent", seconds),
          Rate(d.counters, pc, "packets_received", seconds),
          Rate(d.counters, pc, "bytes_sent", seconds) / 1e6,
          Rate(d.counters, pc, "bytes_received", seconds) / 1e6, Get(d.counters, "retransmissions"),
          Get(d.counters, "rnr_naks_received") + Get(d.counters, "rnr_naks_sent"), Faults(d.counters));
    }
  }
  out += fmt::format("\n{:>7} {:<6} {:>8} {:<4} {:<5} {:>10} {:>10} {:>8} {:>8}\n", "PID", "DEVICE",
                     "QPN", "TYPE", "STATE", "TX pkt/s", "RX pkt/s", "RETRANS", "TIMEOUTS");
  for (const auto& r : now) {
    auto prev = before.find(r.pid);
    for (const auto& q : r.qps) {
      const Counters* pc = nullptr;
      if (prev != before.end()) {
        for (const auto& pq : prev->second.qps) {
          if (pq.device == q.device && pq.qpn == q.qpn) pc = &pq.counters;
        }
      }
      out += fmt::format("{:>7} {:<6} {:>8} {:<4} {:<5} {:>10.0f} {:>10.0f} {:>8} {:>8}\n", r.pid,
                         q.device, q.qpn, q.type, q.state,
                         Rate(q.counters, pc, "packets_sent", seconds),
                         Rate(q.counters, pc, "packets_received", seconds),
                         Get(q.counters, "retransmissions"), Get(q.counters, "timeouts"));
    }
  }
  return out;
}

}  // namespace

std::string TopHelp() {
  return "Usage: rdmaemu top [--pid PID] [--interval SECONDS] [--count N] [--max-qps N]\n"
         "\n"
         "A live view of the running programs that have an emulated device open, as\n"
         "`top` is of processes: per program and device the packets and megabytes\n"
         "sent and received per second, and the retransmissions, RNR NAKs and packets\n"
         "fault rules acted on so far; per QP its type, state, packets per second,\n"
         "retransmissions and transport timeouts. Rates are the change since the\n"
         "previous reading (0 in the first). On a terminal the screen is redrawn each\n"
         "interval; otherwise each reading is printed after the last (plain text, for\n"
         "logs). Stop it with Ctrl-C, or give --count.\n"
         "\n"
         "Options:\n"
         "  --pid PID           watch that process only (default: every running program)\n"
         "  --interval SECONDS  seconds between readings (default 1)\n"
         "  --count N           stop after N readings (default: run until interrupted)\n"
         "  --max-qps N         QPs shown per program (default 20)\n"
         "  -h, --help          show this help and exit\n"
         "\n"
         "It reads what `rdmaemu list` and `rdmaemu stats` read, through the programs'\n"
         "control sockets.\n"
         "\n"
         "Exit status: 0 after --count readings, 1 no running program, 2 usage error.\n";
}

int TopMain(std::span<const std::string> args, const char*) {
  std::optional<pid_t> only;
  int interval = 1, count = 0;
  size_t max_qps = 20;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(TopHelp().c_str(), stdout);
      return kExitOk;
    }
    if (a != "--pid" && a != "--interval" && a != "--count" && a != "--max-qps") {
      return UsageError("top", fmt::format("unknown argument '{}'", a));
    }
    if (i + 1 >= args.size()) return UsageError("top", fmt::format("'{}' needs a value", a));
    auto v = PositiveNumber(args[++i]);
    if (!v) return UsageError("top", fmt::format("{}: '{}' is not a positive number", a, args[i]));
    if (a == "--pid") only = *v;
    if (a == "--interval") interval = *v;
    if (a == "--count") count = *v;
    if (a == "--max-qps") max_qps = static_cast<size_t>(*v);
  }
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  std::map<pid_t, Reading> before;
  auto last = std::chrono::steady_clock::now();
  for (int n = 0; count == 0 || n < count; ++n) {
    if (n > 0) std::this_thread::sleep_for(std::chrono::seconds(interval));
    std::vector<Reading> now;
    for (const auto& s : RunningPrograms(only)) {
      if (auto r = Read(s, max_qps)) now.push_back(std::move(*r));
    }
    if (n == 0 && now.empty()) {
      PrintError("top", only ? fmt::format("no rdmaemu process with pid {}", *only)
                             : std::string("no running rdmaemu process found"));
      return kExitFailure;
    }
    const auto t = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(t - last).count();
    last = t;
    std::string screen = Render(now, before, n == 0 ? 0 : seconds, interval);
    if (tty) std::fputs("\033[H\033[2J", stdout);
    else if (n > 0) std::fputc('\n', stdout);
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
    before.clear();
    for (auto& r : now) before.emplace(r.pid, std::move(r));
  }
  return kExitOk;
}

}  // namespace rdmaemu::cli
