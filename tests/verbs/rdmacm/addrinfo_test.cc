// rdma_getaddrinfo / rdma_freeaddrinfo (verbs/rdmacm/addrinfo.cc): each answer
// compared with what plain getaddrinfo gives for the hints rdma-core 44 maps
// the RDMA hints to, and the fields rdma-core fills (QP type, port space,
// source or destination address and length, flags).

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <infiniband/ib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace {

// getaddrinfo's first answer for `node`/`service` with the given hints.
struct SocketAnswer {
  int ret = 0;
  addrinfo* ai = nullptr;
  ~SocketAnswer() {
    if (ai != nullptr) freeaddrinfo(ai);
  }
};

void Lookup(SocketAnswer* out, const char* node, const char* service, int flags, int family,
            int socktype, int protocol) {
  addrinfo hints{};
  hints.ai_flags = flags;
  hints.ai_family = family;
  hints.ai_socktype = socktype;
  hints.ai_protocol = protocol;
  out->ret = getaddrinfo(node, service, &hints, &out->ai);
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

class RdmaGetaddrinfo : public ::testing::Test {
 protected:
  void TearDown() override { rdma_freeaddrinfo(res_); }
  rdma_addrinfo* res_ = nullptr;
};

TEST_F(RdmaGetaddrinfo, NumericIpv4IsTheDestination) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_qp_type = IBV_QPT_RC;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res_), 0) << strerror(errno);

  SocketAnswer want;
  Lookup(&want, "127.0.0.1", "7471", AI_NUMERICHOST, 0, SOCK_STREAM, IPPROTO_TCP);
  ASSERT_EQ(want.ret, 0);

  EXPECT_EQ(res_->ai_flags, 0);
  EXPECT_EQ(res_->ai_family, AF_INET);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_TCP);
  ASSERT_NE(res_->ai_dst_addr, nullptr);
  EXPECT_EQ(res_->ai_dst_len, sizeof(sockaddr_in));
  EXPECT_EQ(res_->ai_dst_len, want.ai->ai_addrlen);
  EXPECT_EQ(Bytes(res_->ai_dst_addr, res_->ai_dst_len), Bytes(want.ai->ai_addr, want.ai->ai_addrlen));
  const auto* in = reinterpret_cast<const sockaddr_in*>(res_->ai_dst_addr);
  EXPECT_EQ(in->sin_family, AF_INET);
  EXPECT_EQ(be16toh(in->sin_port), 7471);
  EXPECT_EQ(be32toh(in->sin_addr.s_addr), 0x7f000001u);
  EXPECT_EQ(res_->ai_src_addr, nullptr);
  EXPECT_EQ(res_->ai_src_len, 0u);
  // No canonical name is asked for; no ibacm, so no route or connect data.
  EXPECT_EQ(res_->ai_src_canonname, nullptr);
  EXPECT_EQ(res_->ai_dst_canonname, nullptr);
  EXPECT_EQ(res_->ai_route, nullptr);
  EXPECT_EQ(res_->ai_route_len, 0u);
  EXPECT_EQ(res_->ai_connect, nullptr);
  EXPECT_EQ(res_->ai_connect_len, 0u);
  EXPECT_EQ(res_->ai_next, nullptr);
}

TEST_F(RdmaGetaddrinfo, NumericIpv6) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo("::1", "18515", &hints, &res_), 0) << strerror(errno);

  SocketAnswer want;
  Lookup(&want, "::1", "18515", AI_NUMERICHOST, 0, 0, IPPROTO_TCP);
  ASSERT_EQ(want.ret, 0);
  EXPECT_EQ(res_->ai_family, AF_INET6);
  EXPECT_EQ(res_->ai_dst_len, sizeof(sockaddr_in6));
  EXPECT_EQ(Bytes(res_->ai_dst_addr, res_->ai_dst_len), Bytes(want.ai->ai_addr, want.ai->ai_addrlen));
  // No QP type in the hints: the answer's SOCK_STREAM makes it RC.
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_RC);
}

TEST_F(RdmaGetaddrinfo, PassiveFillsTheSource) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, "7471", &hints, &res_), 0) << strerror(errno);

  SocketAnswer want;
  Lookup(&want, nullptr, "7471", AI_PASSIVE, 0, 0, IPPROTO_TCP);
  ASSERT_EQ(want.ret, 0);

  EXPECT_EQ(res_->ai_flags, RAI_PASSIVE);
  EXPECT_EQ(res_->ai_family, want.ai->ai_family);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_TCP);
  ASSERT_NE(res_->ai_src_addr, nullptr);
  EXPECT_EQ(res_->ai_src_len, want.ai->ai_addrlen);
  EXPECT_EQ(Bytes(res_->ai_src_addr, res_->ai_src_len), Bytes(want.ai->ai_addr, want.ai->ai_addrlen));
  EXPECT_EQ(res_->ai_dst_addr, nullptr);
  EXPECT_EQ(res_->ai_dst_len, 0u);
  EXPECT_EQ(res_->ai_next, nullptr);
}

TEST_F(RdmaGetaddrinfo, PassiveNumericBindAddress) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.2", "7471", &hints, &res_), 0) << strerror(errno);
  ASSERT_NE(res_->ai_src_addr, nullptr);
  EXPECT_EQ(res_->ai_src_len, sizeof(sockaddr_in));
  const auto* in = reinterpret_cast<const sockaddr_in*>(res_->ai_src_addr);
  EXPECT_EQ(be32toh(in->sin_addr.s_addr), 0x7f000002u);
  EXPECT_EQ(be16toh(in->sin_port), 7471);
  EXPECT_EQ(res_->ai_dst_addr, nullptr);
}

TEST_F(RdmaGetaddrinfo, BadHostIsGetaddrinfosOwnError) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  SocketAnswer want;
  Lookup(&want, "not-an-address", "7471", AI_NUMERICHOST, 0, 0, IPPROTO_TCP);
  EXPECT_EQ(want.ret, EAI_NONAME);
  EXPECT_EQ(rdma_getaddrinfo("not-an-address", "7471", &hints, &res_), EAI_NONAME);
  EXPECT_EQ(res_, nullptr);
}

TEST_F(RdmaGetaddrinfo, BadServiceIsGetaddrinfosOwnError) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  SocketAnswer want;
  Lookup(&want, "127.0.0.1", "no-such-service-here", AI_NUMERICHOST, 0, 0, IPPROTO_TCP);
  ASSERT_NE(want.ret, 0);
  EXPECT_EQ(rdma_getaddrinfo("127.0.0.1", "no-such-service-here", &hints, &res_), want.ret);
}

TEST_F(RdmaGetaddrinfo, UdQpTypeGivesTheUdpPortSpace) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_qp_type = IBV_QPT_UD;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res_), 0) << strerror(errno);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_UD);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_UDP);
}

TEST_F(RdmaGetaddrinfo, UdpPortSpaceGivesUd) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_UDP;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res_), 0) << strerror(errno);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_UD);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_UDP);
}

TEST_F(RdmaGetaddrinfo, IbPortSpaceKeepsTheQpTypesProtocol) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_qp_type = IBV_QPT_UD;
  hints.ai_port_space = RDMA_PS_IB;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res_), 0) << strerror(errno);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_UD);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_IB);
  EXPECT_EQ(res_->ai_dst_len, sizeof(sockaddr_in));
}

// NULL hints are getaddrinfo's NULL hints: the first answer (glibc lists
// SOCK_STREAM first) decides the QP type and port space.
TEST_F(RdmaGetaddrinfo, NoHintsFollowTheFirstAnswer) {
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", nullptr, &res_), 0) << strerror(errno);
  SocketAnswer want;
  ASSERT_EQ(getaddrinfo("127.0.0.1", "7471", nullptr, &want.ai), 0);
  ASSERT_EQ(want.ai->ai_socktype, SOCK_STREAM);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(res_->ai_family, AF_INET);
  EXPECT_EQ(Bytes(res_->ai_dst_addr, res_->ai_dst_len), Bytes(want.ai->ai_addr, want.ai->ai_addrlen));
}

TEST_F(RdmaGetaddrinfo, FamilyHintRestrictsTheLookup) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST | RAI_FAMILY;
  hints.ai_family = AF_INET6;
  hints.ai_port_space = RDMA_PS_TCP;
  SocketAnswer want;
  Lookup(&want, "127.0.0.1", "7471", AI_NUMERICHOST, AF_INET6, 0, IPPROTO_TCP);
  ASSERT_NE(want.ret, 0);
  EXPECT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res_), want.ret);
  EXPECT_EQ(res_, nullptr);
}

// AF_IB with RAI_FAMILY and RAI_NUMERICHOST: the IPv6 address as a GID, the
// service ID of the port space and port.
TEST_F(RdmaGetaddrinfo, AfIbNumericIpv6) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST | RAI_FAMILY;
  hints.ai_family = AF_IB;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo("fe80::1", "7471", &hints, &res_), 0) << strerror(errno);
  EXPECT_EQ(res_->ai_family, AF_IB);
  ASSERT_EQ(res_->ai_dst_len, sizeof(sockaddr_ib));
  const auto* sib = reinterpret_cast<const sockaddr_ib*>(res_->ai_dst_addr);
  EXPECT_EQ(sib->sib_family, AF_IB);
  EXPECT_EQ(be16toh(sib->sib_pkey), 0xffff);
  in6_addr want{};
  ASSERT_EQ(inet_pton(AF_INET6, "fe80::1", &want), 1);
  EXPECT_EQ(Bytes(sib->sib_addr.sib_raw, 16), Bytes(want.s6_addr, 16));
  EXPECT_EQ(be64toh(sib->sib_sid), RDMA_IB_IP_PS_TCP | 7471);
  EXPECT_EQ(be64toh(sib->sib_sid_mask), RDMA_IB_IP_PS_MASK | RDMA_IB_IP_PORT_MASK);
}

// Neither node nor service: the answer is the hints, addresses copied.
TEST_F(RdmaGetaddrinfo, HintsOnly) {
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htobe32(0x7f000003);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htobe16(9999);
  dst.sin_addr.s_addr = htobe32(0x7f000004);
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_family = AF_INET;
  hints.ai_qp_type = IBV_QPT_UD;
  hints.ai_port_space = RDMA_PS_UDP;
  hints.ai_src_addr = reinterpret_cast<sockaddr*>(&src);
  hints.ai_src_len = sizeof(src);
  hints.ai_dst_addr = reinterpret_cast<sockaddr*>(&dst);
  hints.ai_dst_len = sizeof(dst);
  ASSERT_EQ(rdma_getaddrinfo(nullptr, nullptr, &hints, &res_), 0) << strerror(errno);
  EXPECT_EQ(res_->ai_flags, RAI_NUMERICHOST);
  EXPECT_EQ(res_->ai_family, AF_INET);
  EXPECT_EQ(res_->ai_qp_type, IBV_QPT_UD);
  EXPECT_EQ(res_->ai_port_space, RDMA_PS_UDP);
  ASSERT_EQ(res_->ai_src_len, sizeof(src));
  ASSERT_EQ(res_->ai_dst_len, sizeof(dst));
  EXPECT_NE(res_->ai_src_addr, hints.ai_src_addr);  // copies, freed with the result
  EXPECT_NE(res_->ai_dst_addr, hints.ai_dst_addr);
  EXPECT_EQ(Bytes(res_->ai_src_addr, sizeof(src)), Bytes(&src, sizeof(src)));
  EXPECT_EQ(Bytes(res_->ai_dst_addr, sizeof(dst)), Bytes(&dst, sizeof(dst)));
}

// An active lookup keeps the hints' source address (rdma_create_ep binds it).
TEST_F(RdmaGetaddrinfo, ActiveKeepsTheHintsSource) {
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htobe32(0x7f000005);
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_src_addr = reinterpret_cast<sockaddr*>(&src);
  hints.ai_src_len = sizeof(src);
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res_), 0) << strerror(errno);
  ASSERT_EQ(res_->ai_src_len, sizeof(src));
  EXPECT_EQ(Bytes(res_->ai_src_addr, sizeof(src)), Bytes(&src, sizeof(src)));
  EXPECT_EQ(res_->ai_dst_len, sizeof(sockaddr_in));
}

TEST_F(RdmaGetaddrinfo, NothingAskedIsEinval) {
  errno = 0;
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res_), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(res_, nullptr);
}

// rdma_freeaddrinfo frees every element of a chain and what each one holds
// (a chain a program built from malloc'ed parts; ASan would report a leak).
TEST(RdmaFreeaddrinfo, FreesTheWholeChain) {
  rdma_addrinfo* head = nullptr;
  for (int i = 0; i < 3; ++i) {
    auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
    ASSERT_NE(rai, nullptr);
    rai->ai_dst_addr = static_cast<sockaddr*>(std::calloc(1, sizeof(sockaddr_in)));
    rai->ai_src_addr = static_cast<sockaddr*>(std::calloc(1, sizeof(sockaddr_in)));
    rai->ai_dst_canonname = strdup("dst");
    rai->ai_src_canonname = strdup("src");
    rai->ai_route = std::malloc(64);
    rai->ai_connect = std::malloc(56);
    rai->ai_next = head;
    head = rai;
  }
  rdma_freeaddrinfo(head);
  rdma_freeaddrinfo(nullptr);
}

// Run by :addrinfo_no_device_test, whose RDMAEMU_CONFIG names a file that does
// not exist: libibverbs lists no device.
TEST(NoDevice, IsEnodev) {
  const char* config = std::getenv("RDMAEMU_CONFIG");
  if (config == nullptr || std::string(config) != "/nonexistent/rdmaemu-devices.conf") {
    GTEST_SKIP() << "run by :addrinfo_no_device_test (RDMAEMU_CONFIG naming no file)";
  }
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(res, nullptr);
}

}  // namespace
