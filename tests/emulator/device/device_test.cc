// Tests of Device (ports, GID table, listeners) and the process Registry.
#include "emulator/device/device.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <future>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "emulator/device/attributes.h"
#include "emulator/device/subnet.h"

namespace rdmaemu::device {
namespace {

using ::testing::HasSubstr;

DeviceConfig OnePort(const char* name = "t0") { return DeviceConfig{name, {PortConfig{}}}; }

std::shared_ptr<Device> OpenOrDie(const DeviceConfig& config, int index = 0) {
  auto dev = Device::Open(config, index);
  EXPECT_TRUE(dev.ok()) << dev.status().message();
  return dev.ok() ? *dev : nullptr;
}

TEST(GidTest, FromIpv4IsTheIpv4MappedAddress) {
  in_addr a{};
  inet_pton(AF_INET, "127.1.2.3", &a);
  Gid g = Gid::FromIpv4(a);
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 1, 2, 3};
  EXPECT_EQ(0, std::memcmp(g.raw.data(), want, 16));
  EXPECT_FALSE(g.empty());
  EXPECT_TRUE(Gid{}.empty());
}

TEST(DeviceTest, Gid0IsTheIpv4MappedBoundAddress) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  sockaddr_in bound = dev->PortAddress(1);
  EXPECT_EQ(ntohl(bound.sin_addr.s_addr) >> 24, 127u) << "auto address is in 127.0.0.0/8";
  EXPECT_EQ(ntohs(bound.sin_port), 4791);
  auto gid = dev->QueryGid(1, 0);
  ASSERT_TRUE(gid.ok()) << gid.status().message();
  EXPECT_EQ(*gid, Gid::FromIpv4(bound.sin_addr));
  EXPECT_EQ(gid->raw[10], 0xff);
  EXPECT_EQ(gid->raw[11], 0xff);
  EXPECT_EQ(gid->raw[12], 127);
}

TEST(DeviceTest, EmptyGidIndexIsEnodataOutOfRangeIsEinval) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  for (int i = 1; i < kGidTableLength; ++i) {
    auto g = dev->QueryGid(1, i);
    ASSERT_FALSE(g.ok()) << i;
    EXPECT_EQ(g.status().code(), ENODATA) << i;
  }
  for (int i : {-1, kGidTableLength, 1000}) {
    auto g = dev->QueryGid(1, i);
    ASSERT_FALSE(g.ok()) << i;
    EXPECT_EQ(g.status().code(), EINVAL) << i;
  }
  for (int port : {0, 2, -1}) {
    auto g = dev->QueryGid(port, 0);
    ASSERT_FALSE(g.ok()) << port;
    EXPECT_EQ(g.status().code(), EINVAL) << port;
  }
}

TEST(DeviceTest, FindGidFindsIndexZeroAndNothingElse) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  auto g0 = dev->QueryGid(1, 0);
  ASSERT_TRUE(g0.ok());
  auto found = dev->FindGid(1, *g0);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 0);
  EXPECT_EQ(dev->FindGid(1, Gid{}).status().code(), ENOENT) << "the empty GID is never found";
  in_addr other{};
  inet_pton(AF_INET, "10.255.255.254", &other);
  EXPECT_EQ(dev->FindGid(1, Gid::FromIpv4(other)).status().code(), ENOENT);
  EXPECT_EQ(dev->FindGid(2, *g0).status().code(), EINVAL);
}

TEST(DeviceTest, IdentityAndPorts) {
  auto dev = OpenOrDie(OnePort("idtest"), 3);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->name(), "idtest");
  EXPECT_EQ(dev->index(), 3);
  EXPECT_NE(dev->node_guid(), 0u);
  EXPECT_EQ(dev->node_guid(), Registry::GuidFor("idtest", 3));
  EXPECT_EQ(dev->num_ports(), 1);
  EXPECT_FALSE(dev->ValidPort(0));
  EXPECT_TRUE(dev->ValidPort(1));
  EXPECT_FALSE(dev->ValidPort(2));
}

TEST(DeviceTest, PortAttributesComeFromTheConfiguration) {
  PortConfig roce;  // defaults
  PortConfig ib;
  ib.link_layer = LinkLayer::kInfiniBand;
  ib.lid = 9;
  ib.max_mtu = 2048;
  ib.active_mtu = 1024;
  ib.width = 1;
  ib.speed = 4;
  ib.active = false;
  auto dev = OpenOrDie(DeviceConfig{"two", {roce, ib}});
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->num_ports(), 2);

  PortAttr a = dev->QueryPort(1);
  EXPECT_EQ(a.state, PortState::kActive);
  EXPECT_EQ(a.link_layer, LinkLayer::kEthernet);
  EXPECT_EQ(a.max_mtu, 4096u);
  EXPECT_EQ(a.active_mtu, 4096u);
  EXPECT_EQ(a.lid, 0);
  EXPECT_EQ(a.sm_lid, 0);

  PortAttr b = dev->QueryPort(2);
  EXPECT_EQ(b.state, PortState::kDown);
  EXPECT_EQ(b.link_layer, LinkLayer::kInfiniBand);
  EXPECT_EQ(b.max_mtu, 2048u);
  EXPECT_EQ(b.active_mtu, 1024u);
  EXPECT_EQ(b.width, 1);
  EXPECT_EQ(b.speed, 4);
  EXPECT_EQ(b.lid, 9);
  EXPECT_EQ(b.sm_lid, 1);

  // Each port has its own socket, address and GID 0.
  EXPECT_NE(dev->PortAddress(1).sin_addr.s_addr, dev->PortAddress(2).sin_addr.s_addr);
  auto g1 = dev->QueryGid(1, 0);
  auto g2 = dev->QueryGid(2, 0);
  ASSERT_TRUE(g1.ok());
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(*g2, Gid::FromIpv4(dev->PortAddress(2).sin_addr));
  EXPECT_NE(*g1, *g2);
}

TEST(DeviceTest, ConfiguredUdpPortIsBound) {
  DeviceConfig c = OnePort();
  c.ports[0].udp_port = 24791;  // auto address: another holder of it moves us on
  auto dev = OpenOrDie(c);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(ntohs(dev->PortAddress(1).sin_port), 24791);
}

TEST(DeviceTest, OpenFailureNamesDeviceAndPort) {
  DeviceConfig c = OnePort("nowhere");
  in_addr a{};
  inet_pton(AF_INET, "192.0.2.77", &a);  // TEST-NET-1: not an address of this host
  c.ports[0].address = a;
  auto dev = Device::Open(c, 0);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().code(), 0);
  EXPECT_THAT(dev.status().message(), HasSubstr("nowhere port 1"));
}

TEST(DeviceTest, ListenersReceiveRaisedEventsAndNoneAfterRemoval) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  std::vector<AsyncEvent> a, b;
  int ia = dev->AddListener([&](const AsyncEvent& e) { a.push_back(e); });
  int ib = dev->AddListener([&](const AsyncEvent& e) { b.push_back(e); });
  EXPECT_NE(ia, ib);

  dev->Raise(AsyncEvent{AsyncEventType::kPortErr, 0, 1});
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].type, AsyncEventType::kPortErr);
  EXPECT_EQ(a[0].port, 1);
  EXPECT_EQ(b[0].type, AsyncEventType::kPortErr);

  dev->RemoveListener(ia);
  dev->Raise(AsyncEvent{AsyncEventType::kCqErr, 0x1234, 0});
  EXPECT_EQ(a.size(), 1u) << "a removed listener is never called again";
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].type, AsyncEventType::kCqErr);
  EXPECT_EQ(b[1].handle, 0x1234u);

  dev->RemoveListener(ib);
  dev->Raise(AsyncEvent{AsyncEventType::kPortActive, 0, 1});
  EXPECT_EQ(b.size(), 2u);
  dev->RemoveListener(12345);  // unknown id: harmless
}

TEST(DeviceTest, RemoveListenerWaitsForADeliveryInProgress) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> release_f = release.get_future().share();
  std::atomic<bool> finished{false};
  int id = dev->AddListener([&](const AsyncEvent&) {
    entered.set_value();
    release_f.wait();
    finished = true;
  });
  std::thread raiser([&] { dev->Raise(AsyncEvent{AsyncEventType::kDeviceFatal, 0, 0}); });
  entered.get_future().wait();
  std::atomic<bool> removed{false};
  std::thread remover([&] {
    dev->RemoveListener(id);
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(removed) << "RemoveListener returned while its listener was running";
  release.set_value();
  remover.join();
  raiser.join();
  EXPECT_TRUE(finished);
  EXPECT_TRUE(removed);
}

// --- Port mutators: what a subnet manager, a cable or the firmware does ---

DeviceConfig IbPort(const char* name = "ib0") {
  PortConfig p;
  p.link_layer = LinkLayer::kInfiniBand;
  return DeviceConfig{name, {p}};
}

// Records every event a device raises.
struct Recorder {
  explicit Recorder(Device& d) : dev(d) { id = d.AddListener([this](const AsyncEvent& e) { events.push_back(e); }); }
  ~Recorder() { dev.RemoveListener(id); }
  Device& dev;
  int id;
  std::vector<AsyncEvent> events;
};

class MutatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A private subnet directory: LID records of other tests never collide.
    dir_ = ::testing::TempDir() + "/subnet-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::setenv("RDMAEMU_SUBNET_DIR", dir_.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("RDMAEMU_SUBNET_DIR"); }
  std::string dir_;
};

TEST_F(MutatorTest, LidChangeRaisesLidChangeAndShowsInQueryPort) {
  auto dev = OpenOrDie(IbPort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  ASSERT_TRUE(dev->SetLid(1, 0x123).ok());
  EXPECT_EQ(dev->QueryPort(1).lid, 0x123);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, AsyncEventType::kLidChange);
  EXPECT_EQ(r.events[0].port, 1);
  ASSERT_TRUE(dev->SetLid(1, 0x123).ok());
  EXPECT_EQ(r.events.size(), 1u) << "no change, no event";
}

TEST_F(MutatorTest, InvalidLidsAreRefusedNamingTheValue) {
  auto dev = OpenOrDie(IbPort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  const uint16_t before = dev->QueryPort(1).lid;
  for (uint16_t bad : {0x0, 0xc000, 0xfffe, 0xffff}) {
    Status s = dev->SetLid(1, bad);
    EXPECT_EQ(s.code(), EINVAL) << bad;
    EXPECT_THAT(s.message(), HasSubstr("LID")) << bad;
    EXPECT_EQ(dev->SetSmLid(1, bad).code(), EINVAL) << bad;
  }
  EXPECT_THAT(dev->SetLid(1, 0xc001).message(), HasSubstr("0xc001"));
  EXPECT_THAT(dev->SetLid(1, 0xc001).message(), HasSubstr("multicast"));
  EXPECT_EQ(dev->SetLid(2, 5).code(), EINVAL) << "no port 2";
  EXPECT_EQ(dev->QueryPort(1).lid, before);
  EXPECT_TRUE(r.events.empty());
  EXPECT_TRUE(dev->SetLid(1, 0xbfff).ok()) << "the highest unicast LID";
}

TEST_F(MutatorTest, SmLidAndClientReregisterRaiseTheirEvents) {
  auto dev = OpenOrDie(IbPort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  ASSERT_TRUE(dev->SetSmLid(1, 7).ok());
  EXPECT_EQ(dev->QueryPort(1).sm_lid, 7);
  ASSERT_TRUE(dev->ClientReregister(1).ok());
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].type, AsyncEventType::kSmChange);
  EXPECT_EQ(r.events[1].type, AsyncEventType::kClientReregister);
  EXPECT_EQ(r.events[1].port, 1);
}

TEST_F(MutatorTest, SubnetManagerEventsAreRefusedOnRocePorts) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  for (Status s : {dev->SetLid(1, 5), dev->SetSmLid(1, 5), dev->ClientReregister(1), dev->SetPkey(1, 0, 0x8001)}) {
    EXPECT_EQ(s.code(), EINVAL);
    EXPECT_THAT(s.message(), HasSubstr("link_layer=infiniband"));
  }
  EXPECT_TRUE(r.events.empty());
  EXPECT_EQ(dev->QueryPort(1).lid, 0);
  EXPECT_EQ(dev->QueryPort(1).pkey_table_len, 1);
  auto pkey = dev->QueryPkey(1, 0);
  ASSERT_TRUE(pkey.ok());
  EXPECT_EQ(*pkey, 0xffff);
}

TEST_F(MutatorTest, PkeyTableEntriesChangeWithPkeyChange) {
  auto dev = OpenOrDie(IbPort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  EXPECT_EQ(dev->QueryPort(1).pkey_table_len, kMaxPkeys);
  EXPECT_EQ(*dev->QueryPkey(1, 0), 0xffff);
  EXPECT_EQ(*dev->QueryPkey(1, 3), 0) << "empty";
  ASSERT_TRUE(dev->SetPkey(1, 3, 0x8005).ok());
  EXPECT_EQ(*dev->QueryPkey(1, 3), 0x8005);
  EXPECT_EQ(dev->PkeyAt(1, 3), 0x8005);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, AsyncEventType::kPkeyChange);
  EXPECT_EQ(r.events[0].port, 1);
  EXPECT_EQ(dev->SetPkey(1, kMaxPkeys, 0x8001).code(), EINVAL);
  EXPECT_EQ(dev->SetPkey(1, -1, 0x8001).code(), EINVAL);
  Status s = dev->SetPkey(1, 1, 0x8000);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_THAT(s.message(), HasSubstr("0x8000"));
  ASSERT_TRUE(dev->SetPkey(1, 3, 0).ok()) << "0 empties an entry";
  EXPECT_EQ(r.events.size(), 2u);
}

TEST(PkeyTest, MatchingFollowsIba10_9_3) {
  EXPECT_TRUE(PkeysMatch(0xffff, 0xffff));
  EXPECT_TRUE(PkeysMatch(0xffff, 0x7fff)) << "full and limited member of one partition";
  EXPECT_FALSE(PkeysMatch(0x7fff, 0x7fff)) << "two limited members";
  EXPECT_FALSE(PkeysMatch(0xffff, 0x8001)) << "different partitions";
  EXPECT_FALSE(PkeysMatch(0x8000, 0x8000)) << "the invalid P_Key matches nothing";
  EXPECT_FALSE(PkeysMatch(0, 0));
}

TEST_F(MutatorTest, LinkSpeedAndWidthChangeWithDeviceSpeedChange) {
  auto dev = OpenOrDie(OnePort());  // both link layers: RoCE here
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  ASSERT_TRUE(dev->SetLinkSpeed(1, 64, 1).ok());  // 1x HDR
  EXPECT_EQ(dev->QueryPort(1).speed, 64);
  EXPECT_EQ(dev->QueryPort(1).width, 1);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, AsyncEventType::kDeviceSpeedChange);
  EXPECT_EQ(r.events[0].port, 1);
  for (uint8_t bad : {0, 3, 5, 255}) {
    Status s = dev->SetLinkSpeed(1, bad, 2);
    EXPECT_EQ(s.code(), EINVAL) << int{bad};
    EXPECT_THAT(s.message(), HasSubstr(std::to_string(bad)));
  }
  for (uint8_t bad : {0, 3, 32}) EXPECT_EQ(dev->SetLinkSpeed(1, 32, bad).code(), EINVAL) << int{bad};
  ASSERT_TRUE(dev->SetLinkSpeed(1, 64, 1).ok());
  EXPECT_EQ(r.events.size(), 1u) << "no change, no event";
}

TEST_F(MutatorTest, GidEntriesAreSetAndClearedWithGidChangeButNotEntryZero) {
  auto dev = OpenOrDie(OnePort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  Gid g0 = *dev->QueryGid(1, 0);
  in_addr a{};
  inet_pton(AF_INET, "10.1.2.3", &a);
  Gid extra = Gid::FromIpv4(a);
  ASSERT_TRUE(dev->SetGid(1, 2, extra).ok());
  EXPECT_EQ(*dev->QueryGid(1, 2), extra);
  EXPECT_EQ(*dev->FindGid(1, extra), 2);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, AsyncEventType::kGidChange);
  EXPECT_EQ(r.events[0].port, 1);
  EXPECT_EQ(dev->SetGid(1, 3, extra).code(), EEXIST) << "one GID, one entry";
  EXPECT_EQ(dev->SetGid(1, 3, Gid{}).code(), EINVAL);
  Gid mc;
  mc.raw[0] = 0xff;
  mc.raw[15] = 1;
  EXPECT_EQ(dev->SetGid(1, 3, mc).code(), EINVAL);
  EXPECT_EQ(dev->SetGid(1, kGidTableLength, extra).code(), EINVAL);
  Status s0 = dev->SetGid(1, 0, extra);
  EXPECT_EQ(s0.code(), EBUSY);
  EXPECT_THAT(s0.message(), HasSubstr("GID[0]"));
  EXPECT_EQ(dev->ClearGid(1, 0).code(), EBUSY);
  EXPECT_EQ(*dev->QueryGid(1, 0), g0);
  ASSERT_TRUE(dev->ClearGid(1, 2).ok());
  EXPECT_EQ(dev->QueryGid(1, 2).status().code(), ENODATA);
  EXPECT_EQ(r.events.size(), 2u);
  ASSERT_TRUE(dev->ClearGid(1, 2).ok());
  EXPECT_EQ(r.events.size(), 2u) << "clearing an empty entry changes nothing";
}

TEST_F(MutatorTest, FatalRunsTheHandlerRaisesDeviceFatalOnceAndFreezesThePorts) {
  auto dev = OpenOrDie(IbPort());
  ASSERT_NE(dev, nullptr);
  Recorder r(*dev);
  int handled = 0;
  size_t events_when_handled = 99;
  dev->SetFatalHandler([&] {
    ++handled;
    events_when_handled = r.events.size();
  });
  EXPECT_FALSE(dev->dead());
  dev->Fatal("test");
  EXPECT_TRUE(dev->dead());
  EXPECT_EQ(handled, 1);
  EXPECT_EQ(events_when_handled, 0u) << "QPs are flushed before the event is delivered";
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].type, AsyncEventType::kDeviceFatal);
  EXPECT_EQ(r.events[0].port, 0);
  dev->Fatal("again");
  EXPECT_EQ(handled, 1);
  EXPECT_EQ(r.events.size(), 1u) << "one-way: a second fatal changes nothing";
  EXPECT_EQ(dev->SetLid(1, 9).code(), EIO);
  EXPECT_EQ(dev->SetPkey(1, 1, 0x8001).code(), EIO);
  EXPECT_EQ(dev->SetLinkSpeed(1, 1, 1).code(), EIO);
  EXPECT_EQ(dev->SetPortState(1, PortState::kDown).code(), EIO);
  dev->SetFatalHandler(nullptr);
}

// --- LID routing: the emulated subnet (subnet.h) ---

TEST_F(MutatorTest, ANewLidRoutesToThePortAndTheOldOneToNobody) {
  auto dev = OpenOrDie(IbPort());
  ASSERT_NE(dev, nullptr);
  const uint32_t own = dev->PortAddress(1).sin_addr.s_addr;
  const uint16_t old = dev->QueryPort(1).lid;
  EXPECT_EQ(dev->LidAddress(1, old), own) << "by default a port's LID is its address's low 16 bits";
  ASSERT_TRUE(dev->SetLid(1, 0x0042).ok());
  EXPECT_EQ(dev->LidAddress(1, 0x0042), own);
  EXPECT_EQ(dev->LidAddress(1, old), 0u) << "the old LID belongs to no port now";
  ASSERT_TRUE(dev->SetLid(1, old).ok());
  EXPECT_EQ(dev->LidAddress(1, old), own);
  EXPECT_NE(dev->LidAddress(1, 0x0042), own);
}

TEST_F(MutatorTest, ALidHeldByAnotherPortIsRefusedAndReleasedAtClose) {
  auto a = OpenOrDie(IbPort("a"));
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->SetLid(1, 0x0777).ok());
  {
    auto b = OpenOrDie(IbPort("b"));
    ASSERT_NE(b, nullptr);
    Status s = b->SetLid(1, 0x0777);
    EXPECT_EQ(s.code(), EADDRINUSE);
    EXPECT_THAT(s.message(), HasSubstr("0x777"));
    EXPECT_EQ(b->LidAddress(1, 0x0777), a->PortAddress(1).sin_addr.s_addr) << "seen from another device too";
  }
  const uint32_t a_ip = a->PortAddress(1).sin_addr.s_addr;
  a.reset();
  in_addr any{};
  any.s_addr = a_ip;
  EXPECT_NE(subnet::Resolve(any, 0x0777), a_ip) << "a closed device gives its LID back";
}

TEST_F(MutatorTest, AConfiguredLidIsRoutable) {
  DeviceConfig c = IbPort();
  c.ports[0].lid = 0x0999;
  auto dev = OpenOrDie(c);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->QueryPort(1).lid, 0x0999);
  EXPECT_EQ(dev->LidAddress(1, 0x0999), dev->PortAddress(1).sin_addr.s_addr);
}

TEST(RegistryTest, DefaultConfigurationIsEmu0) {
  auto cfg = Registry::Get().config();
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  ASSERT_EQ((*cfg)->devices.size(), 1u);
  EXPECT_EQ((*cfg)->devices[0].name, "emu0");
  EXPECT_EQ(&Registry::Get(), &Registry::Get());
}

TEST(RegistryTest, TwoAcquiresShareOneDevice) {
  auto a = Registry::Get().Acquire(0);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = Registry::Get().Acquire(0);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ((*a)->name(), "emu0");
}

TEST(RegistryTest, DeviceIsReopenedAfterTheLastHolderLetsGo) {
  std::weak_ptr<Device> weak;
  {
    auto a = Registry::Get().Acquire(0);
    ASSERT_TRUE(a.ok());
    weak = *a;
  }
  EXPECT_TRUE(weak.expired()) << "the registry must not keep a device alive by itself";
  auto again = Registry::Get().Acquire(0);
  ASSERT_TRUE(again.ok()) << again.status().message() << " (the old socket was not released?)";
}

TEST(RegistryTest, UnknownIndexIsEinval) {
  for (int i : {-1, 1, 100}) {
    auto d = Registry::Get().Acquire(i);
    ASSERT_FALSE(d.ok()) << i;
    EXPECT_EQ(d.status().code(), EINVAL) << i;
  }
}

TEST(RegistryTest, GuidsAreLocallyAdministeredAndDistinct) {
  uint64_t g0 = Registry::GuidFor("emu0", 0);
  uint64_t g1 = Registry::GuidFor("emu0", 1);
  uint64_t g2 = Registry::GuidFor("emu1", 0);
  EXPECT_NE(g0, 0u);
  EXPECT_NE(g0, g1);
  EXPECT_NE(g0, g2);
  EXPECT_EQ(g0 >> 56, 0x02u) << "locally administered EUI-64";
  EXPECT_EQ(g0, Registry::GuidFor("emu0", 0)) << "stable within the process";
}

}  // namespace
}  // namespace rdmaemu::device
