// Tests of the host slots of shared addresses (emulator/device/hosts.h) and
// of Device::Open at an address another holder has.
#include "emulator/device/hosts.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "emulator/device/device.h"
#include "emulator/device/subnet.h"

namespace rdmaemu::device {
namespace {

using ::testing::HasSubstr;

class HostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/hosts-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::setenv("RDMAEMU_SUBNET_DIR", dir_.c_str(), 1);
    // An address of 127/8 no other test uses at once.
    std::random_device rd;
    address_.s_addr = htonl(0x7f000000u | (200u << 16) | (rd() & 0xfffe) | 1);
  }
  void TearDown() override { ::unsetenv("RDMAEMU_SUBNET_DIR"); }

  // A record as another process would have written it.
  void WriteRecord(const std::string& name, unsigned value, pid_t pid) {
    ::mkdir(dir_.c_str(), 0700);
    std::ofstream(dir_ + "/" + name) << value << ' ' << pid << '\n';
  }
  std::string Text() const {
    char t[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &address_, t, sizeof t);
    return t;
  }
  static pid_t DeadPid() {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    ::waitpid(child, nullptr, 0);
    return child;
  }

  std::string dir_;
  in_addr address_{};
};

TEST_F(HostsTest, IdentifiersCarryTheSlot) {
  EXPECT_EQ(hosts::SlotOfQpn(0x000011), 0);
  EXPECT_EQ(hosts::SlotOfQpn(0x300011), 3);
  EXPECT_EQ(hosts::SlotOfQpn(0xf00001), 15);
  EXPECT_EQ(hosts::SlotOfCommId(0x12345678), 1);
  EXPECT_EQ(hosts::SlotOfCommId(0x02345678), 0);
}

TEST_F(HostsTest, ClaimsAreDistinctAndRecordThePort) {
  auto first = hosts::Claim(address_, 40001);
  auto second = hosts::Claim(address_, 40002);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(*first, 1);
  EXPECT_EQ(*second, 2) << "one process's two devices at one address are two slots";
  EXPECT_EQ(hosts::PortOf(address_, 1), 40001);
  EXPECT_EQ(hosts::PortOf(address_, 2), 40002);
  EXPECT_EQ(hosts::PortOf(address_, 3), std::nullopt);
  hosts::Release(address_, 1);
  EXPECT_EQ(hosts::PortOf(address_, 1), std::nullopt);
  auto again = hosts::Claim(address_, 40003);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 1) << "a released slot is free again";
}

TEST_F(HostsTest, ADeadProcesssSlotIsIgnoredAndTaken) {
  const pid_t dead = DeadPid();
  WriteRecord("slot-" + Text() + "-1", 41000, dead);
  EXPECT_EQ(hosts::PortOf(address_, 1), std::nullopt);
  auto slot = hosts::Claim(address_, 41001);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(*slot, 1);
  EXPECT_EQ(hosts::PortOf(address_, 1), 41001);
}

TEST_F(HostsTest, ALiveProcesssSlotIsKept) {
  WriteRecord("slot-" + Text() + "-1", 41000, 1);  // init: always alive
  auto slot = hosts::Claim(address_, 41001);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(*slot, 2);
  EXPECT_EQ(hosts::PortOf(address_, 1), 41000);
  hosts::Release(address_, 1);
  EXPECT_EQ(hosts::PortOf(address_, 1), 41000) << "only the holder releases";
}

TEST_F(HostsTest, FifteenSlotsThenEaddrinuse) {
  for (int i = 1; i < hosts::kSlots; ++i) ASSERT_TRUE(hosts::Claim(address_, 42000 + i).ok()) << i;
  auto none = hosts::Claim(address_, 42999);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), EADDRINUSE);
  EXPECT_THAT(none.status().message(), HasSubstr(Text()));
}

TEST_F(HostsTest, ListenerRecords) {
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 7471), 0) << "nobody recorded: slot 0's";
  ASSERT_TRUE(hosts::Listen(address_, 0x106, 7471, 3).ok());
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 7471), 3);
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x111, 7471), 0) << "another port space";
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 7472), 0) << "another port";
  Status twice = hosts::Listen(address_, 0x106, 7471, 4);
  EXPECT_EQ(twice.code(), EADDRINUSE);
  hosts::StopListening(address_, 0x106, 7471);
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 7471), 0);

  WriteRecord("listen-" + Text() + "-262-9000", 5, 1);  // another live process's
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 9000), 5);
  EXPECT_EQ(hosts::Listen(address_, 0x106, 9000, 2).code(), EADDRINUSE);
  WriteRecord("listen-" + Text() + "-262-9001", 5, DeadPid());
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 9001), 0) << "a dead listener is nobody";
  EXPECT_TRUE(hosts::Listen(address_, 0x106, 9001, 2).ok());
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 9001), 2);
}

// A process that has exited but that its parent has not reaped yet (as
// pyverbs' forked sides are for a while) holds nothing: the kernel has
// closed its files already, and a real host's port is free again then.
TEST_F(HostsTest, AnUnreapedExitedProcessHoldsNothing) {
  const pid_t zombie = ::fork();
  if (zombie == 0) ::_exit(0);
  ASSERT_GT(zombie, 0);
  siginfo_t info{};
  // Wait for the exit without reaping it (WNOWAIT).
  ASSERT_EQ(::waitid(P_PID, zombie, &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(subnet::ProcessRunning(zombie));
  WriteRecord("slot-" + Text() + "-1", 41000, zombie);
  WriteRecord("listen-" + Text() + "-262-9002", 1, zombie);
  EXPECT_EQ(hosts::PortOf(address_, 1), std::nullopt);
  EXPECT_EQ(hosts::ListenerSlot(address_, 0x106, 9002), 0);
  EXPECT_TRUE(hosts::Listen(address_, 0x106, 9002, 2).ok());
  ::waitpid(zombie, nullptr, 0);

  EXPECT_TRUE(subnet::ProcessRunning(::getpid()));
  EXPECT_TRUE(subnet::ProcessRunning(1)) << "init, another user's process: kill() says EPERM or 0";
  EXPECT_FALSE(subnet::ProcessRunning(0));
  EXPECT_FALSE(subnet::ProcessRunning(-1));
}

// Processes that start together at a shared address (rdma-core's RDMA CM
// tests fork both sides at once) and find a dead process's record in the
// way: each gets a slot of its own. Replacing the dead record was a check
// then an unlink, so two claimers could both unlink and both hold slot 1,
// and one's packets then went to the other. Without the directory's lock
// this failed within 13 rounds in each of 5 runs.
TEST_F(HostsTest, ProcessesClaimingADeadSlotAtOnceGetDistinctSlots) {
  constexpr int kClaimers = 8;
  constexpr int kRounds = 200;
  for (int round = 0; round < kRounds; ++round) {
    const std::string name = "slot-" + Text() + "-1";
    WriteRecord(name, 41000, DeadPid());
    int go[2], report[2], done[2];
    ASSERT_EQ(::pipe(go), 0);
    ASSERT_EQ(::pipe(report), 0);
    ASSERT_EQ(::pipe(done), 0);
    pid_t children[kClaimers];
    for (int i = 0; i < kClaimers; ++i) {
      children[i] = ::fork();
      ASSERT_GE(children[i], 0);
      if (children[i] == 0) {
        ::close(go[1]);
        ::close(done[1]);
        char c;
        (void)!::read(go[0], &c, 1);  // all start at once, when the parent closes `go`
        auto slot = hosts::Claim(address_, static_cast<uint16_t>(42000 + i));
        const uint8_t out = slot.ok() ? *slot : 0xff;
        (void)!::write(report[1], &out, 1);
        // Stay alive (the records stay live) until the parent has read all.
        (void)!::read(done[0], &c, 1);
        ::_exit(0);
      }
    }
    ::close(go[0]);
    ::close(report[1]);
    ::close(done[0]);
    ::close(go[1]);
    std::vector<uint8_t> slots;
    uint8_t slot;
    while (slots.size() < kClaimers && ::read(report[0], &slot, 1) == 1) slots.push_back(slot);
    ::close(report[0]);
    ::close(done[1]);
    for (pid_t child : children) ::waitpid(child, nullptr, 0);
    ASSERT_EQ(slots.size(), size_t{kClaimers});
    std::sort(slots.begin(), slots.end());
    EXPECT_EQ(slots, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8})) << "round " << round;
    if (::testing::Test::HasFailure()) break;
    for (uint8_t k = 1; k <= kClaimers; ++k) ::unlink((dir_ + "/slot-" + Text() + "-" + std::to_string(k)).c_str());
  }
}

// A process forked while one of its threads holds the directory's lock
// must not take the lock's file along: a flock belongs to the open file,
// which the child would share, and every other process would then wait
// for the lock until the child exits or execs. fork() waits for the holder
// to let go instead.
TEST_F(HostsTest, AForkChildDoesNotKeepTheDirectoryLockItsParentHeld) {
  std::atomic<bool> held{false};
  std::thread holder([&] {
    subnet::DirectoryLock lock;
    ASSERT_TRUE(lock.status().ok()) << lock.status().message();
    held = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  while (!held) std::this_thread::yield();
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(done[1]);
    char c;
    (void)!::read(done[0], &c, 1);  // alive, with whatever fds it got, until the parent is done
    ::_exit(0);
  }
  ::close(done[0]);
  holder.join();
  // Another process's view: a new open of the lock file, not blocking.
  const int fd = ::open((dir_ + "/.lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the child still holds the lock: " << std::strerror(errno);
  ::close(fd);
  ::close(done[1]);
  ::waitpid(child, nullptr, 0);
}

// Two devices given one address: the second shares it at slot 1, on an
// ephemeral port, and gives the slot back when it closes.
TEST_F(HostsTest, ASecondDeviceAtAnAddressTakesASlot) {
  DeviceConfig c{"shared", {PortConfig{}}};
  c.ports[0].address = address_;
  c.ports[0].udp_port = 24793;
  auto first = Device::Open(c, 0);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ((*first)->host_slot(), 0);
  EXPECT_EQ(ntohs((*first)->PortAddress(1).sin_port), 24793);
  auto second = Device::Open(c, 1);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ((*second)->host_slot(), 1);
  const uint16_t port = ntohs((*second)->PortAddress(1).sin_port);
  EXPECT_NE(port, 24793);
  EXPECT_EQ((*second)->ServicePort(1), 24793) << "peers of slot 0 are still reached on the service port";
  EXPECT_EQ((*second)->PortAddress(1).sin_addr.s_addr, address_.s_addr);
  EXPECT_EQ(hosts::PortOf(address_, 1), port);
  second->reset();
  EXPECT_EQ(hosts::PortOf(address_, 1), std::nullopt);
}

}  // namespace
}  // namespace rdmaemu::device
