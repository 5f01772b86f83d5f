// Tests of Device (ports, GID table, listeners) and the process Registry.
#include "emulator/device/device.h"

#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "emulator/device/attributes.h"

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
