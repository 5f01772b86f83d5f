// Unit tests of the rdmaemu tool's option parser, value checks and library
// lookup (tools/rdmaemu/options.h, locate.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tools/rdmaemu/locate.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {

namespace fs = std::filesystem;

ParsedArgs Parse(std::vector<std::string> args) { return ParseArgs(args, kEnvironmentOptions); }

TEST(ParseArgs, SeparateAndInlineValues) {
  ParsedArgs p = Parse({"--log", "debug", "--engine=epoll", "--", "prog", "--log", "x"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.Get("log"), "debug");
  EXPECT_EQ(p.Get("engine"), "epoll");
  EXPECT_EQ(p.Get("config"), std::nullopt);
  EXPECT_EQ(p.operands, (std::vector<std::string>{"prog", "--log", "x"}));
  EXPECT_FALSE(p.help);
}

// --check's value is optional: bare, it is warn and the next word is an
// operand; a value comes only with '='. run has it, devices does not.
TEST(ParseArgs, CheckTakesItsValueOnlyInline) {
  ParsedArgs bare = ParseArgs(std::vector<std::string>{"--check", "prog"}, kRunOptions);
  EXPECT_EQ(bare.error, "");
  EXPECT_EQ(bare.Get("check"), "warn");
  ASSERT_EQ(bare.operands.size(), 1u);
  EXPECT_EQ(bare.operands[0], "prog");
  ParsedArgs error = ParseArgs(std::vector<std::string>{"--check=error", "--check-report", "r.json", "prog"},
                               kRunOptions);
  EXPECT_EQ(error.Get("check"), "error");
  EXPECT_EQ(error.Get("check-report"), "r.json");
  EXPECT_EQ(CheckEnvironmentOptions(error), "");
  ParsedArgs bad = ParseArgs(std::vector<std::string>{"--check=loud", "prog"}, kRunOptions);
  EXPECT_NE(CheckEnvironmentOptions(bad), "");
  EXPECT_NE(Parse({"--check", "prog"}).error, "");
  EXPECT_NE(FormatOptions(kRunOptions).find("--check[=MODE]"), std::string::npos);
}

// --no-sysfs is a flag: no value, and the next word is an operand. Only
// run has it.
TEST(ParseArgs, FlagTakesNoValue) {
  ParsedArgs p = ParseArgs(std::vector<std::string>{"--no-sysfs", "prog", "x"}, kRunOptions);
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.Get("no-sysfs"), "");
  EXPECT_EQ(p.operands, (std::vector<std::string>{"prog", "x"}));
  EXPECT_EQ(CheckEnvironmentOptions(p), "");
  EXPECT_EQ(ParseArgs(std::vector<std::string>{"prog"}, kRunOptions).Get("no-sysfs"), std::nullopt);
  EXPECT_EQ(ParseArgs(std::vector<std::string>{"--no-sysfs=yes", "prog"}, kRunOptions).error,
            "option '--no-sysfs' takes no value");
  EXPECT_EQ(Parse({"--no-sysfs", "prog"}).error, "unknown option '--no-sysfs'");
  const std::string help = FormatOptions(kRunOptions);
  EXPECT_NE(help.find("  --no-sysfs "), std::string::npos) << help;
}

TEST(ParseArgs, OperandsStartAtFirstNonOption) {
  ParsedArgs p = Parse({"--log", "info", "prog", "--help"});
  ASSERT_EQ(p.error, "");
  EXPECT_FALSE(p.help) << "--help after the program belongs to the program";
  EXPECT_EQ(p.operands, (std::vector<std::string>{"prog", "--help"}));
}

TEST(ParseArgs, LastValueWins) {
  ParsedArgs p = Parse({"--log", "info", "--log", "trace"});
  EXPECT_EQ(p.Get("log"), "trace");
}

TEST(ParseArgs, Help) {
  EXPECT_TRUE(Parse({"--help"}).help);
  EXPECT_TRUE(Parse({"-h", "--log", "x"}).help);
}

TEST(ParseArgs, EmptyInlineValueIsAValue) {
  ParsedArgs p = Parse({"--address="});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.Get("address"), "");
}

TEST(ParseArgs, Errors) {
  EXPECT_EQ(Parse({"--frob"}).error, "unknown option '--frob'");
  EXPECT_EQ(Parse({"--frob=1"}).error, "unknown option '--frob'");
  EXPECT_EQ(Parse({"-x"}).error, "unknown option '-x'");
  EXPECT_EQ(Parse({"--log"}).error, "option '--log' needs a value (LEVEL)");
}

TEST(ParseArgs, LoneDashIsAnOperand) {
  ParsedArgs p = Parse({"-"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.operands, std::vector<std::string>{"-"});
}

TEST(Checks, LogLevel) {
  for (const char* ok : {"off", "error", "warn", "info", "debug", "trace"}) {
    EXPECT_EQ(CheckLogLevel(ok), "") << ok;
  }
  EXPECT_NE(CheckLogLevel("DEBUG"), "");
  EXPECT_NE(CheckLogLevel(""), "");
  EXPECT_EQ(CheckLogLevel("loud"),
            "--log: 'loud' is not a level (off, error, warn, info, debug, trace)");
}

TEST(Checks, Engine) {
  EXPECT_EQ(CheckEngine("auto"), "");
  EXPECT_EQ(CheckEngine("uring"), "");
  EXPECT_EQ(CheckEngine("epoll"), "");
  EXPECT_EQ(CheckEngine("io_uring"), "--engine: 'io_uring' is not an engine (auto, uring, epoll)");
}

TEST(Checks, Address) {
  EXPECT_EQ(CheckAddress("127.0.0.5"), "");
  EXPECT_EQ(CheckAddress("10.1.2.3"), "");
  EXPECT_EQ(CheckAddress("auto"), "");
  EXPECT_NE(CheckAddress("256.0.0.1"), "");
  EXPECT_NE(CheckAddress("::1"), "");
  EXPECT_NE(CheckAddress("localhost"), "");
  EXPECT_NE(CheckAddress(""), "");
}

TEST(Checks, UdpPort) {
  EXPECT_EQ(CheckUdpPort("4791"), "");
  EXPECT_EQ(CheckUdpPort("1"), "");
  EXPECT_EQ(CheckUdpPort("65535"), "");
  EXPECT_NE(CheckUdpPort("0"), "");
  EXPECT_NE(CheckUdpPort("65536"), "");
  EXPECT_NE(CheckUdpPort("47x"), "");
  EXPECT_NE(CheckUdpPort("-1"), "");
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(base ? base : "/tmp") / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    dir_ = fs::canonical(dir_);  // the tool reports directories canonically
  }
  void Touch(const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "x";
  }
  fs::path dir_;
};

using ConfigCheck = TempDir;

TEST_F(ConfigCheck, File) {
  Touch(dir_ / "a.conf");
  EXPECT_EQ(CheckConfigFile((dir_ / "a.conf").string()), "");
  EXPECT_NE(CheckConfigFile((dir_ / "missing.conf").string()).find("No such file"), std::string::npos);
  EXPECT_NE(CheckConfigFile(dir_.string()).find("is a directory"), std::string::npos);
}

using Locate = TempDir;

TEST_F(Locate, LibOptionDirectoryOrFile) {
  Touch(dir_ / "lib" / kLibraryName);
  LibrarySearch s;
  s.lib_option = (dir_ / "lib").string();
  LibraryLocation l = FindLibrary(s);
  ASSERT_EQ(l.error, "");
  EXPECT_EQ(l.dir, (dir_ / "lib").string());
  EXPECT_EQ(l.path, (dir_ / "lib" / kLibraryName).string());
  s.lib_option = (dir_ / "lib" / kLibraryName).string();
  EXPECT_EQ(FindLibrary(s).dir, (dir_ / "lib").string());
}

TEST_F(Locate, LibOptionIsFinal) {
  Touch(dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu");
  Touch(dir_ / "bin" / "verbs" / kLibraryName);
  LibrarySearch s;
  s.self_exe = (dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu").string();
  s.lib_option = (dir_ / "empty").string();
  EXPECT_EQ(FindLibrary(s).error, "--lib: '" + (dir_ / "empty").string() + "' does not exist");
  fs::create_directories(dir_ / "empty");
  EXPECT_NE(FindLibrary(s).error.find("--lib: no readable libibverbs.so.1"), std::string::npos);
  Touch(dir_ / "other.so");
  s.lib_option = (dir_ / "other.so").string();
  EXPECT_NE(FindLibrary(s).error.find("neither a directory nor a file named"), std::string::npos);
}

TEST_F(Locate, EnvironmentBeforeDefaults) {
  Touch(dir_ / "env" / kLibraryName);
  Touch(dir_ / "bin" / "verbs" / kLibraryName);
  LibrarySearch s;
  s.self_exe = (dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu").string();
  s.lib_env = (dir_ / "env").string();
  EXPECT_EQ(FindLibrary(s).dir, (dir_ / "env").string());
  s.lib_env = (dir_ / "nope").string();
  EXPECT_EQ(FindLibrary(s).error.rfind("RDMAEMU_LIB: ", 0), 0u);
}

TEST_F(Locate, RunfilesBeforeBazelBin) {
  Touch(dir_ / "bin" / "verbs" / kLibraryName);
  Touch(dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu.runfiles" / "rdmaemu" / "verbs" / kLibraryName);
  LibrarySearch s;
  s.self_exe = (dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu").string();
  EXPECT_EQ(FindLibrary(s).dir,
            (dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu.runfiles" / "rdmaemu" / "verbs").string());
  Touch(dir_ / "rf" / "rdmaemu" / "verbs" / kLibraryName);
  s.runfiles_dir = (dir_ / "rf").string();
  EXPECT_EQ(FindLibrary(s).dir, (dir_ / "rf" / "rdmaemu" / "verbs").string());
}

TEST_F(Locate, BazelBinNextToTheTool) {
  Touch(dir_ / "bin" / "verbs" / kLibraryName);
  LibrarySearch s;
  s.self_exe = (dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu").string();
  LibraryLocation l = FindLibrary(s);
  ASSERT_EQ(l.error, "");
  EXPECT_EQ(l.dir, (dir_ / "bin" / "verbs").string());
}

TEST_F(Locate, ArgvZeroInARunfilesTree) {
  Touch(dir_ / "rf" / "rdmaemu" / "verbs" / kLibraryName);
  LibrarySearch s;
  s.argv0 = (dir_ / "rf" / "rdmaemu" / "tools" / "rdmaemu" / "rdmaemu").string();
  s.self_exe = "/nonexistent/tools/rdmaemu/rdmaemu";
  EXPECT_EQ(FindLibrary(s).dir, (dir_ / "rf" / "rdmaemu" / "verbs").string());
}

TEST_F(Locate, NotFoundSaysHowToFixIt) {
  LibrarySearch s;
  s.self_exe = (dir_ / "bin" / "tools" / "rdmaemu" / "rdmaemu").string();
  LibraryLocation l = FindLibrary(s);
  EXPECT_NE(l.error.find("bazel build //verbs:libibverbs.so.1"), std::string::npos) << l.error;
  EXPECT_NE(l.error.find("--lib DIR"), std::string::npos);
  EXPECT_NE(l.error.find((dir_ / "bin" / "verbs" / kLibraryName).string()), std::string::npos);
}

// rdmaemu run --check's LD_PRELOAD: the interposer after what was there
// (AddressSanitizer's runtime must stay first), once, and by bare name where
// the directory holds one of LD_PRELOAD's separators.
TEST(WithInterposer, AppendsOnce) {
  EXPECT_EQ(WithInterposer(nullptr, "/p/lib"), "/p/lib/librdmaemu_interpose.so");
  EXPECT_EQ(WithInterposer("", "/p/lib"), "/p/lib/librdmaemu_interpose.so");
  EXPECT_EQ(WithInterposer("libasan.so.8", "/p/lib"), "libasan.so.8:/p/lib/librdmaemu_interpose.so");
  EXPECT_EQ(WithInterposer("a.so /p/lib/librdmaemu_interpose.so", "/p/lib"),
            "a.so /p/lib/librdmaemu_interpose.so");
  EXPECT_EQ(WithInterposer("/p/lib/librdmaemu_interpose.so.bak", "/p/lib"),
            "/p/lib/librdmaemu_interpose.so.bak:/p/lib/librdmaemu_interpose.so");
  EXPECT_EQ(WithInterposer(nullptr, "/my dir/lib"), "librdmaemu_interpose.so");
  EXPECT_EQ(WithInterposer(nullptr, "/a:b"), "librdmaemu_interpose.so");
}

}  // namespace
}  // namespace rdmaemu::cli
