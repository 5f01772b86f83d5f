// The control socket's framing: round trips, and every malformed or stalled
// frame refused with a message, within its deadline.
#include "emulator/control/protocol.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace rdmaemu::control {
namespace {

using namespace std::chrono_literals;

struct Pair {
  int a = -1, b = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = fds[0];
    b = fds[1];
  }
  ~Pair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
  void Send(const std::string& bytes) { ASSERT_EQ(::write(a, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size())); }
};

std::string U32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

Status RequestError(const std::string& bytes) {
  Pair p;
  p.Send(bytes);
  ::shutdown(p.a, SHUT_WR);
  auto r = ReadRequest(p.b, Clock::now() + 1s);
  EXPECT_FALSE(r.ok());
  return r.status();
}

TEST(ProtocolTest, RequestRoundTrip) {
  std::vector<std::string> words = {"event", "qp_fatal", "--qp", "17", ""};
  Pair p;
  p.Send(EncodeRequest(words));
  auto r = ReadRequest(p.b, Clock::now() + 1s);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, words);
}

TEST(ProtocolTest, ReplyRoundTrip) {
  Reply reply{2, "some output\n", std::string("err\0with nul", 12)};
  Pair p;
  p.Send(EncodeReply(reply));
  auto r = ReadReply(p.b, Clock::now() + 1s);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 2);
  EXPECT_EQ(r->out, reply.out);
  EXPECT_EQ(r->err, reply.err);
}

TEST(ProtocolTest, MalformedRequestsAreRefusedWithAReason) {
  Status s = RequestError("GET / HTTP/1.0\r\n\r\n");
  EXPECT_EQ(s.code(), EPROTO);
  EXPECT_NE(s.message().find("bad magic"), std::string::npos);

  s = RequestError("RDEQ" + U32(7) + U32(2) + std::string("a\0", 2));
  EXPECT_EQ(s.code(), EPROTO);
  EXPECT_NE(s.message().find("version 7"), std::string::npos);

  s = RequestError("RDEQ" + U32(kVersion) + U32(0));
  EXPECT_NE(s.message().find("empty request"), std::string::npos);

  s = RequestError("RDEQ" + U32(kVersion) + U32(kMaxRequestBytes + 1));
  EXPECT_NE(s.message().find("at most"), std::string::npos);

  s = RequestError("RDEQ" + U32(kVersion) + U32(3) + "abc");
  EXPECT_NE(s.message().find("NUL-terminated"), std::string::npos);

  std::string many;
  for (size_t i = 0; i <= kMaxWords; ++i) many += std::string("w\0", 2);
  s = RequestError("RDEQ" + U32(kVersion) + U32(static_cast<uint32_t>(many.size())) + many);
  EXPECT_NE(s.message().find("more than"), std::string::npos);

  // Truncated: the peer closes mid-frame.
  s = RequestError("RDEQ" + U32(kVersion) + U32(10) + std::string("ab\0", 3));
  EXPECT_EQ(s.code(), EPROTO);
  EXPECT_NE(s.message().find("closed after 3 of 10 bytes"), std::string::npos);
  s = RequestError("RD");
  EXPECT_NE(s.message().find("closed after 2 of 12"), std::string::npos);
}

TEST(ProtocolTest, OversizedReplyIsRefused) {
  Pair p;
  p.Send("RDEP" + U32(kVersion) + U32(0) + U32(kMaxReplyText + 1) + U32(0));
  auto r = ReadReply(p.b, Clock::now() + 1s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EPROTO);
}

TEST(ProtocolTest, LongReplyTextIsCutWithANote) {
  Reply big{0, std::string(kMaxReplyText + 100, 'x'), ""};
  std::string frame = EncodeReply(big);
  EXPECT_LE(frame.size(), 20 + kMaxReplyText);
  EXPECT_NE(frame.find("output cut"), std::string::npos);
}

TEST(ProtocolTest, AStalledPeerTimesOut) {
  Pair p;
  p.Send("RDEQ");  // and then nothing
  auto start = Clock::now();
  auto r = ReadRequest(p.b, start + 200ms);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ETIMEDOUT);
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(ProtocolTest, ACancelFdAbandonsTheRead) {
  Pair p, cancel;
  cancel.Send("x");
  auto r = ReadRequest(p.b, Clock::now() + 10s, cancel.b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ECANCELED);
}

TEST(ProtocolTest, WritingToAClosedPeerFailsWithoutSigpipe) {
  Pair p;
  ::close(p.b);
  p.b = -1;
  Status s = WriteAll(p.a, std::string(1 << 20, 'x'), Clock::now() + 1s);
  EXPECT_EQ(s.code(), EPIPE);
}

TEST(ProtocolTest, RuntimeDirFollowsXdgRuntimeDir) {
  const char* old = std::getenv("XDG_RUNTIME_DIR");
  std::string saved = old ? old : "";
  ::unsetenv("RDMAEMU_CONTROL_DIR");
  ::setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  EXPECT_EQ(RuntimeDir(), "/run/user/4242/rdmaemu");
  EXPECT_EQ(SearchDirs().size(), 2u);
  ::unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(RuntimeDir(), "/tmp/rdmaemu-" + std::to_string(::getuid()));
  EXPECT_EQ(SearchDirs().size(), 1u);
  ::setenv("RDMAEMU_CONTROL_DIR", "/x/ctl", 1);
  EXPECT_EQ(RuntimeDir(), "/x/ctl");
  ::setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  EXPECT_EQ(RuntimeDir(), "/x/ctl");
  EXPECT_EQ(SearchDirs(), std::vector<std::string>{"/x/ctl"});
  ::unsetenv("RDMAEMU_CONTROL_DIR");
  ::unsetenv("XDG_RUNTIME_DIR");
  if (old) ::setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
  EXPECT_EQ(SocketPath("/d", 12), "/d/12.sock");
}

TEST(ProtocolTest, PrepareDirCreatesAPrivateDirectoryAndRefusesOthers) {
  std::string base = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  std::string dir = base + "/prepare-" + std::to_string(::getpid());
  ASSERT_TRUE(PrepareDir(dir).ok());
  struct stat st{};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(PrepareDir(dir).ok()) << "an existing private directory is fine";

  ::chmod(dir.c_str(), 0755);
  Status open = PrepareDir(dir);
  EXPECT_EQ(open.code(), EPERM);
  EXPECT_NE(open.message().find("open to other users"), std::string::npos) << open.message();
  ::chmod(dir.c_str(), 0700);

  // Only root can give the directory away (not in every sandbox either).
  if (::chown(dir.c_str(), 12345, 12345) == 0) {
    Status foreign = PrepareDir(dir);
    EXPECT_EQ(foreign.code(), EPERM);
    EXPECT_NE(foreign.message().find("belongs to uid 12345"), std::string::npos) << foreign.message();
    ASSERT_EQ(::chown(dir.c_str(), 0, 0), 0);
  }

  std::string file = dir + "/file";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  Status not_dir = PrepareDir(file);
  EXPECT_EQ(not_dir.code(), EPERM);
  EXPECT_NE(not_dir.message().find("not a directory"), std::string::npos);
}

}  // namespace
}  // namespace rdmaemu::control
