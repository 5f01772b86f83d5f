// Fuzz target: the device configuration file (device::ParseConfig, the file
// RDMAEMU_CONFIG names), and the single-value parsers the control commands
// share with it (`rdmaemu port ... mtu|width|speed`). What a parse accepts
// must be a configuration the device can be built from, so the target also
// checks the invariants config.h promises of a parsed one.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "emulator/device/config.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

void CheckConfig(const rdmaemu::device::Config& config) {
  std::set<std::string> names;
  for (const auto& dev : config.devices) {
    if (dev.name.empty()) Fail("a device without a name", "");
    if (!names.insert(dev.name).second) Fail("two devices with one name", dev.name);
    if (dev.ports.empty() || dev.ports.size() > 2) Fail("a device with no port or more than 2", dev.name);
    for (const auto& port : dev.ports) {
      if (port.active_mtu > port.max_mtu) Fail("active MTU above the port's maximum", dev.name);
      // Every value the parser accepts has a name to print (ibv_devinfo).
      if (rdmaemu::device::WidthName(port.width) == "invalid") Fail("a width with no name", dev.name);
      if (rdmaemu::device::SpeedName(port.speed) == "invalid") Fail("a speed with no name", dev.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmaemu::device;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfig(text, "fuzz.conf");
  if (config.ok()) CheckConfig(*config);
  // The single-value parsers get the first line alone, as a command word.
  const std::string_view word = text.substr(0, text.find('\n'));
  if (auto mtu = ParseMtu(word); mtu.ok()) {
    if (*mtu != 256 && *mtu != 512 && *mtu != 1024 && *mtu != 2048 && *mtu != 4096) {
      Fail("ParseMtu accepted a value no port has", std::to_string(*mtu));
    }
  }
  if (auto width = ParseWidth(word); width.ok()) {
    auto again = ParseWidth(WidthName(*width));
    if (!again.ok() || *again != *width) Fail("a width's name does not parse back", std::string(word));
  }
  if (auto speed = ParseSpeed(word); speed.ok()) {
    auto again = ParseSpeed(SpeedName(*speed));
    if (!again.ok() || *again != *speed) Fail("a speed's name does not parse back", std::string(word));
  }
  return 0;
}
