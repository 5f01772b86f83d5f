// Device configuration: which emulated devices exist and how their ports look.
//
// With no configuration there is one RoCEv2 device `emu0` with one ACTIVE
// port at MTU 4096 on the first free loopback address. A file named by
// RDMAEMU_CONFIG describes more (see README "Configuration"); a few
// environment variables override single settings.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"

namespace rdmaemu::device {

enum class LinkLayer { kEthernet, kInfiniBand };

// Encodings are the IBTA ones (and so libibverbs' ones): width 1x=1, 4x=2,
// 8x=4, 12x=8, 2x=16; speed SDR=1 … NDR=128.
struct PortConfig {
  std::optional<in_addr> address;  // nullopt: first free address of 127.0.0.0/8
  uint16_t udp_port = 4791;
  LinkLayer link_layer = LinkLayer::kEthernet;
  uint32_t max_mtu = 4096;
  uint32_t active_mtu = 4096;
  uint8_t width = 2;     // 4x
  uint8_t speed = 32;    // EDR: 4x EDR = 100 Gb/s
  uint16_t lid = 0;      // InfiniBand link layer only
  bool active = true;
};

struct DeviceConfig {
  std::string name;
  std::vector<PortConfig> ports;
};

struct Config {
  std::vector<DeviceConfig> devices;
};

// The configuration with nothing configured: emu0, one port.
Config DefaultConfig();

// Parses the text of a configuration file; `origin` names it in errors.
Result<Config> ParseConfig(std::string_view text, std::string_view origin);

// Reads RDMAEMU_CONFIG (if set) and applies RDMAEMU_ADDRESS and
// RDMAEMU_UDP_PORT. Errors name the file, line and setting.
Result<Config> LoadConfigFromEnvironment();

// Parsers for single values, shared with the control commands. A speed is
// an IBTA name (sdr .. ndr) or the lane rate ibv_devinfo prints (25.0,
// 25.0gbps, 25); a width is 1x, 2x, 4x, 8x or 12x. Any case.
Result<uint32_t> ParseMtu(std::string_view);
// A decimal number from 0 to `max`; the error names `what`.
Result<uint64_t> ParseUnsigned(std::string_view s, uint64_t max, std::string_view what);
Result<uint8_t> ParseWidth(std::string_view);
Result<uint8_t> ParseSpeed(std::string_view);
std::string_view WidthName(uint8_t width);
std::string_view SpeedName(uint8_t speed);
// The per-lane rate in Gbps as ibv_devinfo -v prints it ("25.0" for EDR).
std::string_view SpeedRate(uint8_t speed);

}  // namespace rdmaemu::device
