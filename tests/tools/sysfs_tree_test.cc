// Unit tests of the /sys/class/infiniband view's files (tools/rdmaemu/
// sysfs_tree.h): the kernel's formats, the netdev chosen for an address, and
// what is written only when it is known.
#include "tools/rdmaemu/sysfs_tree.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace rdmaemu::cli {
namespace {

in_addr Ip(const char* text) {
  in_addr a{};
  EXPECT_EQ(inet_pton(AF_INET, text, &a), 1) << text;
  return a;
}

std::array<uint8_t, 16> V4Mapped(const char* text) {
  std::array<uint8_t, 16> gid{};
  gid[10] = gid[11] = 0xff;
  in_addr a = Ip(text);
  std::memcpy(gid.data() + 12, &a, 4);
  return gid;
}

TEST(Format, Guid) {
  EXPECT_EQ(FormatGuid(0x025e0bfe001be900), "025e:0bfe:001b:e900");
  EXPECT_EQ(FormatGuid(0), "0000:0000:0000:0000");
  EXPECT_EQ(FormatGuid(0xffffffffffffffff), "ffff:ffff:ffff:ffff");
}

// The kernel prints GIDs with %pI6: every group, four digits, no "::".
TEST(Format, Gid) {
  EXPECT_EQ(FormatGid(V4Mapped("127.0.0.1")), "0000:0000:0000:0000:0000:ffff:7f00:0001");
  EXPECT_EQ(FormatGid(V4Mapped("192.0.2.10")), "0000:0000:0000:0000:0000:ffff:c000:020a");
  std::array<uint8_t, 16> link_local{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x5e, 0x0b, 0xfe, 0, 0x1b, 0xe9, 0};
  EXPECT_EQ(FormatGid(link_local), "fe80:0000:0000:0000:025e:0bfe:001b:e900");
}

TEST(Format, PortStates) {
  EXPECT_EQ(FormatPortState(4), "4: ACTIVE");
  EXPECT_EQ(FormatPortState(1), "1: DOWN");
  EXPECT_EQ(FormatPortState(9), "9: UNKNOWN");
  EXPECT_EQ(FormatPhysState(5), "5: LinkUp");
  EXPECT_EQ(FormatPhysState(3), "3: Disabled");
  EXPECT_EQ(FormatPhysState(7), "7: Phy Test");
  EXPECT_EQ(FormatPhysState(8), "8: <unknown>");
}

// As the kernel's rate_show: lanes times the lane rate, a half shown as .5.
TEST(Format, Rate) {
  EXPECT_EQ(FormatRate(2, 32), "100 Gb/sec (4X EDR)");
  EXPECT_EQ(FormatRate(1, 1), "2.5 Gb/sec (1X SDR)");
  EXPECT_EQ(FormatRate(8, 2), "60 Gb/sec (12X DDR)");
  EXPECT_EQ(FormatRate(2, 16), "56 Gb/sec (4X FDR)");
  EXPECT_EQ(FormatRate(1, 16), "14 Gb/sec (1X FDR)");
  EXPECT_EQ(FormatRate(16, 64), "100 Gb/sec (2X HDR)");
  EXPECT_EQ(FormatRate(4, 128), "800 Gb/sec (8X NDR)");
  EXPECT_EQ(FormatRate(2, 8), "40 Gb/sec (4X FDR10)");
}

TEST(Format, LidAndGidType) {
  EXPECT_EQ(FormatLid(0), "0x0");
  EXPECT_EQ(FormatLid(0x107), "0x107");
  EXPECT_EQ(GidTypeName(GidType::kRoceV2), "RoCE v2");
  EXPECT_EQ(GidTypeName(GidType::kRoceV1), "IB/RoCE v1");
  EXPECT_EQ(GidTypeName(GidType::kIb), "IB/RoCE v1");
}

std::vector<Interface> Machine() {
  return {
      {"lo", Ip("127.0.0.1"), Ip("255.0.0.0"), true},
      {"eth0", Ip("192.0.2.2"), Ip("255.255.255.0"), false},
      {"eth1", Ip("10.1.0.7"), Ip("255.255.0.0"), false},
  };
}

TEST(ChooseNetdev, TheInterfaceWithTheAddress) {
  auto m = Machine();
  EXPECT_EQ(ChooseNetdev(Ip("192.0.2.2"), m), "eth0");
  EXPECT_EQ(ChooseNetdev(Ip("10.1.0.7"), m), "eth1");
  EXPECT_EQ(ChooseNetdev(Ip("127.0.0.1"), m), "lo");
}

// All of 127.0.0.0/8 is lo's, though it lists 127.0.0.1 only; another
// address of a non-loopback subnet is not held by its interface.
TEST(ChooseNetdev, LoopbackHoldsItsWholeSubnet) {
  auto m = Machine();
  EXPECT_EQ(ChooseNetdev(Ip("127.0.0.5"), m), "lo");
  EXPECT_EQ(ChooseNetdev(Ip("127.200.1.1"), m), "lo");
  EXPECT_EQ(ChooseNetdev(Ip("192.0.2.99"), m), std::nullopt);
  EXPECT_EQ(ChooseNetdev(Ip("10.0.0.5"), m), std::nullopt);
  EXPECT_EQ(ChooseNetdev(Ip("127.0.0.5"), {}), std::nullopt);
}

TEST(ChooseNetdev, AnExactAddressWinsOverLoopback) {
  std::vector<Interface> m = Machine();
  m.push_back({"dummy0", Ip("127.0.0.9"), Ip("255.255.255.255"), false});
  EXPECT_EQ(ChooseNetdev(Ip("127.0.0.9"), m), "dummy0");
  EXPECT_EQ(ChooseNetdev(Ip("127.0.0.8"), m), "lo");
}

// The tree as a map, path -> (kind, text).
std::map<std::string, SysfsNode> Tree(const std::vector<DeviceInfo>& devices) {
  auto m = Machine();
  std::map<std::string, SysfsNode> out;
  for (auto& n : BuildSysfsTree(devices, m)) {
    EXPECT_FALSE(out.count(n.path)) << "twice: " << n.path;
    // Every entry's parent came before it.
    if (auto slash = n.path.rfind('/'); slash != std::string::npos) {
      auto parent = out.find(n.path.substr(0, slash));
      EXPECT_TRUE(parent != out.end() && parent->second.kind == SysfsNode::Kind::kDirectory)
          << n.path << " before its directory";
    }
    out[n.path] = n;
  }
  return out;
}

std::string Text(const std::map<std::string, SysfsNode>& tree, const std::string& path) {
  auto it = tree.find(path);
  if (it == tree.end()) return "(missing)";
  return it->second.text;
}

PortInfo AutoRocePort() {
  PortInfo p;
  p.address = Ip("127.0.0.3");  // what the probe got; another process gets another
  p.address_fixed = false;
  p.gid0 = V4Mapped("127.0.0.3");
  return p;
}

TEST(BuildSysfsTree, DefaultDevice) {
  DeviceInfo d{"emu0", 0x025e0bfe001be900, 0x025e0bfe001be900, "rdmaemu 0.1", {AutoRocePort()}};
  auto t = Tree({d});
  EXPECT_EQ(Text(t, "emu0/node_type"), "1: CA\n");
  EXPECT_EQ(Text(t, "emu0/node_guid"), "025e:0bfe:001b:e900\n");
  EXPECT_EQ(Text(t, "emu0/sys_image_guid"), "025e:0bfe:001b:e900\n");
  EXPECT_EQ(Text(t, "emu0/fw_ver"), "rdmaemu 0.1\n");
  EXPECT_EQ(Text(t, "emu0/hca_type"), "rdmaemu\n");
  ASSERT_TRUE(t.count("emu0/device/net/lo"));
  EXPECT_EQ(t["emu0/device/net/lo"].kind, SysfsNode::Kind::kSymlink);
  EXPECT_EQ(t["emu0/device/net/lo"].text, "../../../../net/lo");
  EXPECT_EQ(Text(t, "emu0/ports/1/state"), "4: ACTIVE\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/phys_state"), "5: LinkUp\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/link_layer"), "Ethernet\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/rate"), "100 Gb/sec (4X EDR)\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/lid"), "0x0\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/sm_lid"), "0x0\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/gid_attrs/types/0"), "RoCE v2\n");
  EXPECT_EQ(Text(t, "emu0/ports/1/gid_attrs/ndevs/0"), "lo\n");
  // The address is picked when the program opens the device: unknown now.
  EXPECT_TRUE(t.count("emu0/ports/1/gids"));
  EXPECT_FALSE(t.count("emu0/ports/1/gids/0"));
}

TEST(BuildSysfsTree, FixedAddressesAndTwoNetdevs) {
  PortInfo p1 = AutoRocePort();
  p1.address = Ip("127.0.0.5");
  p1.address_fixed = true;
  p1.gid0 = V4Mapped("127.0.0.5");
  PortInfo p2 = p1;
  p2.number = 2;
  p2.address = Ip("192.0.2.2");
  p2.gid0 = V4Mapped("192.0.2.2");
  p2.state = 1;
  p2.phys_state = 3;
  DeviceInfo d{"emu0", 1, 1, "rdmaemu 0.1", {p1, p2}};
  auto t = Tree({d});
  EXPECT_EQ(Text(t, "emu0/ports/1/gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0005\n");
  EXPECT_EQ(Text(t, "emu0/ports/2/gids/0"), "0000:0000:0000:0000:0000:ffff:c000:0202\n");
  EXPECT_EQ(Text(t, "emu0/ports/2/gid_attrs/ndevs/0"), "eth0\n");
  EXPECT_EQ(Text(t, "emu0/ports/2/state"), "1: DOWN\n");
  EXPECT_EQ(Text(t, "emu0/ports/2/phys_state"), "3: Disabled\n");
  EXPECT_TRUE(t.count("emu0/device/net/lo"));
  EXPECT_TRUE(t.count("emu0/device/net/eth0"));
}

// Two ports on one netdev: it is listed once.
TEST(BuildSysfsTree, ANetdevOnce) {
  PortInfo p2 = AutoRocePort();
  p2.number = 2;
  p2.address = Ip("127.0.0.4");
  DeviceInfo d{"emu0", 1, 1, "x", {AutoRocePort(), p2}};
  int links = 0;
  for (const auto& n : BuildSysfsTree(std::vector<DeviceInfo>{d}, Machine())) {
    if (n.kind == SysfsNode::Kind::kSymlink) ++links;
  }
  EXPECT_EQ(links, 1);
}

TEST(BuildSysfsTree, InfiniBandPorts) {
  PortInfo fixed;
  fixed.ethernet = false;
  fixed.address = Ip("127.0.1.7");
  fixed.address_fixed = true;
  fixed.lid = 0x107;
  fixed.sm_lid = 1;
  fixed.gid0 = V4Mapped("127.0.1.7");
  fixed.gid_type = GidType::kIb;
  PortInfo picked = fixed;
  picked.address_fixed = false;
  DeviceInfo a{"emu1", 2, 2, "rdmaemu 0.1", {fixed}};
  DeviceInfo b{"emu2", 3, 3, "rdmaemu 0.1", {picked}};
  auto t = Tree({a, b});
  EXPECT_EQ(Text(t, "emu1/ports/1/link_layer"), "InfiniBand\n");
  EXPECT_EQ(Text(t, "emu1/ports/1/lid"), "0x107\n");
  EXPECT_EQ(Text(t, "emu1/ports/1/sm_lid"), "0x1\n");
  EXPECT_EQ(Text(t, "emu1/ports/1/gid_attrs/types/0"), "IB/RoCE v1\n");
  EXPECT_EQ(Text(t, "emu1/ports/1/gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0107\n");
  // No netdev behind an InfiniBand port.
  EXPECT_FALSE(t.count("emu1/device/net"));
  EXPECT_FALSE(t.count("emu1/ports/1/gid_attrs/ndevs"));
  // Its LID comes from an address not known yet.
  EXPECT_FALSE(t.count("emu2/ports/1/lid"));
  EXPECT_FALSE(t.count("emu2/ports/1/gids/0"));
  EXPECT_EQ(Text(t, "emu2/ports/1/sm_lid"), "0x1\n");
}

// A device the probe could not open: its name and GUID, nothing guessed.
TEST(BuildSysfsTree, UnopenedDevice) {
  DeviceInfo d{"emu3", 0x025e0efe0022c603, std::nullopt, "", {}};
  auto t = Tree({d});
  EXPECT_EQ(Text(t, "emu3/node_guid"), "025e:0efe:0022:c603\n");
  EXPECT_FALSE(t.count("emu3/sys_image_guid"));
  EXPECT_FALSE(t.count("emu3/fw_ver"));
  EXPECT_FALSE(t.count("emu3/ports"));
  EXPECT_FALSE(t.count("emu3/device/net"));
}

TEST(BuildSysfsTree, NoDevicesNoEntries) { EXPECT_TRUE(BuildSysfsTree({}, Machine()).empty()); }

}  // namespace
}  // namespace rdmaemu::cli
