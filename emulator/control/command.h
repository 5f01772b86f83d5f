// The control commands: what `rdmaemu COMMAND ...` runs inside each
// emulating process, reached through the control socket (server.h).
//
// A command is data: a name, a one-line summary, its usage text and a
// handler that gets the words after the name and returns a Reply (exit
// status 0 / 1 / 2, stdout text, stderr text). Handlers run on the control
// thread, one at a time; they must not block for long, and they report every
// refusal in `err` with a sentence naming what was wrong, each line starting
// "NAME: " (the tool prints it after "rdmaemu ").
//
// Adding a command `foo`:
//   1. emulator/control/foo_command.cc defines
//        const Command kFooCommand = {"foo", "one-line summary",
//                                     "Usage: foo ARGS\n...", FooMain};
//      with FooMain a Reply(std::span<const std::string>) function in an
//      anonymous namespace (see port_command.cc, the model);
//   2. one line in the table in emulator/control/commands.cc:
//        &kFooCommand,
//   3. the file in the `commands` srcs of emulator/control/BUILD.bazel
//      (and any deps it needs);
//   4. for the tool: one entry in kForwarded in tools/rdmaemu/control.cc
//      (the help text the tool prints without a running process).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/control/protocol.h"
#include "emulator/device/device.h"

namespace rdmaemu::engine {
class Engine;
}  // namespace rdmaemu::engine

namespace rdmaemu::control {

inline constexpr int kStatusOk = 0;
inline constexpr int kStatusFailure = 1;
inline constexpr int kStatusUsage = 2;

struct Command {
  std::string_view name;
  std::string_view summary;  // one line
  std::string_view usage;    // "Usage: NAME ...\n" and what the words mean
  Reply (*handler)(std::span<const std::string> args);
};

// Every command (commands.cc).
std::span<const Command* const> Commands();
// Runs words[0] with the rest; unknown commands and an empty request are
// usage errors. `help` lists the commands, `help NAME` prints a usage.
Reply Dispatch(std::span<const std::string> words);

// --- helpers for handlers
Reply Ok(std::string out = {});
Reply Failure(std::string err);
// A usage error: "NAME: message" (`help NAME` has the usage text).
Reply UsageError(const Command& command, std::string_view message);
// Turns a failed Status into a failure reply ("COMMAND: message").
Reply FromStatus(std::string_view command, const Status& status);

// The open device called `name` in this process; ENOENT naming the open ones.
Result<std::shared_ptr<device::Device>> FindDevice(std::string_view name);
// The engine (transport, fault rules, counters) of an open device; ENOENT
// when none runs for it (no context of this process opened it).
Result<std::shared_ptr<engine::Engine>> FindEngine(const device::Device& dev);
// The open devices that have an engine, in configuration order, each with
// it; ENOENT when there is none ("no device is open in this process").
struct Running {
  std::shared_ptr<device::Device> device;
  std::shared_ptr<engine::Engine> engine;
};
Result<std::vector<Running>> RunningDevices();
// This process's program name (/proc/self/comm), "?" if unknown.
std::string ProgramName();
// A port number of `dev` from a word ("1"); EINVAL naming the valid ones.
Result<int> ParsePort(const device::Device& dev, std::string_view word);
// An unsigned number, decimal or 0x-hex, at most `max`; EINVAL otherwise.
Result<uint64_t> ParseNumber(std::string_view word, uint64_t max);
// "ACTIVE", "DOWN", ...
std::string_view ToString(device::PortState state);

}  // namespace rdmaemu::control
