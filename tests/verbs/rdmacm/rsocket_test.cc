// The rsocket stubs (verbs/rdmacm/rsocket.cc): every entry point of
// rdma/rsocket.h fails with errno ENOSYS and its failure value, and touches
// none of its arguments.

#include <errno.h>
#include <fcntl.h>
#include <rdma/rsocket.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

struct Call {
  std::string name;
  std::function<long long()> run;
};

TEST(Rsocket, EveryCallFailsWithEnosys) {
  char buf[16] = {};
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  pollfd pfd{-1, POLLIN, 0};
  fd_set set;
  FD_ZERO(&set);
  timeval tv{};
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  const std::vector<Call> calls = {
      {"rsocket", [&]() -> long long { return rsocket(AF_INET, SOCK_STREAM, 0); }},
      {"rbind", [&]() -> long long { return rbind(3, sa, len); }},
      {"rlisten", [&]() -> long long { return rlisten(3, 1); }},
      {"raccept", [&]() -> long long { return raccept(3, sa, &len); }},
      {"rconnect", [&]() -> long long { return rconnect(3, sa, len); }},
      {"rshutdown", [&]() -> long long { return rshutdown(3, SHUT_RDWR); }},
      {"rclose", [&]() -> long long { return rclose(3); }},
      {"rrecv", [&]() -> long long { return rrecv(3, buf, sizeof(buf), 0); }},
      {"rrecvfrom", [&]() -> long long { return rrecvfrom(3, buf, sizeof(buf), 0, sa, &len); }},
      {"rrecvmsg", [&]() -> long long { return rrecvmsg(3, &msg, 0); }},
      {"rsend", [&]() -> long long { return rsend(3, buf, sizeof(buf), 0); }},
      {"rsendto", [&]() -> long long { return rsendto(3, buf, sizeof(buf), 0, sa, len); }},
      {"rsendmsg", [&]() -> long long { return rsendmsg(3, &msg, 0); }},
      {"rread", [&]() -> long long { return rread(3, buf, sizeof(buf)); }},
      {"rreadv", [&]() -> long long { return rreadv(3, &iov, 1); }},
      {"rwrite", [&]() -> long long { return rwrite(3, buf, sizeof(buf)); }},
      {"rwritev", [&]() -> long long { return rwritev(3, &iov, 1); }},
      {"rpoll", [&]() -> long long { return rpoll(&pfd, 1, 0); }},
      {"rselect", [&]() -> long long { return rselect(1, &set, nullptr, nullptr, &tv); }},
      {"rgetpeername", [&]() -> long long { return rgetpeername(3, sa, &len); }},
      {"rgetsockname", [&]() -> long long { return rgetsockname(3, sa, &len); }},
      {"rsetsockopt", [&]() -> long long { return rsetsockopt(3, SOL_RDMA, RDMA_SQSIZE, buf, 4); }},
      {"rgetsockopt", [&]() -> long long { return rgetsockopt(3, SOL_RDMA, RDMA_SQSIZE, buf, &len); }},
      {"rfcntl", [&]() -> long long { return rfcntl(3, F_GETFL); }},
      {"riomap", [&]() -> long long { return riomap(3, buf, sizeof(buf), PROT_WRITE, 0, -1); }},
      {"riounmap", [&]() -> long long { return riounmap(3, buf, sizeof(buf)); }},
  };
  ASSERT_EQ(calls.size(), 26u);  // and riowrite, below
  for (const auto& c : calls) {
    errno = 0;
    EXPECT_EQ(c.run(), -1) << c.name;
    EXPECT_EQ(errno, ENOSYS) << c.name;
  }
  errno = 0;
  EXPECT_EQ(riowrite(3, buf, sizeof(buf), 0, 0), SIZE_MAX);
  EXPECT_EQ(errno, ENOSYS);
  EXPECT_EQ(len, sizeof(addr));
}

// A second call fails the same way (the warning is once; the failure always).
TEST(Rsocket, FailsEveryTime) {
  for (int i = 0; i < 3; ++i) {
    errno = 0;
    EXPECT_EQ(rsocket(AF_INET, SOCK_STREAM, 0), -1);
    EXPECT_EQ(errno, ENOSYS);
  }
}

}  // namespace
