// sysfs helpers (really read files, honour SYSFS_PATH), fork helpers (fork is
// always safe: IBV_FORK_UNNEEDED) and ibv_resolve_eth_l2_from_gid (fails).

#include <errno.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/verbs/real_libibverbs.h"
#include "verbs/abi/exports.h"

namespace {

// ibv_get_sysfs_path reads the environment once per process, so each case
// runs in a child (a gtest death test that exits normally).
TEST(SysfsPath, DefaultIsSys) {
  EXPECT_EXIT(
      {
        unsetenv("SYSFS_PATH");
        std::exit(std::strcmp(ibv_get_sysfs_path(), "/sys") == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(SysfsPath, HonoursSysfsPathWithoutTrailingSlashes) {
  EXPECT_EXIT(
      {
        setenv("SYSFS_PATH", "/tmp/fake-sys///", 1);
        std::exit(std::strcmp(ibv_get_sysfs_path(), "/tmp/fake-sys") == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(SysfsPath, StableAcrossCalls) {
  const char* first = ibv_get_sysfs_path();
  EXPECT_EQ(first, ibv_get_sysfs_path());
}

class ReadSysfsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/sysfs_fork_test." +
           std::to_string(getpid());
    ASSERT_EQ(0, system(("mkdir -p '" + dir_ + "'").c_str()));
  }
  void TearDown() override { (void)!system(("rm -rf '" + dir_ + "'").c_str()); }

  void Write(const char* name, const std::string& contents) {
    FILE* f = std::fopen((dir_ + "/" + name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(contents.data(), 1, contents.size(), f);
    std::fclose(f);
  }

  std::string dir_;
};

TEST_F(ReadSysfsFile, StripsTrailingNewline) {
  Write("board_id", "EMU_0001\n");
  char buf[64];
  std::memset(buf, 'x', sizeof(buf));
  EXPECT_EQ(ibv_read_sysfs_file(dir_.c_str(), "board_id", buf, sizeof(buf)), 8);
  EXPECT_STREQ(buf, "EMU_0001");
}

TEST_F(ReadSysfsFile, TerminatesContentsWithoutNewline) {
  Write("node_guid", "0011:2233:4455:6677");
  char buf[64];
  std::memset(buf, 'x', sizeof(buf));
  EXPECT_EQ(ibv_read_sysfs_file(dir_.c_str(), "node_guid", buf, sizeof(buf)), 19);
  EXPECT_STREQ(buf, "0011:2233:4455:6677");
}

TEST_F(ReadSysfsFile, FailsWhenNoRoomForTerminator) {
  Write("long", "abcdefgh");
  char buf[8];
  errno = 0;
  EXPECT_EQ(ibv_read_sysfs_file(dir_.c_str(), "long", buf, sizeof(buf)), -1);
  // A newline in the last byte fits: it becomes the terminator.
  Write("exact", "abcdefg\n");
  EXPECT_EQ(ibv_read_sysfs_file(dir_.c_str(), "exact", buf, sizeof(buf)), 7);
  EXPECT_STREQ(buf, "abcdefg");
}

TEST_F(ReadSysfsFile, EmptyFile) {
  Write("empty", "");
  char buf[8] = "zzz";
  EXPECT_EQ(ibv_read_sysfs_file(dir_.c_str(), "empty", buf, sizeof(buf)), 0);
}

TEST_F(ReadSysfsFile, MissingFile) {
  char buf[8];
  errno = 0;
  EXPECT_EQ(ibv_read_sysfs_file(dir_.c_str(), "nope", buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(ReadSysfsFile, SameAsInstalledRdmaCore) {
  auto real = REAL_SYMBOL(ibv_read_sysfs_file);
  if (real == nullptr) GTEST_SKIP() << rdmaemu::testing::kRealLibibverbs << " is not installed";
  Write("a", "hello\n");
  Write("b", "hello");
  Write("c", "12345678");
  Write("d", "");
  Write("e", "1234567\n");
  for (const char* name : {"a", "b", "c", "d", "e", "missing"}) {
    for (size_t size : {1, 5, 6, 7, 8, 64}) {
      char ours_buf[64], real_buf[64];
      std::memset(ours_buf, 'x', sizeof(ours_buf));
      std::memset(real_buf, 'x', sizeof(real_buf));
      const int ours_len = ibv_read_sysfs_file(dir_.c_str(), name, ours_buf, size);
      const int real_len = real(dir_.c_str(), name, real_buf, size);
      EXPECT_EQ(ours_len, real_len) << name << " size " << size;
      if (ours_len > 0 && real_len == ours_len) {
        EXPECT_EQ(0, std::memcmp(ours_buf, real_buf, static_cast<size_t>(ours_len) + 1))
            << name << " size " << size;
      }
    }
  }
}

TEST(Fork, ForkSupportIsUnneeded) {
  EXPECT_EQ(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
  EXPECT_EQ(ibv_fork_init(), 0);
  EXPECT_EQ(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
}

TEST(Fork, RangesSucceedAndForkedChildSeesMemory) {
  const size_t len = 2 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  std::memset(mem, 0x5a, len);
  EXPECT_EQ(ibv_dontfork_range(mem, len), 0);
  // The range is still inherited by a child (nothing was marked DONTFORK).
  EXPECT_EXIT(std::exit(static_cast<unsigned char*>(mem)[len - 1] == 0x5a ? 0 : 1),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EQ(ibv_dofork_range(mem, len), 0);
  munmap(mem, len);
}

TEST(ResolveEthL2, FailsCleanly) {
  ibv_ah_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  uint8_t mac[ETHERNET_LL_SIZE] = {};
  uint16_t vid = 0;
  errno = 0;
  EXPECT_LT(ibv_resolve_eth_l2_from_gid(nullptr, &attr, mac, &vid), 0);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

}  // namespace
