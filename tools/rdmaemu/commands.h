// The rdmaemu subcommands. Each gets the words after its name and returns
// the process exit status (see options.h); `run` does not return on success.
#pragma once

#include <span>
#include <string>
#include <string_view>

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

// Prints "rdmaemu CMD: MESSAGE" and a pointer to the help on stderr; returns kExitUsage.
int UsageError(std::string_view command, std::string_view message);
// Prints "rdmaemu CMD: MESSAGE" on stderr.
void PrintError(std::string_view command, std::string_view message);

}  // namespace rdmaemu::cli
