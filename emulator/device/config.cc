#include "emulator/device/config.h"

#include <arpa/inet.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace rdmaemu::device {
namespace {

struct Named {
  std::string_view name;
  uint8_t value;
};

constexpr std::array<Named, 5> kWidths = {{
    {"1x", 1}, {"4x", 2}, {"8x", 4}, {"12x", 8}, {"2x", 16},
}};

// A speed by its IBTA name, or by the per-lane rate ibv_devinfo -v prints
// for it ("active_speed: 25.0 Gbps (32)"). FDR10 has no rate of its own:
// ibv_devinfo prints 10.0 Gbps for it as for QDR, so 10.0 means QDR.
struct NamedSpeed {
  std::string_view name;
  std::string_view rate;  // Gbps per lane; empty for FDR10
  uint8_t value;
};

constexpr std::array<NamedSpeed, 8> kSpeeds = {{
    {"sdr", "2.5", 1}, {"ddr", "5.0", 2}, {"qdr", "10.0", 4}, {"fdr10", "", 8},
    {"fdr", "14.0", 16}, {"edr", "25.0", 32}, {"hdr", "50.0", 64}, {"ndr", "100.0", 128},
}};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

Result<in_addr> ParseAddress(std::string_view s) {
  in_addr a{};
  std::string str(s);
  if (inet_pton(AF_INET, str.c_str(), &a) != 1) {
    return InvalidArgument(fmt::format("address must be an IPv4 address or 'auto', not '{}'", s));
  }
  return a;
}

bool IsValidIdentifier(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

Status ApplyPortSetting(PortConfig& port, std::string_view key, std::string_view value) {
  if (key == "address") {
    if (value == "auto") {
      port.address.reset();
      return Status::Ok();
    }
    auto a = ParseAddress(value);
    if (!a.ok()) return a.status();
    port.address = *a;
  } else if (key == "udp_port") {
    auto v = ParseUnsigned(value, 65535, "udp_port");
    if (!v.ok()) return v.status();
    if (*v == 0) return InvalidArgument("udp_port must not be 0");
    port.udp_port = static_cast<uint16_t>(*v);
  } else if (key == "link_layer") {
    std::string v = Lower(value);
    if (v == "ethernet") {
      port.link_layer = LinkLayer::kEthernet;
    } else if (v == "infiniband") {
      port.link_layer = LinkLayer::kInfiniBand;
    } else {
      return InvalidArgument(fmt::format("link_layer must be ethernet or infiniband, not '{}'", value));
    }
  } else if (key == "mtu") {
    auto m = ParseMtu(value);
    if (!m.ok()) return m.status();
    port.max_mtu = port.active_mtu = *m;
  } else if (key == "active_mtu") {
    auto m = ParseMtu(value);
    if (!m.ok()) return m.status();
    port.active_mtu = *m;
  } else if (key == "width") {
    auto w = ParseWidth(value);
    if (!w.ok()) return w.status();
    port.width = *w;
  } else if (key == "speed") {
    auto s = ParseSpeed(value);
    if (!s.ok()) return s.status();
    port.speed = *s;
  } else if (key == "lid") {
    auto v = ParseUnsigned(value, 0xbfff, "lid");
    if (!v.ok()) return v.status();
    port.lid = static_cast<uint16_t>(*v);
  } else if (key == "state") {
    std::string v = Lower(value);
    if (v == "active") {
      port.active = true;
    } else if (v == "down") {
      port.active = false;
    } else {
      return InvalidArgument(fmt::format("state must be active or down, not '{}'", value));
    }
  } else {
    return InvalidArgument(fmt::format(
        "unknown port setting '{}' (known: address, udp_port, link_layer, mtu, active_mtu, "
        "width, speed, lid, state)",
        key));
  }
  return Status::Ok();
}

Status CheckPort(const PortConfig& port) {
  if (port.active_mtu > port.max_mtu) {
    return InvalidArgument(fmt::format("active_mtu {} exceeds mtu {}", port.active_mtu, port.max_mtu));
  }
  if (port.link_layer == LinkLayer::kEthernet && port.lid != 0) {
    return InvalidArgument("lid is only meaningful on an infiniband link layer port (RoCE ports have LID 0)");
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> ParseUnsigned(std::string_view s, uint64_t max, std::string_view what) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) {
    return InvalidArgument(fmt::format("{} must be a number from 0 to {}, not '{}'", what, max, s));
  }
  return v;
}

Config DefaultConfig() {
  Config c;
  c.devices.push_back(DeviceConfig{"emu0", {PortConfig{}}});
  return c;
}

Result<uint32_t> ParseMtu(std::string_view s) {
  auto v = ParseUnsigned(s, 4096, "mtu");
  if (v.ok() && (*v == 256 || *v == 512 || *v == 1024 || *v == 2048 || *v == 4096)) {
    return static_cast<uint32_t>(*v);
  }
  return InvalidArgument(fmt::format("mtu must be 256, 512, 1024, 2048 or 4096, not '{}'", s));
}

Result<uint8_t> ParseWidth(std::string_view s) {
  std::string v = Lower(s);
  for (const auto& w : kWidths) {
    if (w.name == v) return w.value;
  }
  return InvalidArgument(fmt::format("width must be 1x, 2x, 4x, 8x or 12x (any case, as ibv_devinfo "
                                     "prints 4X), not '{}'",
                                     s));
}

Result<uint8_t> ParseSpeed(std::string_view s) {
  std::string v = Lower(s);
  // A rate: "25", "25.0", "25gbps", "25.0gbps" or "25.0 Gbps" (one word, quoted).
  std::string rate;
  for (char c : v) {
    if (c != ' ') rate.push_back(c);
  }
  if (rate.ends_with("gbps")) rate.resize(rate.size() - 4);
  if (!rate.empty() && rate.find('.') == std::string::npos) rate += ".0";
  for (const auto& sp : kSpeeds) {
    if (sp.name == v || (!sp.rate.empty() && sp.rate == rate)) return sp.value;
  }
  return InvalidArgument(
      fmt::format("speed must be sdr, ddr, qdr, fdr10, fdr, edr, hdr or ndr, or a lane rate as "
                  "ibv_devinfo prints it (2.5, 5.0, 10.0, 14.0, 25.0, 50.0 or 100.0, optionally "
                  "followed by Gbps), not '{}'",
                  s));
}

std::string_view WidthName(uint8_t width) {
  for (const auto& w : kWidths) {
    if (w.value == width) return w.name;
  }
  return "invalid";
}

std::string_view SpeedName(uint8_t speed) {
  for (const auto& sp : kSpeeds) {
    if (sp.value == speed) return sp.name;
  }
  return "invalid";
}

std::string_view SpeedRate(uint8_t speed) {
  if (speed == 8) return "10.0";  // FDR10: as ibv_devinfo prints it
  for (const auto& sp : kSpeeds) {
    if (sp.value == speed) return sp.rate;
  }
  return "invalid";
}

// Format, one statement a line, '#' starts a comment:
//   device NAME
//   port [key=value ...]        (adds the next port to the last device)
Result<Config> ParseConfig(std::string_view text, std::string_view origin) {
  Config config;
  std::istringstream in{std::string(text)};
  std::string raw;
  int line_no = 0;
  auto error = [&](const Status& s) {
    return Status::Error(s.code(), fmt::format("{}:{}: {}", origin, line_no, s.message()));
  };
  while (std::getline(in, raw)) {
    ++line_no;
    std::string_view line = raw;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = Trim(line);
    if (line.empty()) continue;
    std::vector<std::string_view> words = Words(line);
    if (words[0] == "device") {
      if (words.size() != 2 || !IsValidIdentifier(words[1])) {
        return error(InvalidArgument("expected 'device NAME' with a name of letters, digits, '-' or '_'"));
      }
      for (const auto& d : config.devices) {
        if (d.name == words[1]) {
          return error(InvalidArgument(fmt::format("device '{}' is defined twice", words[1])));
        }
      }
      config.devices.push_back(DeviceConfig{std::string(words[1]), {}});
    } else if (words[0] == "port") {
      if (config.devices.empty()) return error(InvalidArgument("'port' before any 'device' line"));
      DeviceConfig& dev = config.devices.back();
      if (dev.ports.size() >= 2) {
        return error(InvalidArgument(fmt::format("device '{}' already has 2 ports, the most supported", dev.name)));
      }
      PortConfig port;
      for (size_t i = 1; i < words.size(); ++i) {
        auto eq = words[i].find('=');
        if (eq == std::string_view::npos) {
          return error(InvalidArgument(fmt::format("expected key=value, got '{}'", words[i])));
        }
        Status s = ApplyPortSetting(port, words[i].substr(0, eq), words[i].substr(eq + 1));
        if (!s.ok()) return error(s);
      }
      Status s = CheckPort(port);
      if (!s.ok()) return error(s);
      dev.ports.push_back(port);
    } else {
      return error(InvalidArgument(fmt::format("unknown statement '{}' (expected 'device' or 'port')", words[0])));
    }
  }
  if (config.devices.empty()) {
    return InvalidArgument(fmt::format("{}: no 'device' defined", origin));
  }
  for (auto& d : config.devices) {
    if (d.ports.empty()) {
      return InvalidArgument(fmt::format("{}: device '{}' has no 'port' line", origin, d.name));
    }
  }
  return config;
}

Result<Config> LoadConfigFromEnvironment() {
  Config config = DefaultConfig();
  if (const char* path = std::getenv("RDMAEMU_CONFIG"); path != nullptr && *path != '\0') {
    std::ifstream f(path);
    if (!f) {
      return InvalidArgument(fmt::format("RDMAEMU_CONFIG={}: cannot open the file", path));
    }
    std::stringstream text;
    text << f.rdbuf();
    auto parsed = ParseConfig(text.str(), path);
    if (!parsed.ok()) return parsed.status();
    config = std::move(parsed).value();
  }
  if (const char* addr = std::getenv("RDMAEMU_ADDRESS"); addr != nullptr && *addr != '\0') {
    Status s = ApplyPortSetting(config.devices[0].ports[0], "address", addr);
    if (!s.ok()) return InvalidArgument(fmt::format("RDMAEMU_ADDRESS: {}", s.message()));
  }
  if (const char* port = std::getenv("RDMAEMU_UDP_PORT"); port != nullptr && *port != '\0') {
    for (auto& d : config.devices) {
      for (auto& p : d.ports) {
        Status s = ApplyPortSetting(p, "udp_port", port);
        if (!s.ok()) return InvalidArgument(fmt::format("RDMAEMU_UDP_PORT: {}", s.message()));
      }
    }
  }
  return config;
}

}  // namespace rdmaemu::device
