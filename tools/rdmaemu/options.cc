#include "tools/rdmaemu/options.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace rdmaemu::cli {

std::optional<std::string> ParsedArgs::Get(std::string_view name) const {
  auto it = values.find(name);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

ParsedArgs ParseArgs(std::span<const std::string> args, std::span<const OptionSpec> specs) {
  ParsedArgs out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      out.help = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the first operand
    if (a.substr(0, 2) != "--") {
      out.error = fmt::format("unknown option '{}'", a);
      return out;
    }
    std::string_view name = a.substr(2);
    std::optional<std::string_view> inline_value;
    if (auto eq = name.find('='); eq != std::string_view::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto spec = std::find_if(specs.begin(), specs.end(),
                             [&](const OptionSpec& s) { return s.name == name; });
    if (spec == specs.end()) {
      out.error = fmt::format("unknown option '--{}'", name);
      return out;
    }
    std::string value;
    if (spec->metavar.empty()) {
      // A flag: present or not. Its value is the empty string.
      if (inline_value) {
        out.error = fmt::format("option '--{}' takes no value", name);
        return out;
      }
    } else if (inline_value) {
      value = std::string(*inline_value);
    } else if (!spec->implicit.empty()) {
      value = std::string(spec->implicit);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      out.error = fmt::format("option '--{}' needs a value ({})", name, spec->metavar);
      return out;
    }
    out.values[std::string(name)] = std::move(value);
  }
  out.operands.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

namespace {

constexpr std::array<std::string_view, 6> kLevels = {"off", "error", "warn", "info", "debug",
                                                     "trace"};
constexpr std::array<std::string_view, 3> kEngines = {"auto", "uring", "epoll"};
constexpr std::array<std::string_view, 3> kCheckModes = {"off", "warn", "error"};

template <size_t N>
bool OneOf(std::string_view v, const std::array<std::string_view, N>& set) {
  return std::find(set.begin(), set.end(), v) != set.end();
}

}  // namespace

std::string CheckLogLevel(std::string_view value) {
  if (OneOf(value, kLevels)) return {};
  return fmt::format("--log: '{}' is not a level (off, error, warn, info, debug, trace)", value);
}

std::string CheckEngine(std::string_view value) {
  if (OneOf(value, kEngines)) return {};
  return fmt::format("--engine: '{}' is not an engine (auto, uring, epoll)", value);
}

std::string CheckCheckMode(std::string_view value) {
  if (OneOf(value, kCheckModes)) return {};
  return fmt::format("--check: '{}' is not a mode (warn, error, off)", value);
}

std::string CheckAddress(std::string_view value) {
  if (value == "auto") return {};
  in_addr a{};
  std::string s(value);
  if (inet_pton(AF_INET, s.c_str(), &a) == 1) return {};
  return fmt::format("--address: '{}' is not an IPv4 address (or 'auto')", value);
}

std::string CheckUdpPort(std::string_view value) {
  unsigned v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec == std::errc() && p == value.data() + value.size() && v >= 1 && v <= 65535) return {};
  return fmt::format("--udp-port: '{}' is not a UDP port number (1 to 65535)", value);
}

std::string CheckConfigFile(std::string_view value) {
  std::string path(value);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return fmt::format("--config: cannot use '{}': {}", value, std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return fmt::format("--config: '{}' is a directory, not a file", value);
  if (::access(path.c_str(), R_OK) != 0) {
    return fmt::format("--config: cannot read '{}': {}", value, std::strerror(errno));
  }
  return {};
}

const std::vector<OptionSpec> kEnvironmentOptions = {
    {"log", "LEVEL", "log level: off, error, warn (default), info, debug, trace  [RDMAEMU_LOG]"},
    {"config", "FILE", "device configuration file (see README, Configuration)  [RDMAEMU_CONFIG]"},
    {"address", "IP", "IPv4 address of the first device's first port, or 'auto'  [RDMAEMU_ADDRESS]"},
    {"udp-port", "PORT", "UDP port of every port (default 4791)  [RDMAEMU_UDP_PORT]"},
    {"engine", "NAME", "network engine: auto (default), uring, epoll  [RDMAEMU_ENGINE]"},
    {"lib", "DIR", "directory holding the built libibverbs.so.1  [RDMAEMU_LIB]"},
};

const std::vector<OptionSpec> kRunOptions = [] {
  std::vector<OptionSpec> options = kEnvironmentOptions;
  options.push_back({"check", "MODE",
                     "verbs checker (docs/check.md): warn (bare --check) reports the program's "
                     "mistakes, error also exits 86  [RDMAEMU_CHECK]",
                     "warn"});
  options.push_back({"check-report", "FILE",
                     "also write the checker's reports to FILE as JSON lines  [RDMAEMU_CHECK_REPORT]"});
  options.push_back({"no-sysfs", "",
                     "do not show PROGRAM the devices under /sys/class/infiniband (docs/sysfs.md)"});
  return options;
}();

std::string CheckEnvironmentOptions(const ParsedArgs& args) {
  struct Check {
    std::string_view name;
    std::string (*fn)(std::string_view);
  };
  static constexpr std::array<Check, 6> kChecks = {{
      {"log", CheckLogLevel},
      {"check", CheckCheckMode},
      {"config", CheckConfigFile},
      {"address", CheckAddress},
      {"udp-port", CheckUdpPort},
      {"engine", CheckEngine},
  }};
  for (const auto& c : kChecks) {
    if (auto v = args.Get(c.name)) {
      if (std::string e = c.fn(*v); !e.empty()) return e;
    }
  }
  return {};
}

void ExportEnvironment(const ParsedArgs& args) {
  auto set = [&](std::string_view option, const char* var, bool absolute_path = false) {
    auto v = args.Get(option);
    if (!v) return;
    std::string value = *v;
    if (absolute_path) {
      std::error_code ec;
      auto abs = std::filesystem::absolute(value, ec);
      if (!ec) value = abs.string();
    }
    ::setenv(var, value.c_str(), 1);
  };
  set("log", "RDMAEMU_LOG");
  set("config", "RDMAEMU_CONFIG", true);
  set("address", "RDMAEMU_ADDRESS");
  set("udp-port", "RDMAEMU_UDP_PORT");
  set("engine", "RDMAEMU_ENGINE");
  // So that an `rdmaemu` the program runs in turn (a test script's) finds
  // the same library.
  set("lib", "RDMAEMU_LIB", true);
  set("check", "RDMAEMU_CHECK");
  set("check-report", "RDMAEMU_CHECK_REPORT", true);
}

std::string FormatOptions(std::span<const OptionSpec> specs) {
  std::string out;
  for (const auto& s : specs) {
    std::string left = s.metavar.empty()    ? fmt::format("--{}", s.name)
                       : s.implicit.empty() ? fmt::format("--{} {}", s.name, s.metavar)
                                            : fmt::format("--{}[={}]", s.name, s.metavar);
    out += fmt::format("  {:<20} {}\n", left, s.help);
  }
  out += fmt::format("  {:<20} {}\n", "-h, --help", "show this help and exit");
  return out;
}

}  // namespace rdmaemu::cli
