// Tests of the device configuration: defaults, the file format (every key),
// errors that name file:line and the setting, and the environment overrides.
#include "emulator/device/config.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rdmaemu::device {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Ip(const in_addr& a) {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

TEST(DefaultConfigTest, OneRoceDeviceEmu0WithOneActivePortAtMtu4096) {
  Config c = DefaultConfig();
  ASSERT_EQ(c.devices.size(), 1u);
  EXPECT_EQ(c.devices[0].name, "emu0");
  ASSERT_EQ(c.devices[0].ports.size(), 1u);
  const PortConfig& p = c.devices[0].ports[0];
  EXPECT_FALSE(p.address.has_value());
  EXPECT_EQ(p.udp_port, 4791);
  EXPECT_EQ(p.link_layer, LinkLayer::kEthernet);
  EXPECT_EQ(p.max_mtu, 4096u);
  EXPECT_EQ(p.active_mtu, 4096u);
  EXPECT_TRUE(p.active);
  EXPECT_EQ(p.lid, 0);
  EXPECT_EQ(p.width, 2);   // 4x
  EXPECT_EQ(p.speed, 32);  // EDR
}

TEST(ParseConfigTest, ParsesEveryPortKey) {
  auto c = ParseConfig(
      "device ib0\n"
      "port address=10.1.2.3 udp_port=5000 link_layer=infiniband mtu=2048 active_mtu=1024 "
      "width=12x speed=hdr lid=7 state=down\n",
      "test.conf");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->devices[0].name, "ib0");
  ASSERT_EQ(c->devices[0].ports.size(), 1u);
  const PortConfig& p = c->devices[0].ports[0];
  ASSERT_TRUE(p.address.has_value());
  EXPECT_EQ(Ip(*p.address), "10.1.2.3");
  EXPECT_EQ(p.udp_port, 5000);
  EXPECT_EQ(p.link_layer, LinkLayer::kInfiniBand);
  EXPECT_EQ(p.max_mtu, 2048u);
  EXPECT_EQ(p.active_mtu, 1024u);
  EXPECT_EQ(p.width, 8);
  EXPECT_EQ(p.speed, 64);
  EXPECT_EQ(p.lid, 7);
  EXPECT_FALSE(p.active);
}

TEST(ParseConfigTest, PortWithoutSettingsTakesTheDefaults) {
  auto c = ParseConfig("device d\nport\n", "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const PortConfig& p = c->devices[0].ports[0];
  const PortConfig d = DefaultConfig().devices[0].ports[0];
  EXPECT_FALSE(p.address.has_value());
  EXPECT_EQ(p.udp_port, d.udp_port);
  EXPECT_EQ(p.link_layer, d.link_layer);
  EXPECT_EQ(p.max_mtu, d.max_mtu);
  EXPECT_EQ(p.active_mtu, d.active_mtu);
  EXPECT_EQ(p.width, d.width);
  EXPECT_EQ(p.speed, d.speed);
  EXPECT_EQ(p.lid, 0);
  EXPECT_TRUE(p.active);
}

TEST(ParseConfigTest, ValuesAreCaseInsensitiveWhereNamed) {
  auto c = ParseConfig("device d\nport link_layer=Ethernet width=4X speed=EDR state=ACTIVE\n", "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const PortConfig& p = c->devices[0].ports[0];
  EXPECT_EQ(p.link_layer, LinkLayer::kEthernet);
  EXPECT_EQ(p.width, 2);
  EXPECT_EQ(p.speed, 32);
  EXPECT_TRUE(p.active);
}

TEST(ParseConfigTest, AddressAutoResetsAnEarlierAddress) {
  auto c = ParseConfig("device d\nport address=10.0.0.1 address=auto\n", "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->devices[0].ports[0].address.has_value());
}

TEST(ParseConfigTest, MtuSetsBothMaxAndActive) {
  auto c = ParseConfig("device d\nport mtu=1024\n", "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->devices[0].ports[0].max_mtu, 1024u);
  EXPECT_EQ(c->devices[0].ports[0].active_mtu, 1024u);
}

TEST(ParseConfigTest, CommentsBlankLinesAndWhitespaceAreIgnored) {
  auto c = ParseConfig(
      "# a comment\n"
      "\n"
      "   device   a   # trailing comment\n"
      "\tport mtu=512   \n"
      "   \n"
      "port   udp_port=6000\n"
      "device b\n"
      "port\n",
      "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->devices.size(), 2u);
  EXPECT_EQ(c->devices[0].name, "a");
  ASSERT_EQ(c->devices[0].ports.size(), 2u);
  EXPECT_EQ(c->devices[0].ports[0].max_mtu, 512u);
  EXPECT_EQ(c->devices[0].ports[1].udp_port, 6000);
  EXPECT_EQ(c->devices[1].name, "b");
  EXPECT_EQ(c->devices[1].ports.size(), 1u);
}

TEST(ParseConfigTest, LidIsAcceptedOnInfiniBand) {
  auto c = ParseConfig("device d\nport link_layer=infiniband lid=49151\n", "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->devices[0].ports[0].lid, 0xbfff);
}

TEST(ParseConfigTest, TwoPortsAreAllowed) {
  auto c = ParseConfig("device d\nport\nport\n", "x");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->devices[0].ports.size(), 2u);
}

// Each error names origin:line and the setting (or statement) at fault.
struct BadLine {
  const char* text;     // the whole file
  int line;             // where the error is
  const char* mention;  // what the message must name
};

class ParseConfigErrorTest : public ::testing::TestWithParam<BadLine> {};

TEST_P(ParseConfigErrorTest, NamesFileLineAndSetting) {
  const BadLine& b = GetParam();
  auto c = ParseConfig(b.text, "/etc/rdmaemu.conf");
  ASSERT_FALSE(c.ok()) << b.text;
  EXPECT_EQ(c.status().code(), EINVAL);
  EXPECT_THAT(c.status().message(), StartsWith("/etc/rdmaemu.conf:" + std::to_string(b.line) + ": "));
  EXPECT_THAT(c.status().message(), HasSubstr(b.mention));
}

INSTANTIATE_TEST_SUITE_P(
    EveryError, ParseConfigErrorTest,
    ::testing::Values(
        BadLine{"device d\nport mtu=1000\n", 2, "mtu"},
        BadLine{"device d\nport mtu=8192\n", 2, "mtu"},
        BadLine{"device d\nport active_mtu=3\n", 2, "mtu"},
        BadLine{"device d\nport mtu=2048 active_mtu=4096\n", 2, "active_mtu"},
        BadLine{"device d\nport width=3x\n", 2, "width"},
        BadLine{"device d\nport speed=fast\n", 2, "speed"},
        BadLine{"device d\nport link_layer=wifi\n", 2, "link_layer"},
        BadLine{"device d\nport state=up\n", 2, "state"},
        BadLine{"device d\nport udp_port=0\n", 2, "udp_port"},
        BadLine{"device d\nport udp_port=65536\n", 2, "udp_port"},
        BadLine{"device d\nport udp_port=-1\n", 2, "udp_port"},
        BadLine{"device d\nport udp_port=12ab\n", 2, "udp_port"},
        BadLine{"device d\nport udp_port=\n", 2, "udp_port"},
        BadLine{"device d\nport link_layer=infiniband lid=49152\n", 2, "lid"},
        BadLine{"device d\nport address=10.0.0\n", 2, "address"},
        BadLine{"device d\nport address=::1\n", 2, "address"},
        BadLine{"device d\nport colour=blue\n", 2, "colour"},
        BadLine{"device d\nport mtu\n", 2, "mtu"},
        BadLine{"device d\n\n# c\nport lid=5\n", 4, "lid"},
        BadLine{"device d\nport link_layer=ethernet lid=1\n", 2, "lid"},
        BadLine{"device d\nport\ndevice d\nport\n", 3, "'d'"},
        BadLine{"port\ndevice d\n", 1, "port"},
        BadLine{"device d\nport\nport\nport\n", 4, "2 ports"},
        BadLine{"device\n", 1, "device"},
        BadLine{"device a b\n", 1, "device"},
        BadLine{"device bad/name\n", 1, "device"},
        BadLine{"interface eth0\n", 1, "interface"}));

TEST(ParseConfigTest, LidOnEthernetIsRejectedWithAnExplanation) {
  auto c = ParseConfig("device d\nport lid=5\n", "f");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), EINVAL);
  EXPECT_THAT(c.status().message(), HasSubstr("infiniband"));
}

TEST(ParseConfigTest, EmptyFileHasNoDevice) {
  auto c = ParseConfig("# nothing\n", "empty.conf");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), EINVAL);
  EXPECT_THAT(c.status().message(), StartsWith("empty.conf: "));
  EXPECT_THAT(c.status().message(), HasSubstr("device"));
}

TEST(ParseConfigTest, DeviceWithoutPortIsAnError) {
  auto c = ParseConfig("device a\nport\ndevice lonely\n", "f.conf");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), StartsWith("f.conf: "));
  EXPECT_THAT(c.status().message(), HasSubstr("lonely"));
}

TEST(ValueParsersTest, MtuAcceptsOnlyIbMtus) {
  for (uint32_t m : {256u, 512u, 1024u, 2048u, 4096u}) {
    auto r = ParseMtu(std::to_string(m));
    ASSERT_TRUE(r.ok()) << m;
    EXPECT_EQ(*r, m);
  }
  for (const char* bad : {"0", "128", "1500", "4097", "9000", "", "abc", "2048 "}) {
    EXPECT_FALSE(ParseMtu(bad).ok()) << bad;
  }
}

TEST(ValueParsersTest, WidthAndSpeedUseIbtaEncodingsAndRoundTripThroughNames) {
  const std::pair<const char*, uint8_t> widths[] = {{"1x", 1}, {"2x", 16}, {"4x", 2}, {"8x", 4}, {"12x", 8}};
  for (auto [name, value] : widths) {
    auto r = ParseWidth(name);
    ASSERT_TRUE(r.ok()) << name;
    EXPECT_EQ(*r, value);
    EXPECT_EQ(WidthName(value), name);
  }
  const std::pair<const char*, uint8_t> speeds[] = {{"sdr", 1},  {"ddr", 2},  {"qdr", 4},  {"fdr10", 8},
                                                    {"fdr", 16}, {"edr", 32}, {"hdr", 64}, {"ndr", 128}};
  for (auto [name, value] : speeds) {
    auto r = ParseSpeed(name);
    ASSERT_TRUE(r.ok()) << name;
    EXPECT_EQ(*r, value);
    EXPECT_EQ(SpeedName(value), name);
  }
  EXPECT_FALSE(ParseWidth("16x").ok());
  EXPECT_FALSE(ParseSpeed("xdr").ok());
  // As ibv_devinfo -v prints them: "active_width: 4X", "active_speed: 25.0 Gbps".
  EXPECT_EQ(*ParseWidth("12X"), 8);
  EXPECT_EQ(*ParseSpeed("EDR"), 32);
  const std::pair<const char*, uint8_t> rates[] = {{"2.5", 1},      {"5.0", 2},      {"10.0", 4},  {"14", 16},
                                                   {"25.0Gbps", 32}, {"50gbps", 64}, {"100.0 Gbps", 128}};
  for (auto [rate, value] : rates) {
    auto r = ParseSpeed(rate);
    ASSERT_TRUE(r.ok()) << rate << ": " << r.status().message();
    EXPECT_EQ(*r, value) << rate;
  }
  EXPECT_EQ(SpeedRate(32), "25.0");
  EXPECT_EQ(SpeedRate(8), "10.0") << "FDR10 prints as 10.0 Gbps, like QDR";
  for (const char* bad : {"4", "2", "25.5", "gbps", "", "1X", "fdr 10"}) {
    auto r = ParseSpeed(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos);
    }
  }
  EXPECT_FALSE(ParseWidth("4").ok()) << "a bare number could be an encoding (2 is 4x): refused";
  EXPECT_EQ(WidthName(3), "invalid");
  EXPECT_EQ(SpeedName(0), "invalid");
}

// The environment: each test sets what it needs and clears it afterwards.
class EnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    unsetenv("RDMAEMU_CONFIG");
    unsetenv("RDMAEMU_ADDRESS");
    unsetenv("RDMAEMU_UDP_PORT");
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const char* dir = std::getenv("TEST_TMPDIR");
    std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(EnvironmentTest, NothingSetGivesTheDefault) {
  auto c = LoadConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->devices[0].name, "emu0");
  EXPECT_FALSE(c->devices[0].ports[0].address.has_value());
  EXPECT_EQ(c->devices[0].ports[0].udp_port, 4791);
}

TEST_F(EnvironmentTest, EmptyVariablesAreIgnored) {
  setenv("RDMAEMU_CONFIG", "", 1);
  setenv("RDMAEMU_ADDRESS", "", 1);
  setenv("RDMAEMU_UDP_PORT", "", 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->devices[0].name, "emu0");
  EXPECT_EQ(c->devices[0].ports[0].udp_port, 4791);
}

TEST_F(EnvironmentTest, AddressSetsTheFirstPortOfTheFirstDevice) {
  setenv("RDMAEMU_ADDRESS", "127.5.6.7", 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->devices[0].ports[0].address.has_value());
  EXPECT_EQ(Ip(*c->devices[0].ports[0].address), "127.5.6.7");
}

TEST_F(EnvironmentTest, BadAddressNamesTheVariable) {
  setenv("RDMAEMU_ADDRESS", "not-an-ip", 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), EINVAL);
  EXPECT_THAT(c.status().message(), HasSubstr("RDMAEMU_ADDRESS"));
  EXPECT_THAT(c.status().message(), HasSubstr("not-an-ip"));
}

TEST_F(EnvironmentTest, UdpPortSetsEveryPortOfEveryDevice) {
  std::string path = WriteFile("two.conf", "device a\nport\nport\ndevice b\nport udp_port=7000\n");
  setenv("RDMAEMU_CONFIG", path.c_str(), 1);
  setenv("RDMAEMU_UDP_PORT", "14791", 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->devices.size(), 2u);
  for (const auto& d : c->devices) {
    for (const auto& p : d.ports) EXPECT_EQ(p.udp_port, 14791) << d.name;
  }
}

TEST_F(EnvironmentTest, BadUdpPortNamesTheVariable) {
  for (const char* bad : {"0", "65536", "x"}) {
    setenv("RDMAEMU_UDP_PORT", bad, 1);
    auto c = LoadConfigFromEnvironment();
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), EINVAL);
    EXPECT_THAT(c.status().message(), HasSubstr("RDMAEMU_UDP_PORT")) << bad;
  }
}

TEST_F(EnvironmentTest, ConfigFileIsReadAndAddressOverridesItsFirstPort) {
  std::string path = WriteFile("good.conf",
                               "device alpha\nport address=10.9.9.9 mtu=1024\n"
                               "device beta\nport address=10.8.8.8\n");
  setenv("RDMAEMU_CONFIG", path.c_str(), 1);
  setenv("RDMAEMU_ADDRESS", "127.0.0.9", 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->devices.size(), 2u);
  EXPECT_EQ(c->devices[0].name, "alpha");
  EXPECT_EQ(Ip(*c->devices[0].ports[0].address), "127.0.0.9");
  EXPECT_EQ(c->devices[0].ports[0].max_mtu, 1024u);
  EXPECT_EQ(c->devices[1].name, "beta");
  EXPECT_EQ(Ip(*c->devices[1].ports[0].address), "10.8.8.8");
}

TEST_F(EnvironmentTest, ConfigFileErrorsNameThePathAndLine) {
  std::string path = WriteFile("bad.conf", "device a\nport\nport width=7x\n");
  setenv("RDMAEMU_CONFIG", path.c_str(), 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), EINVAL);
  EXPECT_THAT(c.status().message(), StartsWith(path + ":3: "));
  EXPECT_THAT(c.status().message(), HasSubstr("width"));
}

TEST_F(EnvironmentTest, MissingConfigFileIsAnError) {
  setenv("RDMAEMU_CONFIG", "/nonexistent/rdmaemu.conf", 1);
  auto c = LoadConfigFromEnvironment();
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("RDMAEMU_CONFIG"));
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/rdmaemu.conf"));
}

}  // namespace
}  // namespace rdmaemu::device
