// The commands that act on a device's engine: `fault` (rules through the
// engine's injector), `stats` (its counters) and `capture` (the process's
// pcap), through Dispatch as the server runs them. Two devices with
// engines, configured by the test: emu0 with one port, emu1 with two. The
// traffic is datagrams from a plain UDP socket of the test to emu0's port:
// each one is received and counted, meets dir=rx fault rules and is
// captured, before the engine drops it as malformed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "emulator/capture/capture.h"
#include "emulator/control/command.h"
#include "emulator/device/device.h"
#include "emulator/engine/engine.h"

namespace rdmaemu::control {
namespace {

using Clock = std::chrono::steady_clock;

// Before the registry reads its configuration (on the first Acquire).
class ConfigEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir = tmp != nullptr ? tmp : "/tmp";
    const std::string path = dir + "/engine_commands_test.conf";
    std::ofstream(path) << "device emu0\n"
                           "port\n"
                           "device emu1\n"
                           "port\n"
                           "port\n";
    ::setenv("RDMAEMU_CONFIG", path.c_str(), 1);
    ::unsetenv("RDMAEMU_FAULTS");
    ::unsetenv("RDMAEMU_PCAP");
  }
  static inline std::string dir;
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new ConfigEnvironment);

class EngineCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      auto e = engine::AcquireEngine(i);
      ASSERT_TRUE(e.ok()) << e.status().message();
      engines_.push_back(*e);
    }
    sock_ = ::socket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(sock_, 0);
  }
  void TearDown() override {
    for (auto& e : engines_) e->faults().Clear();
    (void)capture::Stop();
    if (sock_ >= 0) ::close(sock_);
  }

  Reply Run(std::vector<std::string> words) { return Dispatch(words); }
  engine::Engine& emu0() { return *engines_[0]; }
  engine::Engine& emu1() { return *engines_[1]; }

  // Every junk datagram ends dropped, by a drop rule or as malformed; the
  // counts come last, after the rules matched it and the capture took it.
  uint64_t Gone() { return emu0().counters().dropped_malformed + emu0().fault_counters().dropped; }

  // Sends `n` 16-byte datagrams to emu0's port 1 and waits (up to 5 s) until
  // the engine is done with them all (no delaying rule may be active).
  void Traffic(int n) {
    const uint64_t before = Gone();
    const sockaddr_in to = emu0().device().PortAddress(1);
    const uint8_t junk[16] = {0xff};
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(::sendto(sock_, junk, sizeof junk, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to),
                static_cast<ssize_t>(sizeof junk));
    }
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Gone() < before + n && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(Gone(), before + n) << "the engine did not receive them";
  }

  // The value of the line "NAME VALUE" in `text`, or -1.
  static long long Value(const std::string& text, const std::string& name) {
    const std::string key = "\n" + name + " ";
    size_t at = ("\n" + text).find(key);
    if (at == std::string::npos) return -1;
    return std::stoll(text.substr(at + key.size() - 1));
  }

  std::vector<std::shared_ptr<engine::Engine>> engines_;
  int sock_ = -1;
};

// --- fault

TEST_F(EngineCommandsTest, FaultAddListClearOnOneDevice) {
  Reply r = Run({"fault", "emu0", "list"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0: no fault rules\n");

  r = Run({"fault", "emu0", "add", "drop@dir=rx,", "op=SEND", ";", "seed=7"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0: seed=7\nemu0: drop@dir=rx,op=SEND  (matched 0 packets)\n");
  // In the engine's injector, as rdmaemu_fault_list shows it; emu1 untouched.
  EXPECT_EQ(emu0().faults().List(), "seed=7\ndrop@dir=rx,op=SEND  (matched 0 packets)\n");
  EXPECT_EQ(emu1().faults().List(), "");

  r = Run({"fault", "emu0", "add", "drop=#2..@dir=rx"});
  EXPECT_EQ(r.status, 0) << r.err;
  Traffic(5);  // none is a SEND; the second rule drops the 2nd on
  r = Run({"fault", "emu0", "list"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "emu0: seed=7\n"
            "emu0: drop@dir=rx,op=SEND  (matched 0 packets)\n"
            "emu0: drop=#2..@dir=rx  (matched 5 packets)\n");
  EXPECT_EQ(emu0().fault_counters().dropped, 4u);

  r = Run({"fault", "emu0", "clear"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "emu0: fault rules cleared\n");
  EXPECT_EQ(emu0().faults().List(), "");
  r = Run({"fault", "emu0", "clear"});
  EXPECT_EQ(r.out, "emu0: no fault rules\n");
}

TEST_F(EngineCommandsTest, FaultWithoutDeviceActsOnEveryDevice) {
  Reply r = Run({"fault", "add", "delay=1ms@dir=rx"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "emu0: seed=1 (default)\nemu0: delay=1ms@dir=rx  (matched 0 packets)\n"
            "emu1: seed=1 (default)\nemu1: delay=1ms@dir=rx  (matched 0 packets)\n");
  r = Run({"fault", "add", "rate=10gbps@dev=emu1,port=2"});
  EXPECT_EQ(r.status, 0) << r.err;
  r = Run({"fault", "list"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("emu1: rate=10gbps@dev=emu1,port=2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("emu0: rate=10gbps@dev=emu1,port=2\n"), std::string::npos)
      << "a dev= rule goes to every device, as in RDMAEMU_FAULTS, and acts on its own: " << r.out;
  r = Run({"fault", "clear"});
  EXPECT_EQ(r.out, "emu0: fault rules cleared\nemu1: fault rules cleared\n");
  r = Run({"fault", "list"});
  EXPECT_EQ(r.out, "emu0: no fault rules\nemu1: no fault rules\n");
}

TEST_F(EngineCommandsTest, FaultRefusesBadWordsAndChangesNothing) {
  ASSERT_EQ(Run({"fault", "emu1", "add", "dup=#1"}).status, 0);
  const std::string emu0_before = emu0().faults().List(), emu1_before = emu1().faults().List();
  struct Case {
    std::vector<std::string> words;
    int status;
    std::string err;  // the start of the message
  } cases[] = {
      {{"fault", "emu0", "add", "dorp=0.1"}, 2, "fault: \"dorp=0.1\": unknown fault \"dorp\" (known: drop"},
      {{"fault", "add", "drop=1.5"}, 2, "fault: \"drop=1.5\": "},
      {{"fault", "emu0", "add", "drop@op=BOGUS"}, 2, "fault: \"drop@op=BOGUS\": "},
      {{"fault", "emu0", "add"}, 2, "fault: 'add' needs RULES"},
      {{"fault", "emu0", "add", " ; "}, 2, "fault: no rule in ' ; '"},
      {{"fault", "emu0", "add", "drop@port=2"}, 1, "fault: emu0: \"drop@port=2\": port=2: emu0 has 1 port\n"},
      // emu1 has two ports and would take it; emu0 refuses, so neither gets it.
      {{"fault", "add", "drop@port=2"}, 1, "fault: emu0: \"drop@port=2\": port=2: emu0 has 1 port\n"},
      {{"fault", "emu0", "add", "drop@dev=emu1"}, 1, "fault: \"drop@dev=emu1\": dev=emu1: the rule is added to emu0 only\n"},
      {{"fault", "add", "drop@dev=emu7"}, 1,
       "fault: \"drop@dev=emu7\": dev=emu7: the rule is added to emu0, emu1 only\n"},
      {{"fault", "emu9", "list"}, 1, "fault: emu9 is not open in this process (open: emu0, emu1)\n"},
      {{"fault", "lsit"}, 2, "fault: unknown action 'lsit' (actions: add, clear, list, after an optional DEV)\n"},
      {{"fault", "emu0", "purge"}, 2, "fault: unknown action 'purge' (actions: add, clear, list)\n"},
      {{"fault", "emu0"}, 2, "fault: expected an action after emu0 (add, clear, list)\n"},
      {{"fault"}, 2, "fault: expected [DEV] add RULES, [DEV] clear or [DEV] list\n"},
      {{"fault", "emu0", "list", "all"}, 2, "fault: unexpected argument 'all'\n"},
      {{"fault", "clear", "now"}, 2, "fault: unexpected argument 'now'\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, c.status) << r.err;
    EXPECT_EQ(r.err.substr(0, c.err.size()), c.err);
    EXPECT_EQ(r.out, "");
  }
  EXPECT_EQ(emu0().faults().List(), emu0_before);
  EXPECT_EQ(emu1().faults().List(), emu1_before);
}

// --- stats

TEST_F(EngineCommandsTest, StatsPrintsEveryCounterOfEachDevice) {
  Reply r = Run({"stats"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string header0 = "device emu0\n", header1 = "device emu1\n";
  ASSERT_EQ(r.out.rfind(fmt::format("process {} ", ::getpid()), 0), 0u) << r.out;
  const size_t at0 = r.out.find(header0), at1 = r.out.find(header1);
  ASSERT_NE(at0, std::string::npos) << r.out;
  ASSERT_NE(at1, std::string::npos) << r.out;
  const std::string block0 = r.out.substr(at0, at1 - at0);
  // Every counter of the list (the fault_ ones too), with the engine's value.
  const engine::CounterValues now = emu0().counters();
  engine::ForEachCounter(now, [&](std::string_view name, std::string_view, uint64_t v) {
    EXPECT_EQ(Value(block0, std::string(name)), static_cast<long long>(v)) << name;
  });
  EXPECT_GE(Value(block0, "fault_dropped"), 0);

  // Traffic moves emu0's counters, and a drop rule its fault counter.
  ASSERT_EQ(Run({"fault", "emu0", "add", "drop=#1..2@dir=rx"}).status, 0);
  Traffic(3);
  Reply after = Run({"stats", "emu0"});
  ASSERT_EQ(after.status, 0) << after.err;
  EXPECT_EQ(after.out.find("device emu1"), std::string::npos) << "emu0 only";
  EXPECT_EQ(Value(after.out, "packets_received"), Value(block0, "packets_received") + 3);
  EXPECT_EQ(Value(after.out, "bytes_received"), Value(block0, "bytes_received") + 3 * 16);
  EXPECT_EQ(Value(after.out, "dropped_malformed"), Value(block0, "dropped_malformed") + 1)
      << "two of the three were dropped by the rule before the engine saw them";
  EXPECT_EQ(Value(after.out, "fault_dropped"), Value(block0, "fault_dropped") + 2);
}

TEST_F(EngineCommandsTest, StatsOfAPortAndOfAQp) {
  Reply r = Run({"stats", "emu1", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find(fmt::format("process {} ", ::getpid())), 0u);
  EXPECT_NE(r.out.find(" device emu1 port 2\n"), std::string::npos) << r.out;
  EXPECT_EQ(Value(r.out, "packets_sent"), 0);
  EXPECT_EQ(Value(r.out, "fault_dropped"), 0);

  auto qpn = emu1().AllocateQpn();
  ASSERT_TRUE(qpn.ok());
  auto qp = std::make_shared<engine::Qp>(*qpn, engine::QpType::kRc, 0, nullptr, nullptr, engine::QpCaps{}, 0);
  qp->counters.packets_sent = 42;
  qp->counters.retransmissions = 3;
  emu1().AddQp(qp);
  for (std::vector<std::string> words : {std::vector<std::string>{"stats", "--qp", std::to_string(*qpn)},
                                         {"stats", "emu1", fmt::format("--qp=0x{:x}", *qpn)}}) {
    r = Run(words);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(fmt::format(" device emu1 qp {} (0x{:06x})\n", *qpn, *qpn)), std::string::npos) << r.out;
    EXPECT_EQ(Value(r.out, "packets_sent"), 42);
    EXPECT_EQ(Value(r.out, "retransmissions"), 3);
    EXPECT_EQ(Value(r.out, "packets_received"), 0);
  }
  r = Run({"stats", "emu0", "--qp", std::to_string(*qpn)});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, fmt::format("stats: emu0 has no qp {} (see `list`)\n", *qpn));
  emu1().RemoveQp(*qpn);

  // QPNs are per device: when two have it, DEV says which.
  constexpr uint32_t kShared = 0xabcde;
  for (auto& e : engines_) {
    e->AddQp(std::make_shared<engine::Qp>(kShared, engine::QpType::kUd, 0, nullptr, nullptr, engine::QpCaps{}, 0));
  }
  r = Run({"stats", "--qp", "0xabcde"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "stats: qp 0xabcde is on emu0 and emu1: give DEV\n");
  r = Run({"stats", "emu1", "--qp", "0xabcde"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(" device emu1 qp 703710 (0x0abcde)\n"), std::string::npos) << r.out;
  for (auto& e : engines_) e->RemoveQp(kShared);
}

TEST_F(EngineCommandsTest, StatsJson) {
  Reply r = Run({"stats", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind(fmt::format("{{\"pid\": {}, \"program\": \"", ::getpid()), 0), 0u) << r.out;
  EXPECT_NE(r.out.find("{\"device\": \"emu0\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("{\"device\": \"emu1\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"counters\": {\"packets_sent\": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"fault_dropped\": "), std::string::npos) << r.out;
  // Valid JSON: python3 reads it back (when the machine has it).
  if (std::system("python3 -c '' 2>/dev/null") == 0) {
    const std::string path = ConfigEnvironment::dir + "/stats.json";
    std::ofstream(path) << r.out;
    EXPECT_EQ(std::system(("python3 -m json.tool " + path + " >/dev/null").c_str()), 0) << r.out;
    r = Run({"stats", "emu1", "1", "--json"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("{\"device\": \"emu1\", \"port\": 1,"), std::string::npos) << r.out;
    std::ofstream(path) << r.out;
    EXPECT_EQ(std::system(("python3 -m json.tool " + path + " >/dev/null").c_str()), 0) << r.out;
  }
}

TEST_F(EngineCommandsTest, StatsRefusesBadWords) {
  struct Case {
    std::vector<std::string> words;
    int status;
    std::string err;
  } cases[] = {
      {{"stats", "emu9"}, 1, "stats: emu9 is not open in this process (open: emu0, emu1)\n"},
      {{"stats", "emu0", "2"}, 1, "stats: emu0 has no port '2' (ports are 1..1)\n"},
      {{"stats", "emu0", "one"}, 1, "stats: emu0 has no port 'one' (ports are 1..1)\n"},
      {{"stats", "emu0", "1", "extra"}, 2, "stats: unexpected argument 'extra'\n"},
      {{"stats", "--qp"}, 2, "stats: '--qp' needs a QPN\n"},
      {{"stats", "--qp", "seventeen"}, 2, "stats: --qp QPN: 'seventeen' is not a number\n"},
      {{"stats", "--qp", "0x1000000"}, 2, "stats: --qp QPN: 0x1000000 is larger than 16777215\n"},
      {{"stats", "--qp", "9999"}, 1, "stats: no qp 9999 in this process (see `list`)\n"},
      {{"stats", "emu0", "1", "--qp", "17"}, 2, "stats: give a PORT or --qp QPN, not both\n"},
      {{"stats", "--jsn"}, 2, "stats: unknown option '--jsn' (options: --qp QPN, --json)\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, c.status) << r.err;
    EXPECT_EQ(r.err, c.err);
    EXPECT_EQ(r.out, "");
  }
}

// --- capture

TEST_F(EngineCommandsTest, CaptureStartStatusStop) {
  Reply r = Run({"capture", "status"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "not capturing\n");

  const std::string pattern = ConfigEnvironment::dir + "/cap-%p.pcap";
  const std::string path = ConfigEnvironment::dir + fmt::format("/cap-{}.pcap", ::getpid());
  r = Run({"capture", "start", pattern});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "capturing into '" + path + "'\n");
  Traffic(4);
  r = Run({"capture", "status"});
  EXPECT_EQ(r.out, "capturing into '" + path + "': 4 packets so far\n");

  // A second start is refused and the first capture goes on.
  r = Run({"capture", "start", ConfigEnvironment::dir + "/other.pcap"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "capture: a capture into '" + path + "' is running; stop it first\n");
  EXPECT_EQ(capture::CurrentPath(), path);

  r = Run({"capture", "stop"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "capture stopped: 4 packets in '" + path + "'\n");
  // The file: the header and four records of 42 bytes of framing + 16.
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<size_t>(f.tellg()), 24 + 4 * (16 + 42 + 16));
  Traffic(1);
  EXPECT_EQ(Run({"capture", "status"}).out, "not capturing\n");
}

TEST_F(EngineCommandsTest, CaptureRefusesBadWords) {
  struct Case {
    std::vector<std::string> words;
    int status;
    std::string err;
  } cases[] = {
      {{"capture"}, 2, "capture: expected start FILE, stop or status\n"},
      {{"capture", "begin", "x"}, 2, "capture: unknown action 'begin' (actions: start, stop, status)\n"},
      {{"capture", "start"}, 2, "capture: 'start' needs a FILE\n"},
      {{"capture", "start", ""}, 2, "capture: FILE is empty\n"},
      {{"capture", "start", "a", "b"}, 2, "capture: unexpected argument 'b'\n"},
      {{"capture", "stop"}, 1, "capture: no capture is running\n"},
      {{"capture", "status", "x"}, 2, "capture: unexpected argument 'x'\n"},
      {{"capture", "start", "/nonexistent-dir/x.pcap"}, 1,
       "capture: cannot create the capture file '/nonexistent-dir/x.pcap': No such file or directory\n"},
  };
  for (const auto& c : cases) {
    Reply r = Run(c.words);
    EXPECT_EQ(r.status, c.status) << r.err;
    EXPECT_EQ(r.err, c.err);
  }
  EXPECT_FALSE(capture::Active());
}

}  // namespace
}  // namespace rdmaemu::control
