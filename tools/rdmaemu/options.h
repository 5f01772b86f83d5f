// Command-line parsing for the rdmaemu tool: `--name VALUE` / `--name=VALUE`
// options, `-h`/`--help`, `--` ending the options, and checks of the values
// that become RDMAEMU_* environment variables.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaemu::cli {

// Exit statuses: 0 done, 1 failed, 2 the command line was wrong. Before it
// execs, `run` also uses a shell's 126 (cannot execute) and 127 (not found).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCannotExecute = 126;
inline constexpr int kExitNotFound = 127;

struct OptionSpec {
  std::string_view name;     // without the leading "--"
  std::string_view metavar;  // the value's name; empty: a flag, which takes none
  std::string_view help;
  // Non-empty: the value is optional, given only as --name=VALUE, and bare
  // --name means this one (--check is --check=warn).
  std::string_view implicit = {};
};

struct ParsedArgs {
  std::map<std::string, std::string, std::less<>> values;  // option name -> value
  bool help = false;
  std::vector<std::string> operands;  // what follows the options
  std::string error;                  // non-empty: a usage error, said for a human

  std::optional<std::string> Get(std::string_view name) const;
};

// Parses `args` (the words after the subcommand). Options come first; the
// first word that is not an option, or the word after `--`, starts the
// operands, which are never parsed as options (so `run -- prog --help`
// passes --help to prog). A repeated option keeps its last value.
ParsedArgs ParseArgs(std::span<const std::string> args, std::span<const OptionSpec> specs);

// Value checks; each returns an empty string when the value is good, else a
// message naming the option and what it accepts.
std::string CheckLogLevel(std::string_view value);
std::string CheckEngine(std::string_view value);
std::string CheckAddress(std::string_view value);
std::string CheckUdpPort(std::string_view value);
std::string CheckConfigFile(std::string_view value);
std::string CheckCheckMode(std::string_view value);

// The options `run` and `devices` share, and the environment they set.
extern const std::vector<OptionSpec> kEnvironmentOptions;

// kEnvironmentOptions, the verbs checker's and --no-sysfs, which only `run` has.
extern const std::vector<OptionSpec> kRunOptions;

// Checks every option of kRunOptions present in `args`; returns the
// first problem, or an empty string.
std::string CheckEnvironmentOptions(const ParsedArgs& args);

// Sets RDMAEMU_LOG / RDMAEMU_CONFIG (made absolute) / RDMAEMU_ADDRESS /
// RDMAEMU_UDP_PORT / RDMAEMU_ENGINE / RDMAEMU_LIB (made absolute) /
// RDMAEMU_CHECK / RDMAEMU_CHECK_REPORT (made absolute) in this process's
// environment from the options given. Options not given leave the inherited variables alone.
void ExportEnvironment(const ParsedArgs& args);

// Formats the option list for help texts, one option a line.
std::string FormatOptions(std::span<const OptionSpec> specs);

}  // namespace rdmaemu::cli
