// The control commands on a real device of this process: port, event and
// list through Dispatch, as the server runs them, with the events checked
// at a device listener (what the provider registers per context).
#include "emulator/control/command.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "emulator/device/device.h"

namespace rdmaemu::control {
namespace {

using device::AsyncEvent;
using device::AsyncEventType;
using objects::ObjectKind;

class CommandsTest : public ::testing::Test {
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
  void TearDown() override {
    dev_->RemoveListener(listener_);
    for (auto [kind, n] : registered_) dev_->directory().Remove(kind, n);
    ASSERT_TRUE(dev_->SetPortState(1, device::PortState::kActive).ok());
  }

  Reply Run(std::vector<std::string> words) { return Dispatch(words); }
  std::vector<AsyncEvent> Events() {
    std::lock_guard lock(mu_);
    auto out = events_;
    events_.clear();
    return out;
  }
  uint32_t Register(ObjectKind kind, uint64_t handle, std::optional<uint32_t> number = std::nullopt) {
    auto n = dev_->directory().Add(kind, handle, {}, number);
    EXPECT_TRUE(n.ok());
    registered_.emplace_back(kind, *n);
    return *n;
  }

  std::shared_ptr<device::Device> dev_;
  int listener_ = 0;
  std::mutex mu_;
  std::vector<AsyncEvent> events_;
  std::vector<std::pair<ObjectKind, uint32_t>> registered_;
};

TEST_F(CommandsTest, PortDownAndUpChangeTheStateAndRaiseTheEvents) {
  Reply r = Run({"port", "emu0", "1", "down"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0 port 1: DOWN (was ACTIVE)\n");
  EXPECT_EQ(dev_->QueryPort(1).state, device::PortState::kDown);
  EXPECT_FALSE(dev_->PortUp(1));
  auto ev = Events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, AsyncEventType::kPortErr);
  EXPECT_EQ(ev[0].port, 1);

  r = Run({"port", "emu0", "1", "down"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "emu0 port 1: already DOWN\n");
  EXPECT_TRUE(Events().empty()) << "no change, no event";

  r = Run({"port", "emu0", "1", "up"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "emu0 port 1: ACTIVE (was DOWN)\n");
  ev = Events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, AsyncEventType::kPortActive);
  EXPECT_TRUE(dev_->PortUp(1));
}

TEST_F(CommandsTest, PortRefusesBadWordsNamingThem) {
  Reply r = Run({"port", "emu9", "1", "down"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "port: emu9 is not open in this process (open: emu0)\n");
  r = Run({"port", "emu0", "3", "down"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "port: emu0 has no port '3' (ports are 1..1)\n");
  r = Run({"port", "emu0", "x", "down"});
  EXPECT_EQ(r.status, 1);
  r = Run({"port", "emu0", "1", "sideways"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "port: unknown action 'sideways' (actions: down, up, lid, sm_lid, rereg, pkey, speed, width)\n");
  r = Run({"port", "emu0", "1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "port: expected DEV PORT ACTION\n");
  r = Run({"port", "emu0", "1", "down", "now"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "port: 'down' takes 0 value(s), got 1\n");
  EXPECT_TRUE(Events().empty());
  EXPECT_EQ(dev_->QueryPort(1).state, device::PortState::kActive);
}

TEST_F(CommandsTest, EventOnAQpByNumberInAnySpelling) {
  Register(ObjectKind::kQp, 0x1234, 0x11);
  for (const char* type : {"qp_fatal", "QP_FATAL", "IBV_EVENT_QP_FATAL", "ibv_event_qp_fatal", "qp-fatal"}) {
    Reply r = Run({"event", type, "--qp", "17"});
    EXPECT_EQ(r.status, 0) << type << ": " << r.err;
    EXPECT_EQ(r.out, "emu0 qp 17: raised IBV_EVENT_QP_FATAL\n");
    auto ev = Events();
    ASSERT_EQ(ev.size(), 1u) << type;
    EXPECT_EQ(ev[0].type, AsyncEventType::kQpFatal);
    EXPECT_EQ(ev[0].handle, 0x1234u);
  }
  for (std::vector<std::string> words : {std::vector<std::string>{"event", "comm_est", "--qp", "0x11"},
                                         {"event", "comm_est", "--qp=0x11"},
                                         {"event", "comm_est", "--qp", "17", "--device", "emu0"},
                                         {"event", "comm_est", "--device=emu0", "--qp", "17"}}) {
    Reply r = Run(words);
    EXPECT_EQ(r.status, 0) << r.err;
    auto ev = Events();
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, AsyncEventType::kCommEst);
  }
}

TEST_F(CommandsTest, EventOnEveryKindOfTarget) {
  uint32_t cq = Register(ObjectKind::kCq, 0xc0);
  uint32_t srq = Register(ObjectKind::kSrq, 0x50);
  uint32_t wq = Register(ObjectKind::kWq, 0x70);
  struct Case {
    std::vector<std::string> words;
    AsyncEventType type;
    uint64_t handle;
    uint8_t port;
  } cases[] = {
      {{"event", "cq_err", "--cq", std::to_string(cq)}, AsyncEventType::kCqErr, 0xc0, 0},
      {{"event", "srq_limit_reached", "--srq", std::to_string(srq)}, AsyncEventType::kSrqLimitReached, 0x50, 0},
      {{"event", "srq_err", "--srq", std::to_string(srq)}, AsyncEventType::kSrqErr, 0x50, 0},
      {{"event", "wq_fatal", "--wq", std::to_string(wq)}, AsyncEventType::kWqFatal, 0x70, 0},
      {{"event", "port_err", "--port", "emu0", "1"}, AsyncEventType::kPortErr, 0, 1},
      {{"event", "lid_change", "--port", "emu0", "1"}, AsyncEventType::kLidChange, 0, 1},
      {{"event", "device_speed_change", "--port", "emu0", "1"}, AsyncEventType::kDeviceSpeedChange, 0, 1},
      {{"event", "device_fatal", "--device", "emu0"}, AsyncEventType::kDeviceFatal, 0, 0},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, 0) << c.words[1] << ": " << r.err;
    auto ev = Events();
    ASSERT_EQ(ev.size(), 1u) << c.words[1];
    EXPECT_EQ(ev[0].type, c.type);
    EXPECT_EQ(ev[0].handle, c.handle);
    EXPECT_EQ(ev[0].port, c.port);
  }
  // An event changes nothing else.
  EXPECT_EQ(dev_->QueryPort(1).state, device::PortState::kActive);
}

TEST_F(CommandsTest, EventRefusesWhatDoesNotFit) {
  Register(ObjectKind::kQp, 0x1234, 0x11);
  struct Case {
    std::vector<std::string> words;
    int status;
    std::string err;
  } cases[] = {
      {{"event"}, 2, "event: expected TYPE TARGET\n"},
      {{"event", "qp_fatal"}, 2, "event: no target (--qp, --cq, --srq, --wq, --port or --device)\n"},
      {{"event", "bogus", "--qp", "17"}, 2, "event: 'bogus' is not an async event type\n"},
      {{"event", "cq_err", "--qp", "17"}, 2, "event: CQ_ERR is an event of a CQ: give --cq N, not --qp QPN\n"},
      {{"event", "port_err", "--qp", "17"}, 2,
       "event: PORT_ERR is an event of a port: give --port DEV PORT, not --qp QPN\n"},
      {{"event", "qp_fatal", "--device", "emu0"}, 2,
       "event: QP_FATAL is an event of a QP: give --qp QPN, not --device DEV\n"},
      {{"event", "qp_fatal", "--qp"}, 2, "event: '--qp' needs a number\n"},
      {{"event", "qp_fatal", "--qp", "17", "--cq", "1"}, 2,
       "event: give one target (--qp, --cq, --srq, --wq or --port)\n"},
      {{"event", "qp_fatal", "--qp", "seventeen"}, 2, "event: --qp QPN: 'seventeen' is not a number\n"},
      {{"event", "port_err", "--port", "emu0"}, 2, "event: '--port' needs DEV PORT\n"},
      {{"event", "port_err", "--port", "emu0", "1", "--device", "emu0"}, 2,
       "event: --port names its device already; drop --device\n"},
      {{"event", "qp_fatal", "--qp", "17", "extra"}, 2, "event: unexpected argument 'extra'\n"},
      {{"event", "qp_fatal", "--qp", "99"}, 1, "event: no qp 99 in this process (see `list`)\n"},
      {{"event", "qp_fatal", "--qp", "17", "--device", "emu7"}, 1,
       "event: emu7 is not open in this process (open: emu0)\n"},
      {{"event", "port_err", "--port", "emu0", "2"}, 1, "event: emu0 has no port '2' (ports are 1..1)\n"},
      {{"event", "wq_fatal", "--wq", "1"}, 1, "event: no wq 1 in this process (see `list`)\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, c.status) << c.err;
    EXPECT_EQ(r.err, c.err);
  }
  EXPECT_TRUE(Events().empty());
}

TEST_F(CommandsTest, ListShowsPortsAndObjects) {
  dev_->directory().Remove(ObjectKind::kQp, 0x11);
  auto qp = dev_->directory().Add(ObjectKind::kQp, 1, [] { return std::string("RC RTS"); }, 0x11);
  ASSERT_TRUE(qp.ok());
  registered_.emplace_back(ObjectKind::kQp, 0x11);
  uint32_t cq = Register(ObjectKind::kCq, 2);
  Reply r = Run({"list"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("process ", 0), 0u);
  EXPECT_NE(r.out.find("\nemu0 port 1 ACTIVE\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nemu0 qp 17 (0x000011) RC RTS\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nemu0 cq " + std::to_string(cq) + "\n"), std::string::npos) << r.out;
  EXPECT_EQ(Run({"list", "x"}).status, 2);
}

TEST_F(CommandsTest, HelpListsAndDescribesTheCommands) {
  Reply r = Run({"help"});
  EXPECT_EQ(r.status, 0);
  for (const Command* c : Commands()) {
    EXPECT_NE(r.out.find(std::string(c->name)), std::string::npos);
    Reply one = Run({"help", std::string(c->name)});
    EXPECT_EQ(one.status, 0);
    EXPECT_EQ(one.out.rfind("Usage: " + std::string(c->name), 0), 0u) << one.out;
  }
  EXPECT_EQ(Run({"help", "nope"}).status, 2);
  EXPECT_EQ(Run({}).status, 2);
}

}  // namespace
}  // namespace rdmaemu::control
