// `trace start FILE [LEVEL] | stop | status`: sends this process's log lines,
// from LEVEL (default trace) up, to FILE too while it runs, without a
// restart and without changing what it prints on stderr (emulator/base/
// log.h's tee). `rdmaemu trace` starts it, follows the file and stops it.
#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kTraceCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: trace start FILE [LEVEL]\n"
    "       trace stop\n"
    "       trace status\n"
    "Sends this process's log lines from LEVEL up (trace, debug, info, warn,\n"
    "error; default trace) to FILE as well, while it runs, leaving what it prints\n"
    "on stderr as RDMAEMU_LOG says; stops that, or says where they go.\n";

using Words = std::span<const std::string>;

Reply Start(Words words) {
  if (words.empty() || words.size() > 2 || words[0].empty()) {
    return UsageError(kTraceCommand, "expected start FILE [LEVEL]");
  }
  auto level = spdlog::level::trace;
  if (words.size() == 2) {
    level = spdlog::level::from_str(words[1]);
    if (level == spdlog::level::off || level == spdlog::level::critical) {
      return UsageError(kTraceCommand, fmt::format("'{}' is not one of trace, debug, info, warn, "
                                                   "error", words[1]));
    }
  }
  if (Status s = StartLogTee(words[0], level); !s.ok()) return FromStatus("trace", s);
  return Ok(fmt::format("log lines from {} go to '{}'\n", spdlog::level::to_string_view(level),
                        words[0]));
}

Reply Stop(Words words) {
  if (!words.empty()) return UsageError(kTraceCommand, fmt::format("unexpected argument '{}'", words[0]));
  const std::string path = LogTeePath();
  if (Status s = StopLogTee(); !s.ok()) return FromStatus("trace", s);
  return Ok(fmt::format("log lines no longer go to '{}'\n", path));
}

Reply StatusOf(Words words) {
  if (!words.empty()) return UsageError(kTraceCommand, fmt::format("unexpected argument '{}'", words[0]));
  const std::string path = LogTeePath();
  return Ok(path.empty() ? "not tracing\n" : fmt::format("log lines go to '{}'\n", path));
}

Reply TraceMain(Words args) {
  if (args.empty()) return UsageError(kTraceCommand, "expected start FILE [LEVEL], stop or status");
  if (args[0] == "start") return Start(args.subspan(1));
  if (args[0] == "stop") return Stop(args.subspan(1));
  if (args[0] == "status") return StatusOf(args.subspan(1));
  return UsageError(kTraceCommand, fmt::format("unknown action '{}' (actions: start, stop, status)", args[0]));
}

}  // namespace

const Command kTraceCommand = {"trace", "send the log lines to a file too, while running", kUsage,
                               TraceMain};

}  // namespace rdmaemu::control
