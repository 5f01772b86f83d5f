// The commands that change a port or a device (`port ... lid|sm_lid|rereg|
// pkey|speed|width`, `gid`, `device ... fatal`) through Dispatch, as the
// server runs them, on devices configured for the purpose: emu0 with an
// InfiniBand port 1 and a RoCE port 2, and emu1, which the last test kills.
// Each change is checked where a program would see it (QueryPort,
// QueryPkey, QueryGid) and by the events at a device listener; each refusal
// by its message and by nothing having changed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "emulator/control/command.h"
#include "emulator/device/device.h"

namespace rdmaemu::control {
namespace {

using device::AsyncEvent;
using device::AsyncEventType;

// Before the registry reads its configuration (on the first Acquire).
class ConfigEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = tmp != nullptr ? tmp : "/tmp";
    const std::string path = dir + "/device_commands_test.conf";
    std::ofstream(path) << "device emu0\n"
                           "port link_layer=infiniband\n"
                           "port\n"
                           "device emu1\n"
                           "port link_layer=infiniband\n";
    ::setenv("RDMAEMU_CONFIG", path.c_str(), 1);
    // LIDs are machine-wide: this test's own subnet.
    ::setenv("RDMAEMU_SUBNET_DIR", (dir + "/subnet").c_str(), 1);
  }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new ConfigEnvironment);

class DeviceCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = device::Registry::Get().Acquire(0);
    ASSERT_TRUE(dev.ok()) << dev.status().message();
    dev_ = *dev;
    listener_ = dev_->AddListener([this](const AsyncEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
    });
  }
  void TearDown() override { dev_->RemoveListener(listener_); }

  Reply Run(std::vector<std::string> words) { return Dispatch(words); }
  std::vector<AsyncEvent> Events() {
    std::lock_guard lock(mu_);
    auto out = events_;
    events_.clear();
    return out;
  }
  // Exactly one event, of `type`, on port `port`.
  void ExpectEvent(AsyncEventType type, int port = 1) {
    auto ev = Events();
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, type);
    EXPECT_EQ(ev[0].port, port);
    EXPECT_EQ(ev[0].handle, 0u);
  }

  std::shared_ptr<device::Device> dev_;
  int listener_ = 0;
  std::mutex mu_;
  std::vector<AsyncEvent> events_;
};

TEST_F(DeviceCommandsTest, LidSmLidAndReregisterOnAnInfiniBandPort) {
  Reply r = Run({"port", "emu0", "1", "lid", "0x77"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("emu0 port 1: LID 119 (was ", 0), 0u) << r.out;
  EXPECT_EQ(dev_->QueryPort(1).lid, 0x77);
  ExpectEvent(AsyncEventType::kLidChange);
  r = Run({"port", "emu0", "1", "lid", "119"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 1: LID already 119\n");
  EXPECT_TRUE(Events().empty()) << "no change, no event";

  r = Run({"port", "emu0", "1", "sm_lid", "5"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 1: SM LID 5 (was 1)\n");
  EXPECT_EQ(dev_->QueryPort(1).sm_lid, 5);
  ExpectEvent(AsyncEventType::kSmChange);

  r = Run({"port", "emu0", "1", "rereg"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 1: clients asked to reregister\n");
  ExpectEvent(AsyncEventType::kClientReregister);
}

TEST_F(DeviceCommandsTest, PkeyWritesOneEntry) {
  Reply r = Run({"port", "emu0", "1", "pkey", "1", "0x8001"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 1: P_Key[1] 0x8001 (was 0x0000)\n");
  EXPECT_EQ(*dev_->QueryPkey(1, 1), 0x8001);
  ExpectEvent(AsyncEventType::kPkeyChange);
  r = Run({"port", "emu0", "1", "pkey", "1", "0"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 1: P_Key[1] 0x0000 (was 0x8001)\n");
  ExpectEvent(AsyncEventType::kPkeyChange);
}

TEST_F(DeviceCommandsTest, SpeedAndWidthByTheirIbvDevinfoNames) {
  ASSERT_EQ(dev_->QueryPort(2).speed, 32) << "configured: EDR";
  struct Case {
    std::string action, value;
    uint8_t speed, width;
    std::string out;
  } cases[] = {
      {"speed", "hdr", 64, 2, "emu0 port 2: link 4X HDR (50.0 Gbps per lane) (was 4X EDR (25.0 Gbps per lane))\n"},
      {"speed", "14.0Gbps", 16, 2, "emu0 port 2: link 4X FDR (14.0 Gbps per lane) (was 4X HDR (50.0 Gbps per lane))\n"},
      {"width", "1X", 16, 1, "emu0 port 2: link 1X FDR (14.0 Gbps per lane) (was 4X FDR (14.0 Gbps per lane))\n"},
      {"width", "12x", 16, 8, "emu0 port 2: link 12X FDR (14.0 Gbps per lane) (was 1X FDR (14.0 Gbps per lane))\n"},
      {"speed", "25", 32, 8, "emu0 port 2: link 12X EDR (25.0 Gbps per lane) (was 12X FDR (14.0 Gbps per lane))\n"},
      {"width", "4X", 32, 2, "emu0 port 2: link 4X EDR (25.0 Gbps per lane) (was 12X EDR (25.0 Gbps per lane))\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run({"port", "emu0", "2", c.action, c.value});
    ASSERT_EQ(r.status, 0) << c.value << ": " << r.err;
    EXPECT_EQ(r.out, c.out);
    EXPECT_EQ(dev_->QueryPort(2).speed, c.speed) << c.value;
    EXPECT_EQ(dev_->QueryPort(2).width, c.width) << c.value;
    ExpectEvent(AsyncEventType::kDeviceSpeedChange, 2);
  }
  Reply r = Run({"port", "emu0", "2", "speed", "EDR"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 2: link already 4X EDR (25.0 Gbps per lane)\n");
  EXPECT_TRUE(Events().empty());
}

TEST_F(DeviceCommandsTest, PortRefusesBadValuesNamingThem) {
  const device::PortAttr before1 = dev_->QueryPort(1), before2 = dev_->QueryPort(2);
  struct Case {
    std::vector<std::string> words;
    int status;
    std::string err;  // the whole message, or with a trailing '*' its start
  } cases[] = {
      {{"port", "emu0", "2", "lid", "5"}, 1,
       "port: set LID: emu0 port 2 has the Ethernet link layer (RoCE), which has no LIDs, subnet manager or "
       "P_Key table; configure the port with link_layer=infiniband\n"},
      {{"port", "emu0", "2", "rereg"}, 1, "port: client reregister: emu0 port 2 has the Ethernet link layer*"},
      {{"port", "emu0", "2", "pkey", "0", "0xffff"}, 1, "port: set P_Key: emu0 port 2 has the Ethernet link layer*"},
      {{"port", "emu0", "1", "lid", "0"}, 1, "port: set LID: emu0 port 1: LID 0 is reserved*"},
      {{"port", "emu0", "1", "lid", "0xc000"}, 1, "port: set LID: emu0 port 1: LID 0xc000 is a multicast LID*"},
      {{"port", "emu0", "1", "sm_lid", "0xffff"}, 1, "port: set SM LID: emu0 port 1: SM LID 0xffff is the permissive*"},
      {{"port", "emu0", "1", "lid", "five"}, 2, "port: lid: 'five' is not a number\n"},
      {{"port", "emu0", "1", "lid", "0x10000"}, 2, "port: lid: 0x10000 is larger than 65535\n"},
      {{"port", "emu0", "1", "lid"}, 2, "port: 'lid' takes 1 value(s), got 0\n"},
      {{"port", "emu0", "1", "pkey", "16", "0x8001"}, 1,
       "port: set P_Key: index 16 is outside emu0 port 1's P_Key table (0..15)\n"},
      {{"port", "emu0", "1", "pkey", "1", "0x8000"}, 1, "port: set P_Key: 0x8000 is the invalid P_Key*"},
      {{"port", "emu0", "1", "pkey", "x", "1"}, 2, "port: pkey INDEX: 'x' is not a number\n"},
      {{"port", "emu0", "1", "pkey", "1", "0x18001"}, 2, "port: pkey VALUE: 0x18001 is larger than 65535\n"},
      {{"port", "emu0", "1", "pkey", "1"}, 2, "port: 'pkey' takes 2 value(s), got 1\n"},
      {{"port", "emu0", "1", "rereg", "now"}, 2, "port: 'rereg' takes 0 value(s), got 1\n"},
      {{"port", "emu0", "1", "speed", "xdr"}, 2,
       "port: speed must be sdr, ddr, qdr, fdr10, fdr, edr, hdr or ndr, or a lane rate as ibv_devinfo prints it "
       "(2.5, 5.0, 10.0, 14.0, 25.0, 50.0 or 100.0, optionally followed by Gbps), not 'xdr'\n"},
      {{"port", "emu0", "1", "speed", "25.5"}, 2, "port: speed must be *"},
      {{"port", "emu0", "1", "width", "3X"}, 2,
       "port: width must be 1x, 2x, 4x, 8x or 12x (any case, as ibv_devinfo prints 4X), not '3X'\n"},
      {{"port", "emu0", "1", "width", "4"}, 2, "port: width must be *"},
      {{"port", "emu0", "1", "speed"}, 2, "port: 'speed' takes 1 value(s), got 0\n"},
      {{"port", "emu0", "1", "mtu", "1024"}, 2,
       "port: unknown action 'mtu' (actions: down, up, lid, sm_lid, rereg, pkey, speed, width)\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, c.status) << c.err << r.err;
    if (c.err.back() == '*') {
      EXPECT_EQ(r.err.rfind(c.err.substr(0, c.err.size() - 1), 0), 0u) << r.err;
    } else {
      EXPECT_EQ(r.err, c.err);
    }
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_TRUE(Events().empty());
  const device::PortAttr after1 = dev_->QueryPort(1), after2 = dev_->QueryPort(2);
  EXPECT_EQ(after1.lid, before1.lid);
  EXPECT_EQ(after1.sm_lid, before1.sm_lid);
  EXPECT_EQ(after1.speed, before1.speed);
  EXPECT_EQ(after1.width, before1.width);
  EXPECT_EQ(after2.speed, before2.speed);
  EXPECT_EQ(*dev_->QueryPkey(1, 1), 0);
}

TEST_F(DeviceCommandsTest, GidSetAndClear) {
  Reply r = Run({"gid", "emu0", "2", "3", "set", "fe80:0000:0000:0000:0000:0000:0000:0007"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 2: GID[3] fe80::7 (was empty)\n");
  auto gid = dev_->QueryGid(2, 3);
  ASSERT_TRUE(gid.ok());
  EXPECT_EQ(gid->raw[0], 0xfe);
  EXPECT_EQ(gid->raw[15], 7);
  ExpectEvent(AsyncEventType::kGidChange, 2);

  r = Run({"gid", "emu0", "2", "3", "set", "fe80::7"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 2: GID[3] already fe80::7\n");
  EXPECT_TRUE(Events().empty());

  r = Run({"gid", "emu0", "2", "3", "set", "192.0.2.7"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 2: GID[3] ::ffff:192.0.2.7 (was fe80::7)\n");
  ExpectEvent(AsyncEventType::kGidChange, 2);

  r = Run({"gid", "emu0", "2", "3", "clear"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 2: GID[3] empty (was ::ffff:192.0.2.7)\n");
  EXPECT_EQ(dev_->QueryGid(2, 3).status().code(), ENODATA);
  ExpectEvent(AsyncEventType::kGidChange, 2);
  r = Run({"gid", "emu0", "2", "3", "clear"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 2: GID[3] already empty\n");
  EXPECT_TRUE(Events().empty());
}

TEST_F(DeviceCommandsTest, GidRefusesBadWordsNamingThem) {
  ASSERT_EQ(Run({"gid", "emu0", "1", "4", "set", "fe80::44"}).status, 0);
  Events();
  struct Case {
    std::vector<std::string> words;
    int status;
    std::string err;
  } cases[] = {
      {{"gid", "emu0", "1", "5", "set", "fe80::44"}, 1, "gid: set GID: fe80::44 is already emu0 port 1 GID[4]\n"},
      {{"gid", "emu0", "1", "0", "set", "fe80::45"}, 1, "gid: set GID: emu0 port 1 GID[0] is the port's own address*"},
      {{"gid", "emu0", "1", "0", "clear"}, 1, "gid: clear GID: emu0 port 1 GID[0] is the port's own address*"},
      {{"gid", "emu0", "1", "16", "set", "fe80::45"}, 1,
       "gid: set GID: index 16 is outside the GID table (0..15)\n"},
      {{"gid", "emu0", "1", "5", "set", "ff02::1"}, 1, "gid: set GID: ff02::1 is a multicast GID, not a port address\n"},
      {{"gid", "emu0", "1", "5", "set", "::"}, 1, "gid: set GID: the zero GID is no address; clear the entry instead\n"},
      {{"gid", "emu0", "1", "5", "set", "fe80::zz"}, 2,
       "gid: 'fe80::zz' is not a GID (an IPv6 address such as fe80::1, or an IPv4 address such as 192.0.2.1)\n"},
      {{"gid", "emu0", "1", "5", "set"}, 2, "gid: 'set' takes 1 value(s), got 0\n"},
      {{"gid", "emu0", "1", "5", "clear", "fe80::44"}, 2, "gid: 'clear' takes 0 value(s), got 1\n"},
      {{"gid", "emu0", "1", "5", "add", "fe80::46"}, 2, "gid: unknown action 'add' (actions: set, clear)\n"},
      {{"gid", "emu0", "1", "five", "clear"}, 2, "gid: INDEX: 'five' is not a number\n"},
      {{"gid", "emu0", "3", "5", "clear"}, 1, "gid: emu0 has no port '3' (ports are 1..2)\n"},
      {{"gid", "emu7", "1", "5", "clear"}, 1, "gid: emu7 is not open in this process*"},
      {{"gid", "emu0", "1", "5"}, 2, "gid: expected DEV PORT INDEX set GID | clear\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, c.status) << c.err << r.err;
    if (c.err.back() == '*') {
      EXPECT_EQ(r.err.rfind(c.err.substr(0, c.err.size() - 1), 0), 0u) << r.err;
    } else {
      EXPECT_EQ(r.err, c.err);
    }
  }
  EXPECT_TRUE(Events().empty());
  EXPECT_EQ(dev_->QueryGid(1, 5).status().code(), ENODATA);
  ASSERT_EQ(Run({"gid", "emu0", "1", "4", "clear"}).status, 0);
}

// Last: emu1 stays dead.
TEST_F(DeviceCommandsTest, DeviceFatalKillsTheDeviceForGood) {
  auto dev = device::Registry::Get().Acquire(1);
  ASSERT_TRUE(dev.ok()) << dev.status().message();
  std::vector<AsyncEvent> events;
  std::mutex mu;
  int id = (*dev)->AddListener([&](const AsyncEvent& e) {
    std::lock_guard lock(mu);
    events.push_back(e);
  });
  for (auto [words, err] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"device", "emu1"}, "device: expected DEV fatal\n"},
           {{"device", "emu1", "explode"}, "device: unknown action 'explode' (actions: fatal)\n"},
           {{"device", "emu1", "fatal", "now"}, "device: unexpected argument 'now'\n"}}) {
    Reply r = Run(words);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.err, err);
  }
  Reply r = Run({"device", "emu9", "fatal"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "device: emu9 is not open in this process (open: emu0, emu1)\n");
  EXPECT_FALSE((*dev)->dead()) << "refusals change nothing";

  r = Run({"device", "emu1", "fatal"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu1: fatal error: every QP is in ERR and DEVICE_FATAL was raised\n");
  EXPECT_TRUE((*dev)->dead());
  EXPECT_FALSE(dev_->dead()) << "emu0 lives on";
  r = Run({"device", "emu1", "fatal"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "emu1: already dead after a fatal error\n");
  r = Run({"port", "emu1", "1", "lid", "9"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("fatal"), std::string::npos) << r.err;
  (*dev)->RemoveListener(id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, AsyncEventType::kDeviceFatal);
  EXPECT_EQ(events[0].port, 0);
  EXPECT_TRUE(Events().empty()) << "emu0's contexts get nothing";
}

}  // namespace
}  // namespace rdmaemu::control
