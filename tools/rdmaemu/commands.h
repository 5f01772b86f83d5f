// The rdmaemu subcommands. Each gets the words after its name and returns
// the process exit status (see options.h); `run` does not return on success.
#pragma once

#include <sys/types.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "emulator/control/protocol.h"

namespace rdmaemu::cli {

struct Command {
  std::string_view name;
  std::string_view summary;                 // one line, for `rdmaemu --help`
  std::string (*help)();                    // full help text
  int (*main)(std::span<const std::string> args, const char* argv0);
};

std::string RunHelp();
int RunMain(std::span<const std::string> args, const char* argv0);

std::string DevicesHelp();
int DevicesMain(std::span<const std::string> args, const char* argv0);

// A live view of running programs' devices and QPs (top.cc).
std::string TopHelp();
int TopMain(std::span<const std::string> args, const char* argv0);

// Follows a running program's log lines (trace.cc).
std::string TraceHelp();
int TraceMain(std::span<const std::string> args, const char* argv0);

// The commands run inside running programs through their control sockets
// (control.cc): `list`, `port`, `event`, ...
std::vector<std::pair<std::string_view, std::string_view>> ForwardedSummaries();  // name, summary
bool IsForwarded(std::string_view name);
std::string ForwardedHelp(std::string_view name);
int ForwardedMain(std::string_view name, std::span<const std::string> args);

// The control sockets of the running programs (only `only`'s if given),
// one per process, in pid order (control.cc; list, top and trace use it).
std::vector<control::Server> RunningPrograms(std::optional<pid_t> only);
// A positive decimal number (a pid, a count, seconds), or nullopt.
std::optional<int> PositiveNumber(std::string_view text);

// Prints "rdmaemu CMD: MESSAGE" and a pointer to the help on stderr; returns kExitUsage.
int UsageError(std::string_view command, std::string_view message);
// Prints "rdmaemu CMD: MESSAGE" on stderr.
void PrintError(std::string_view command, std::string_view message);

}  // namespace rdmaemu::cli
