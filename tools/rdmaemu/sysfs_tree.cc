#include "tools/rdmaemu/sysfs_tree.h"

#include <arpa/inet.h>

#include <algorithm>

#include <fmt/format.h>

namespace rdmaemu::cli {

std::string FormatGuid(uint64_t guid) {
  return fmt::format("{:04x}:{:04x}:{:04x}:{:04x}", (guid >> 48) & 0xffff, (guid >> 32) & 0xffff,
                     (guid >> 16) & 0xffff, guid & 0xffff);
}

std::string FormatGid(const std::array<uint8_t, 16>& gid) {
  std::string out;
  for (size_t i = 0; i < gid.size(); i += 2) {
    if (i != 0) out += ':';
    out += fmt::format("{:02x}{:02x}", gid[i], gid[i + 1]);
  }
  return out;
}

std::string FormatPortState(uint8_t state) {
  // The kernel's names (drivers/infiniband/core/sysfs.c, state_show).
  static constexpr std::string_view kNames[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE",
                                                "ACTIVE_DEFER"};
  return fmt::format("{}: {}", state, state < std::size(kNames) ? kNames[state] : "UNKNOWN");
}

std::string FormatPhysState(uint8_t phys_state) {
  static constexpr std::string_view kNames[] = {"<unknown>", "Sleep", "Polling", "Disabled",
                                                "PortConfigurationTraining", "LinkUp",
                                                "LinkErrorRecovery", "Phy Test"};
  return fmt::format("{}: {}", phys_state,
                     phys_state < std::size(kNames) ? kNames[phys_state] : "<unknown>");
}

std::string FormatRate(uint8_t width, uint8_t speed) {
  // As the kernel's rate_show: a lane's rate in tenths of Gb/s (SDR for an
  // unknown speed) times the lanes, printed with ".5" when it has a half.
  int lanes = 0;
  switch (width) {
    case 1: lanes = 1; break;
    case 16: lanes = 2; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
  }
  std::string_view name = "SDR";
  int deci = 25;
  switch (speed) {
    case 2: name = "DDR"; deci = 50; break;
    case 4: name = "QDR"; deci = 100; break;
    case 8: name = "FDR10"; deci = 100; break;
    case 16: name = "FDR"; deci = 140; break;
    case 32: name = "EDR"; deci = 250; break;
    case 64: name = "HDR"; deci = 500; break;
    case 128: name = "NDR"; deci = 1000; break;
  }
  const int rate = deci * lanes;
  return fmt::format("{}{} Gb/sec ({}X {})", rate / 10, rate % 10 != 0 ? ".5" : "", lanes, name);
}

std::string FormatLid(uint16_t lid) { return fmt::format("{:#x}", lid); }

std::string_view GidTypeName(GidType type) {
  switch (type) {
    // The kernel names IB and RoCE v1 GIDs alike (ib_cache_gid_type_str).
    case GidType::kIb:
    case GidType::kRoceV1: return "IB/RoCE v1";
    case GidType::kRoceV2: return "RoCE v2";
  }
  return "RoCE v2";
}

std::optional<std::string> ChooseNetdev(in_addr address, std::span<const Interface> interfaces) {
  for (const auto& i : interfaces) {
    if (i.address.s_addr == address.s_addr) return i.name;
  }
  for (const auto& i : interfaces) {
    if (i.loopback && (i.address.s_addr & i.netmask.s_addr) == (address.s_addr & i.netmask.s_addr)) {
      return i.name;
    }
  }
  return std::nullopt;
}

namespace {

class TreeWriter {
 public:
  void Dir(std::string path) { nodes_.push_back({SysfsNode::Kind::kDirectory, std::move(path), {}}); }
  // Files end with a newline, as every sysfs attribute the kernel prints.
  void File(std::string path, std::string_view text) {
    nodes_.push_back({SysfsNode::Kind::kFile, std::move(path), fmt::format("{}\n", text)});
  }
  void Link(std::string path, std::string target) {
    nodes_.push_back({SysfsNode::Kind::kSymlink, std::move(path), std::move(target)});
  }
  std::vector<SysfsNode> Take() { return std::move(nodes_); }

 private:
  std::vector<SysfsNode> nodes_;
};

void AddPort(TreeWriter& w, const std::string& dir, const PortInfo& p,
             const std::optional<std::string>& netdev) {
  w.Dir(dir);
  w.File(dir + "/state", FormatPortState(p.state));
  w.File(dir + "/phys_state", FormatPhysState(p.phys_state));
  w.File(dir + "/link_layer", p.ethernet ? "Ethernet" : "InfiniBand");
  w.File(dir + "/rate", FormatRate(p.width, p.speed));
  // A RoCE port's LID is always 0; an InfiniBand port's is its address's
  // low 16 bits unless configured, unknown while the address is.
  if (p.ethernet || p.address_fixed) w.File(dir + "/lid", FormatLid(p.lid));
  w.File(dir + "/sm_lid", FormatLid(p.sm_lid));
  w.Dir(dir + "/gid_attrs");
  w.Dir(dir + "/gid_attrs/types");
  w.File(dir + "/gid_attrs/types/0", GidTypeName(p.gid_type));
  if (p.ethernet && netdev) {
    w.Dir(dir + "/gid_attrs/ndevs");
    w.File(dir + "/gid_attrs/ndevs/0", *netdev);
  }
  w.Dir(dir + "/gids");
  if (p.address_fixed && p.gid0) w.File(dir + "/gids/0", FormatGid(*p.gid0));
}

}  // namespace

std::vector<SysfsNode> BuildSysfsTree(std::span<const DeviceInfo> devices,
                                      std::span<const Interface> interfaces) {
  TreeWriter w;
  for (const auto& d : devices) {
    const std::string& dev = d.name;
    w.Dir(dev);
    w.File(dev + "/node_type", "1: CA");
    w.File(dev + "/node_guid", FormatGuid(d.node_guid));
    if (d.sys_image_guid) w.File(dev + "/sys_image_guid", FormatGuid(*d.sys_image_guid));
    if (!d.fw_ver.empty()) w.File(dev + "/fw_ver", d.fw_ver);
    w.File(dev + "/hca_type", "rdmaemu");

    std::vector<std::optional<std::string>> netdevs;
    std::vector<std::string> names;  // the device's netdevs, each once, in port order
    for (const auto& p : d.ports) {
      netdevs.push_back(p.ethernet ? ChooseNetdev(p.address, interfaces) : std::nullopt);
      if (netdevs.back() && std::find(names.begin(), names.end(), *netdevs.back()) == names.end()) {
        names.push_back(*netdevs.back());
      }
    }
    w.Dir(dev + "/device");
    if (!names.empty()) {
      w.Dir(dev + "/device/net");
      // The kernel's DEV/device/net/IFNAME is the netdev's own directory;
      // this points at it, from .../DEV/device/net up to /sys/class.
      for (const auto& n : names) w.Link(dev + "/device/net/" + n, "../../../../net/" + n);
    }
    if (d.ports.empty()) continue;
    w.Dir(dev + "/ports");
    for (size_t i = 0; i < d.ports.size(); ++i) {
      AddPort(w, fmt::format("{}/ports/{}", dev, d.ports[i].number), d.ports[i], netdevs[i]);
    }
  }
  return w.Take();
}

}  // namespace rdmaemu::cli
