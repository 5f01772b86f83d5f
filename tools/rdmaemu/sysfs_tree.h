// What `rdmaemu run` puts under /sys/class/infiniband for the program it
// runs (sysfs_view.h mounts it): the files, their text, and the choice of
// the netdev behind a port. Pure: no system calls, so it is unit-tested.
//
// Each file holds what the kernel's file of that name holds (Linux
// Documentation/ABI/stable/sysfs-class-infiniband), in the kernel's format:
//
//   DEV/node_type              "1: CA"
//   DEV/node_guid              "025e:0bfe:001b:e900" (the GUID the library
//   DEV/sys_image_guid          gives the program: it holds the process id)
//   DEV/fw_ver                 "rdmaemu 0.1" (ibv_query_device's fw_ver)
//   DEV/hca_type               "rdmaemu"
//   DEV/device/net/IFNAME      a symlink to /sys/class/net/IFNAME (relative,
//                              ../../../../net/IFNAME): the netdev holding
//                              the address of each Ethernet port, `lo` for
//                              127.0.0.0/8
//   DEV/ports/N/state          "4: ACTIVE" or "1: DOWN"
//   DEV/ports/N/phys_state     "5: LinkUp" or "3: Disabled"
//   DEV/ports/N/link_layer     "Ethernet" or "InfiniBand"
//   DEV/ports/N/rate           "100 Gb/sec (4X EDR)"
//   DEV/ports/N/lid, sm_lid    "0x0"
//   DEV/ports/N/gid_attrs/types/0   "RoCE v2" ("IB/RoCE v1" for IB ports)
//   DEV/ports/N/gid_attrs/ndevs/0   IFNAME (Ethernet ports)
//   DEV/ports/N/gids/0         "0000:0000:0000:0000:0000:ffff:7f00:0005"
//
// What is not there, because it could not be stated correctly:
// - gids/0 of a port whose address is picked when the program opens the
//   device (`auto`, the default): that is the first free 127.x address at
//   that moment, which no one knows beforehand. Nor lid of an InfiniBand
//   port with such an address (its LID is the address's low 16 bits).
//   Both are there for a port whose address is fixed (address= in the
//   configuration, --address / RDMAEMU_ADDRESS).
// - GIDs past index 0, P_Keys, counters, cap_mask, node_desc, and the
//   kernel's uverbs devices (/sys/class/infiniband_verbs): the library
//   never reads sysfs, so none of it is needed to reach the device.
// - Later changes: it is a snapshot taken before the program starts.
//   `rdmaemu port emu0 1 down`, rdmaemu_set_port_state, a LID the program
//   sets and the address a port really got are not reflected.
// - DEV itself is a directory, not the kernel's symlink into
//   /sys/devices, and DEV/device holds only net/.
#pragma once

#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaemu::cli {

enum class GidType { kIb, kRoceV1, kRoceV2 };

// A port as the library reports it when a device is opened (verbs'
// encodings: state is enum ibv_port_state, width and speed the IBTA codes).
struct PortInfo {
  uint8_t number = 1;
  uint8_t state = 4;       // IBV_PORT_ACTIVE
  uint8_t phys_state = 5;  // LinkUp
  bool ethernet = true;    // link layer: Ethernet (RoCE), else InfiniBand
  uint8_t width = 2;       // 4x
  uint8_t speed = 32;      // EDR
  uint16_t lid = 0;
  uint16_t sm_lid = 0;
  in_addr address{};       // the address the device bound when opened
  bool address_fixed = false;  // the same in every process (not `auto`)
  std::optional<std::array<uint8_t, 16>> gid0;  // GID[0] as queried
  GidType gid_type = GidType::kRoceV2;
};

struct DeviceInfo {
  std::string name;
  uint64_t node_guid = 0;                  // host order, the program's own
  std::optional<uint64_t> sys_image_guid;  // host order
  std::string fw_ver;                      // empty: the device was not opened
  std::vector<PortInfo> ports;
};

// An IPv4 address of a network interface (getifaddrs).
struct Interface {
  std::string name;
  in_addr address{};
  in_addr netmask{};
  bool loopback = false;  // IFF_LOOPBACK
};

// "xxxx:xxxx:xxxx:xxxx", as the kernel prints node_guid.
std::string FormatGuid(uint64_t guid);
// Eight groups of four hex digits, nothing compressed (the kernel's %pI6).
std::string FormatGid(const std::array<uint8_t, 16>& gid);
// "4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)", "0x1f", "RoCE v2".
std::string FormatPortState(uint8_t state);
std::string FormatPhysState(uint8_t phys_state);
std::string FormatRate(uint8_t width, uint8_t speed);
std::string FormatLid(uint16_t lid);
std::string_view GidTypeName(GidType type);

// The interface that holds `address`: the one with that very address, else
// a loopback interface whose subnet holds it (Linux routes all of
// 127.0.0.0/8 to lo, though lo lists only 127.0.0.1/8). nullopt if none.
std::optional<std::string> ChooseNetdev(in_addr address, std::span<const Interface> interfaces);

// One entry of the tree, relative to /sys/class/infiniband. A directory
// comes before what it holds.
struct SysfsNode {
  enum class Kind { kDirectory, kFile, kSymlink };
  Kind kind;
  std::string path;  // "emu0/ports/1/state"
  std::string text;  // a file's contents, a symlink's target
};

// The whole tree for `devices`, each Ethernet port's netdev chosen among
// `interfaces`.
std::vector<SysfsNode> BuildSysfsTree(std::span<const DeviceInfo> devices,
                                      std::span<const Interface> interfaces);

}  // namespace rdmaemu::cli
