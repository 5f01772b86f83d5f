// `capture start FILE | stop | status`: starts or stops the process's packet
// capture while it runs, as RDMAEMU_PCAP=FILE does at start: the same
// capture (emulator/capture/capture.h), one pcap file for every device of
// the process, every packet sent (after fault rules) and received.
//
// A start while a capture runs is refused: it may be RDMAEMU_PCAP's or
// another user's, and replacing it would silently end a file someone is
// relying on. Stop it first (`capture stop` says how many packets it got).
#include <fmt/format.h>

#include "emulator/capture/capture.h"
#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kCaptureCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: capture start FILE\n"
    "       capture stop\n"
    "       capture status\n"
    "Starts writing every packet this process sends and receives, on every\n"
    "device, to the pcap file FILE (`%p` becomes the process id; tshark -r FILE\n"
    "decodes them), stops it, or says whether and where it captures and how many\n"
    "packets so far. A start while a capture runs (RDMAEMU_PCAP's too) is\n"
    "refused: stop it first.\n";

using Words = std::span<const std::string>;

std::string Packets(uint64_t n) { return fmt::format("{} packet{}", n, n == 1 ? "" : "s"); }

Reply Start(Words words) {
  if (words.size() != 1) {
    return UsageError(kCaptureCommand, words.empty() ? "'start' needs a FILE"
                                                     : fmt::format("unexpected argument '{}'", words[1]));
  }
  if (words[0].empty()) return UsageError(kCaptureCommand, "FILE is empty");
  if (Status s = capture::Start(words[0]); !s.ok()) return FromStatus("capture", s);
  return Ok(fmt::format("capturing into '{}'\n", capture::CurrentPath()));
}

Reply Stop(Words words) {
  if (!words.empty()) return UsageError(kCaptureCommand, fmt::format("unexpected argument '{}'", words[0]));
  auto stopped = capture::Stop();
  if (!stopped.ok()) return FromStatus("capture", stopped.status());
  return Ok(fmt::format("capture stopped: {} in '{}'\n", Packets(stopped->packets), stopped->path));
}

Reply StatusOf(Words words) {
  if (!words.empty()) return UsageError(kCaptureCommand, fmt::format("unexpected argument '{}'", words[0]));
  auto running = capture::Running();
  if (!running) return Ok("not capturing\n");
  return Ok(fmt::format("capturing into '{}': {} so far\n", running->path, Packets(running->packets)));
}

struct CaptureAction {
  std::string_view name;
  Reply (*run)(Words words);
};

constexpr CaptureAction kActions[] = {{"start", Start}, {"stop", Stop}, {"status", StatusOf}};

Reply CaptureMain(Words args) {
  if (args.empty()) return UsageError(kCaptureCommand, "expected start FILE, stop or status");
  for (const CaptureAction& a : kActions) {
    if (a.name == args[0]) return a.run(args.subspan(1));
  }
  return UsageError(kCaptureCommand, fmt::format("unknown action '{}' (actions: start, stop, status)", args[0]));
}

}  // namespace

const Command kCaptureCommand = {"capture", "start or stop a pcap capture of every packet", kUsage,
                                 CaptureMain};

}  // namespace rdmaemu::control
