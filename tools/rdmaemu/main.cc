// rdmaemu: runs unmodified RDMA programs on the emulated device and shows
// what the emulator provides. `rdmaemu --help` lists the commands.
#include <array>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {

constexpr std::string_view kVersion = "0.1.0";

// Only commands that work are listed; nothing here is a placeholder.
constexpr std::array<Command, 4> kCommands = {{
    {"run", "run a program on the emulated RDMA device", RunHelp, RunMain},
    {"devices", "list the emulated devices and their ports", DevicesHelp, DevicesMain},
    {"top", "a live view of running programs' devices and QPs (packets/s, retransmissions)",
     TopHelp, TopMain},
    {"trace", "follow a running program's log lines (packets, WRs, completions) live",
     TraceHelp, TraceMain},
}};

const Command* Find(std::string_view name) {
  for (const auto& c : kCommands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string MainHelp() {
  std::string out =
      "Usage: rdmaemu [--help | --version] COMMAND [OPTIONS] [ARGS]\n"
      "\n"
      "rdmaemu is an RDMA (RoCE v2) device emulated in user space. Programs built\n"
      "for rdma-core's libibverbs run unmodified on it: no NIC, kernel module or root.\n"
      "\n"
      "Commands:\n";
  for (const auto& c : kCommands) out += fmt::format("  {:<10} {}\n", c.name, c.summary);
  for (const auto& [name, summary] : ForwardedSummaries()) out += fmt::format("  {:<10} {}\n", name, summary);
  out +=
      "  help CMD   show the help of a command\n"
      "\n"
      "Options:\n"
      "  -h, --help     show this help and exit\n"
      "  --version      print the version and exit\n"
      "\n"
      "Exit status: 0 success, 1 failure, 2 usage error; `run` exits with the\n"
      "program's status (127 if the program is not found).\n"
      "Run `rdmaemu help COMMAND` or `rdmaemu COMMAND --help` for a command's options.\n";
  return out;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const char* argv0 = argc > 0 ? argv[0] : "rdmaemu";
  if (args.empty()) {
    std::fputs(MainHelp().c_str(), stderr);
    return kExitUsage;
  }
  std::string_view first = args[0];
  if (first == "-h" || first == "--help") {
    std::fputs(MainHelp().c_str(), stdout);
    return kExitOk;
  }
  if (first == "--version" || first == "-V") {
    std::printf("rdmaemu %.*s\n", static_cast<int>(kVersion.size()), kVersion.data());
    return kExitOk;
  }
  if (first == "help") {
    if (args.size() == 1) {
      std::fputs(MainHelp().c_str(), stdout);
      return kExitOk;
    }
    if (args.size() > 2) {
      std::fprintf(stderr, "rdmaemu help: expected one command name, got %zu words\n",
                   args.size() - 1);
      return kExitUsage;
    }
    if (args[1] == "help") {
      std::fputs("Usage: rdmaemu help COMMAND\n\n"
                 "Shows the help of COMMAND, as `rdmaemu COMMAND --help` does.\n",
                 stdout);
      return kExitOk;
    }
    if (IsForwarded(args[1])) {
      std::fputs(ForwardedHelp(args[1]).c_str(), stdout);
      return kExitOk;
    }
    const Command* c = Find(args[1]);
    if (c == nullptr) {
      std::fprintf(stderr, "rdmaemu help: unknown command '%s' (see rdmaemu --help)\n",
                   args[1].c_str());
      return kExitUsage;
    }
    std::fputs(c->help().c_str(), stdout);
    return kExitOk;
  }
  if (first.starts_with("-")) {
    std::fprintf(stderr, "rdmaemu: unknown option '%s' (see rdmaemu --help)\n", args[0].c_str());
    return kExitUsage;
  }
  if (IsForwarded(first)) return ForwardedMain(first, std::span<const std::string>(args).subspan(1));
  const Command* c = Find(first);
  if (c == nullptr) {
    std::fprintf(stderr, "rdmaemu: unknown command '%s' (see rdmaemu --help)\n", args[0].c_str());
    return kExitUsage;
  }
  return c->main(std::span<const std::string>(args).subspan(1), argv0);
}

}  // namespace

int UsageError(std::string_view command, std::string_view message) {
  std::fprintf(stderr, "rdmaemu %.*s: %.*s\nTry 'rdmaemu %.*s --help'.\n",
               static_cast<int>(command.size()), command.data(), static_cast<int>(message.size()),
               message.data(), static_cast<int>(command.size()), command.data());
  return kExitUsage;
}

void PrintError(std::string_view command, std::string_view message) {
  std::fprintf(stderr, "rdmaemu %.*s: %.*s\n", static_cast<int>(command.size()), command.data(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace rdmaemu::cli

int main(int argc, char** argv) { return rdmaemu::cli::Main(argc, argv); }
