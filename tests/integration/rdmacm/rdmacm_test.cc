// librdmacm's semantics as an application sees them: built against the
// system's <rdma/rdma_cma.h> and linked with -lrdmacm -libverbs like any
// program, and run through `rdmaemu run` (rdmacm_test.sh), which loads our
// librdmacm.so.1 and libibverbs.so.1. One process connects to itself (one
// emulated host, a loopback connection); the TwoProcess tests run as server
// and client in two processes when RDMACM_TEST_ROLE says so.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

// The emulated host's address: GID 0 of the first device's port 1.
in_addr DeviceAddress() {
  int n = 0;
  ibv_context** list = rdma_get_devices(&n);
  in_addr addr{};
  if (list != nullptr && n > 0) {
    ibv_gid gid{};
    if (ibv_query_gid(list[0], 1, 0, &gid) == 0) std::memcpy(&addr, &gid.raw[12], 4);
  }
  rdma_free_devices(list);
  return addr;
}

sockaddr_in Ipv4(in_addr addr, uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr = addr;
  sin.sin_port = htons(port);
  return sin;
}

// Waits up to 10 s for the next event on `channel`; it must be `type`.
rdma_cm_event* Expect(rdma_event_channel* channel, rdma_cm_event_type type) {
  if (!Readable(channel->fd, 10000)) {
    ADD_FAILURE() << "no event within 10 s, wanted " << rdma_event_str(type);
    return nullptr;
  }
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel, &event) != 0) {
    ADD_FAILURE() << "rdma_get_cm_event: " << std::strerror(errno);
    return nullptr;
  }
  EXPECT_EQ(event->event, type) << "got " << rdma_event_str(event->event) << " status "
                                << event->status;
  return event;
}

void ExpectAndAck(rdma_event_channel* channel, rdma_cm_event_type type) {
  if (rdma_cm_event* e = Expect(channel, type)) rdma_ack_cm_event(e);
}

ibv_qp_init_attr QpAttr(ibv_qp_type type) {
  ibv_qp_init_attr attr{};
  attr.qp_type = type;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 8;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  return attr;
}

class RdmaCm : public ::testing::Test {
 protected:
  void SetUp() override {
    channel_ = rdma_create_event_channel();
    ASSERT_NE(channel_, nullptr) << std::strerror(errno);
    address_ = DeviceAddress();
    ASSERT_NE(address_.s_addr, 0u) << "no emulated device";
  }
  void TearDown() override {
    if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  }

  // A listener on the host's address and a free port; returns the port.
  uint16_t Listen(rdma_cm_id** listener, rdma_port_space ps = RDMA_PS_TCP) {
    EXPECT_EQ(rdma_create_id(channel_, listener, this, ps), 0);
    sockaddr_in sin = Ipv4(address_, 0);
    EXPECT_EQ(rdma_bind_addr(*listener, reinterpret_cast<sockaddr*>(&sin)), 0)
        << std::strerror(errno);
    EXPECT_EQ(rdma_listen(*listener, 8), 0) << std::strerror(errno);
    return ntohs(rdma_get_src_port(*listener));
  }

  // A client id resolved to the host's `port`.
  rdma_cm_id* Resolved(uint16_t port, rdma_port_space ps = RDMA_PS_TCP) {
    rdma_cm_id* id = nullptr;
    EXPECT_EQ(rdma_create_id(channel_, &id, nullptr, ps), 0);
    sockaddr_in dst = Ipv4(address_, port);
    EXPECT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
    ExpectAndAck(channel_, RDMA_CM_EVENT_ADDR_RESOLVED);
    EXPECT_EQ(rdma_resolve_route(id, 2000), 0);
    ExpectAndAck(channel_, RDMA_CM_EVENT_ROUTE_RESOLVED);
    return id;
  }

  rdma_event_channel* channel_ = nullptr;
  in_addr address_{};
};

TEST_F(RdmaCm, ChannelFdIsReadableExactlyWhileAnEventIsQueued) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_FALSE(Readable(channel_->fd, 0));
  int flags = fcntl(channel_->fd, F_GETFL);
  ASSERT_EQ(fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK), 0);
  rdma_cm_event* event = nullptr;
  EXPECT_EQ(rdma_get_cm_event(channel_, &event), -1);
  EXPECT_EQ(errno, EAGAIN);
  sockaddr_in dst = Ipv4(address_, 7000);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  EXPECT_TRUE(Readable(channel_->fd, 1000));
  ASSERT_EQ(rdma_get_cm_event(channel_, &event), 0);
  EXPECT_EQ(event->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(event->id, id);
  EXPECT_NE(id->verbs, nullptr);
  rdma_ack_cm_event(event);
  EXPECT_FALSE(Readable(channel_->fd, 0));
  EXPECT_EQ(rdma_get_cm_event(channel_, &event), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(fcntl(channel_->fd, F_SETFL, flags), 0);
  // A blocking get sleeps until the next event.
  std::atomic<bool> got{false};
  std::thread reader([&] {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(channel_, &e) == 0) {
      got = e->event == RDMA_CM_EVENT_ROUTE_RESOLVED;
      rdma_ack_cm_event(e);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.load());
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  reader.join();
  EXPECT_TRUE(got.load());
  ASSERT_NE(id->route.path_rec, nullptr);
  EXPECT_EQ(id->route.num_paths, 1);
  EXPECT_EQ(id->route.path_rec->hop_limit, 64);
  EXPECT_EQ(id->route.path_rec->packet_life_time, 18);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(RdmaCm, DestroyWaitsForTheAck) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Ipv4(address_, 7000);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(event, nullptr);
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    rdma_destroy_id(id);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(destroyed.load()) << "rdma_destroy_id returned with an event unacked";
  rdma_ack_cm_event(event);
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

TEST_F(RdmaCm, DestroyDiscardsUnreadEvents) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Ipv4(address_, 7000);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_TRUE(Readable(channel_->fd, 1000));
  EXPECT_EQ(rdma_destroy_id(id), 0);
  EXPECT_FALSE(Readable(channel_->fd, 0)) << "the destroyed id's event is still counted";
}

TEST_F(RdmaCm, WrongStatesFailWithEinval) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  rdma_conn_param param{};
  EXPECT_EQ(rdma_connect(id, &param), -1);  // before resolve
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_accept(id, &param), -1);  // not a request
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_resolve_route(id, 100), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_cm_id* listener = nullptr;
  Listen(&listener);
  EXPECT_EQ(rdma_listen(listener, 8), -1);  // twice
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_accept(listener, &param), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_get_cm_event(nullptr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_ack_cm_event(nullptr), -1);
  EXPECT_EQ(rdma_destroy_id(nullptr), -1);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
  sockaddr_in nowhere = Ipv4(in_addr{htonl(0x7f0000fe)}, 0);  // 127.0.0.254, open already
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  if (address_.s_addr != nowhere.sin_addr.s_addr) {
    EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&nowhere)), -1);
    EXPECT_EQ(errno, EADDRNOTAVAIL);
  }
  EXPECT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&nowhere), nullptr), -1);
  EXPECT_EQ(errno, EINVAL);  // no device yet
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// perftest's -R client retries a refused connect by destroying its ids and
// resolving the destroyed ones again: the kernel finds no such id and says
// EINVAL, and so must the library, without following the pointer (it used
// to crash there). A made-up id is refused the same way.
TEST_F(RdmaCm, ADestroyedOrMadeUpIdFailsWithEinval) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_destroy_id(id), 0);
  sockaddr_in dst = Ipv4(address_, 7471);
  errno = 0;
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 100), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_resolve_route(id, 100), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_conn_param param{};
  errno = 0;
  EXPECT_EQ(rdma_connect(id, &param), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_destroy_id(id), -1) << "destroyed twice";
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_qp(id);  // no effect, no crash
  EXPECT_EQ(rdma_get_src_port(id), 0);

  alignas(rdma_cm_id) unsigned char garbage[sizeof(rdma_cm_id)];
  std::memset(garbage, 0xa5, sizeof garbage);
  auto* made_up = reinterpret_cast<rdma_cm_id*>(garbage);
  errno = 0;
  EXPECT_EQ(rdma_listen(made_up, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(made_up, reinterpret_cast<sockaddr*>(&dst)), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_set_option(made_up, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, garbage, 1), -1);
  EXPECT_EQ(errno, EINVAL);
}

// perftest -R retries a refused connect with the ids and channel it has
// destroyed: each use is refused, never followed (a destroyed channel's
// mutex is freed memory: locking it hung the program).
TEST_F(RdmaCm, ADestroyedOrMadeUpChannelIsRefused) {
  rdma_event_channel* gone = rdma_create_event_channel();
  ASSERT_NE(gone, nullptr);
  rdma_destroy_event_channel(gone);
  rdma_cm_id* id = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_create_id(gone, &id, nullptr, RDMA_PS_TCP), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_event* event = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(gone, &event), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_event_channel(gone);  // twice: a log line, nothing else

  alignas(rdma_event_channel) unsigned char garbage[sizeof(rdma_event_channel)];
  std::memset(garbage, 0xa5, sizeof garbage);
  auto* made_up = reinterpret_cast<rdma_event_channel*>(garbage);
  rdma_destroy_event_channel(made_up);
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  errno = 0;
  EXPECT_EQ(rdma_migrate_id(id, made_up), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// An event acknowledged twice: rdma-core frees it at the first
// acknowledgement; here the second is refused.
TEST_F(RdmaCm, AnEventAcknowledgedTwiceIsRefused) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = Ipv4(address_, 7471);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(rdma_ack_cm_event(event), 0);
  errno = 0;
  EXPECT_EQ(rdma_ack_cm_event(event), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);  // does not wait for the stray acknowledgement
}

TEST_F(RdmaCm, ConnectAcceptDisconnectWithPrivateDataBothWays) {
  rdma_cm_id* listener = nullptr;
  uint16_t port = Listen(&listener);
  rdma_cm_id* client = Resolved(port);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0) << std::strerror(errno);
  ASSERT_NE(client->send_cq, nullptr);
  EXPECT_EQ(client->send_cq->cq_context, client);
  const char req[] = "hello from the client";
  rdma_conn_param param{};
  param.private_data = req;
  param.private_data_len = sizeof req;
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  ASSERT_EQ(rdma_connect(client, &param), 0) << std::strerror(errno);

  rdma_cm_event* request = Expect(channel_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(request->listen_id, listener);
  rdma_cm_id* child = request->id;
  EXPECT_EQ(child->context, this);
  EXPECT_EQ(child->channel, channel_);
  ASSERT_GE(request->param.conn.private_data_len, sizeof req);
  EXPECT_STREQ(static_cast<const char*>(request->param.conn.private_data), req);
  EXPECT_EQ(request->param.conn.initiator_depth, 1);
  EXPECT_EQ(request->param.conn.qp_num, client->qp->qp_num);
  attr = QpAttr(IBV_QPT_RC);  // rdma_create_qp wrote the client's CQs into it
  ASSERT_EQ(rdma_create_qp(child, nullptr, &attr), 0) << std::strerror(errno);
  const char rep[] = "welcome from the server";
  rdma_conn_param accept{};
  accept.private_data = rep;
  accept.private_data_len = sizeof rep;
  accept.responder_resources = 1;
  accept.initiator_depth = 1;
  accept.rnr_retry_count = 7;
  ASSERT_EQ(rdma_accept(child, &accept), 0) << std::strerror(errno);
  rdma_ack_cm_event(request);

  // Both sides' ESTABLISHED, in either order.
  bool client_up = false, server_up = false;
  for (int i = 0; i < 2; ++i) {
    rdma_cm_event* e = Expect(channel_, RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_NE(e, nullptr);
    if (e->id == client) {
      client_up = true;
      ASSERT_GE(e->param.conn.private_data_len, sizeof rep);
      EXPECT_STREQ(static_cast<const char*>(e->param.conn.private_data), rep);
      EXPECT_EQ(e->param.conn.qp_num, child->qp->qp_num);
    } else {
      EXPECT_EQ(e->id, child);
      server_up = true;
    }
    rdma_ack_cm_event(e);
  }
  EXPECT_TRUE(client_up && server_up);
  for (rdma_cm_id* id : {client, child}) {
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(ibv_query_qp(id->qp, &qa, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_DEST_QPN, &qi), 0);
    EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
    EXPECT_TRUE(qa.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
    EXPECT_TRUE(qa.qp_access_flags & IBV_ACCESS_REMOTE_READ);
  }

  // One SEND across, through rdma_verbs.h's helpers.
  char rbuf[64] = {}, sbuf[64] = "data";
  ibv_mr* rmr = rdma_reg_msgs(child, rbuf, sizeof rbuf);
  ibv_mr* smr = rdma_reg_msgs(client, sbuf, sizeof sbuf);
  ASSERT_NE(rmr, nullptr);
  ASSERT_NE(smr, nullptr);
  ASSERT_EQ(rdma_post_recv(child, nullptr, rbuf, sizeof rbuf, rmr), 0);
  ASSERT_EQ(rdma_post_send(client, nullptr, sbuf, sizeof sbuf, smr, IBV_SEND_SIGNALED), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(child, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(rbuf, "data");

  ASSERT_EQ(rdma_disconnect(client), 0);
  bool client_down = false, server_down = false;
  for (int i = 0; i < 2; ++i) {
    rdma_cm_event* e = Expect(channel_, RDMA_CM_EVENT_DISCONNECTED);
    ASSERT_NE(e, nullptr);
    (e->id == client ? client_down : server_down) = true;
    if (e->id == child) {
      EXPECT_EQ(rdma_disconnect(child), 0);
    }
    rdma_ack_cm_event(e);
  }
  EXPECT_TRUE(client_down && server_down);
  rdma_dereg_mr(rmr);
  rdma_dereg_mr(smr);
  rdma_destroy_qp(client);
  rdma_destroy_qp(child);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
  // TIMEWAIT_EXIT events of destroyed ids were discarded with them.
}

TEST_F(RdmaCm, RejectCarriesReasonAndPrivateData) {
  rdma_cm_id* listener = nullptr;
  uint16_t port = Listen(&listener);
  rdma_cm_id* client = Resolved(port);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0);
  ASSERT_EQ(rdma_connect(client, nullptr), 0);
  rdma_cm_event* request = Expect(channel_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(request, nullptr);
  rdma_cm_id* child = request->id;
  const char why[] = "go away";
  ASSERT_EQ(rdma_reject(child, why, sizeof why), 0) << std::strerror(errno);
  rdma_ack_cm_event(request);
  rdma_cm_event* rejected = Expect(channel_, RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->id, client);
  EXPECT_EQ(rejected->status, 28);
  ASSERT_GE(rejected->param.conn.private_data_len, sizeof why);
  EXPECT_STREQ(static_cast<const char*>(rejected->param.conn.private_data), why);
  rdma_ack_cm_event(rejected);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(client->qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
  rdma_destroy_qp(client);
  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

TEST_F(RdmaCm, ConnectToAPortNobodyListensOnIsRejectedAtOnce) {
  rdma_cm_id* listener = nullptr;
  uint16_t port = Listen(&listener);
  EXPECT_EQ(rdma_destroy_id(listener), 0);  // the port is free again
  rdma_cm_id* client = Resolved(port);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_RC);
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0);
  auto start = Clock::now();
  ASSERT_EQ(rdma_connect(client, nullptr), 0);
  rdma_cm_event* rejected = Expect(channel_, RDMA_CM_EVENT_REJECTED);
  ASSERT_NE(rejected, nullptr);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(rejected->status, 8);  // invalid service ID
  rdma_ack_cm_event(rejected);
  rdma_destroy_qp(client);
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

TEST_F(RdmaCm, ListenerDestroyWaitsForItsRequestsAcks) {
  rdma_cm_id* listener = nullptr;
  uint16_t port = Listen(&listener);
  rdma_cm_id* client = Resolved(port);
  rdma_conn_param param{};
  param.qp_num = 0x123;  // QP-less connect
  ASSERT_EQ(rdma_connect(client, &param), 0);
  rdma_cm_event* request = Expect(channel_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(request, nullptr);
  rdma_cm_id* child = request->id;
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    rdma_destroy_id(listener);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(destroyed.load());
  rdma_ack_cm_event(request);
  destroyer.join();
  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(client), 0);
}

TEST_F(RdmaCm, SyncApiCreateEpGetRequestConnect) {
  std::string host = inet_ntoa(address_);
  rdma_addrinfo hints{}, *passive = nullptr, *active = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo(host.c_str(), "0", &hints, &passive), 0);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_RC);
  attr.sq_sig_all = 1;
  rdma_cm_id* listener = nullptr;
  ASSERT_EQ(rdma_create_ep(&listener, passive, nullptr, &attr), 0) << std::strerror(errno);
  ASSERT_EQ(rdma_listen(listener, 4), 0);
  std::string port = std::to_string(ntohs(rdma_get_src_port(listener)));

  std::atomic<bool> server_ok{false};
  std::thread server([&] {
    rdma_cm_id* id = nullptr;
    if (rdma_get_request(listener, &id) != 0) return;
    char buf[16] = {};
    ibv_mr* mr = rdma_reg_msgs(id, buf, sizeof buf);
    rdma_post_recv(id, nullptr, buf, sizeof buf, mr);
    if (rdma_accept(id, nullptr) != 0) return;
    ibv_wc wc{};
    if (rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS) {
      server_ok = std::strcmp(buf, "sync") == 0;
    }
    rdma_disconnect(id);
    rdma_dereg_mr(mr);
    rdma_destroy_ep(id);
  });

  hints = {};
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo(host.c_str(), port.c_str(), &hints, &active), 0);
  rdma_cm_id* client = nullptr;
  attr = QpAttr(IBV_QPT_RC);
  attr.sq_sig_all = 1;
  ASSERT_EQ(rdma_create_ep(&client, active, nullptr, &attr), 0) << std::strerror(errno);
  ASSERT_EQ(rdma_connect(client, nullptr), 0) << std::strerror(errno);
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_ESTABLISHED);
  char msg[16] = "sync";
  ibv_mr* mr = rdma_reg_msgs(client, msg, sizeof msg);
  ASSERT_EQ(rdma_post_send(client, nullptr, msg, sizeof msg, mr, 0), 0);
  ibv_wc wc{};
  EXPECT_EQ(rdma_get_send_comp(client, &wc), 1);
  // Both sides disconnect: a sync rdma_disconnect returns once the peer
  // answers (its DREP, or its own DREQ), so joining the server first would
  // leave its DREQ unanswered until its retries ran out (~6 s).
  EXPECT_EQ(rdma_disconnect(client), 0);
  server.join();
  EXPECT_TRUE(server_ok.load());
  rdma_dereg_mr(mr);
  rdma_destroy_ep(client);
  rdma_destroy_ep(listener);
  rdma_freeaddrinfo(passive);
  rdma_freeaddrinfo(active);
}

// A request reaches a listener only for the listener's QP type (the
// kernel's cma_ib_check_req_qp_type): an XRC initiator's REQ to an RC
// listener is rejected, and the listener never sees it.
TEST_F(RdmaCm, AnXrcRequestToAnRcListenerIsRejected) {
  std::string host = inet_ntoa(address_);
  rdma_addrinfo hints{}, *passive = nullptr, *active = nullptr;
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_IB;
  hints.ai_qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_getaddrinfo(host.c_str(), "0", &hints, &passive), 0);
  rdma_cm_id* listener = nullptr;
  ASSERT_EQ(rdma_create_ep(&listener, passive, nullptr, nullptr), 0) << std::strerror(errno);
  ASSERT_EQ(rdma_listen(listener, 4), 0);
  std::string port = std::to_string(ntohs(rdma_get_src_port(listener)));
  hints = {};
  hints.ai_port_space = RDMA_PS_IB;
  hints.ai_qp_type = IBV_QPT_XRC_SEND;
  ASSERT_EQ(rdma_getaddrinfo(host.c_str(), port.c_str(), &hints, &active), 0);
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_XRC_SEND;
  attr.cap.max_send_wr = 1;
  attr.cap.max_send_sge = 1;
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_ep(&client, active, nullptr, &attr), 0) << std::strerror(errno);
  ASSERT_NE(client->qp, nullptr);
  EXPECT_EQ(client->qp->qp_type, IBV_QPT_XRC_SEND);
  EXPECT_EQ(rdma_connect(client, nullptr), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_FALSE(Readable(listener->channel->fd, 200));
  rdma_destroy_ep(client);
  rdma_destroy_ep(listener);
  rdma_freeaddrinfo(passive);
  rdma_freeaddrinfo(active);
}

TEST_F(RdmaCm, UdThroughSidr) {
  rdma_cm_id* listener = nullptr;
  uint16_t port = Listen(&listener, RDMA_PS_UDP);
  rdma_cm_id* client = Resolved(port, RDMA_PS_UDP);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0) << std::strerror(errno);
  const char hello[] = "sidr";
  rdma_conn_param param{};
  param.private_data = hello;
  param.private_data_len = sizeof hello;
  ASSERT_EQ(rdma_connect(client, &param), 0);
  rdma_cm_event* request = Expect(channel_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(request, nullptr);
  rdma_cm_id* child = request->id;
  EXPECT_EQ(child->qp_type, IBV_QPT_UD);
  ASSERT_GE(request->param.ud.private_data_len, sizeof hello);
  EXPECT_STREQ(static_cast<const char*>(request->param.ud.private_data), hello);
  attr = QpAttr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(child, nullptr, &attr), 0);
  char buf[64 + 40] = {};
  ibv_mr* rmr = rdma_reg_msgs(child, buf, sizeof buf);
  ASSERT_EQ(rdma_post_recv(child, nullptr, buf, sizeof buf, rmr), 0);
  ASSERT_EQ(rdma_accept(child, nullptr), 0) << std::strerror(errno);
  rdma_ack_cm_event(request);
  rdma_cm_event* up = Expect(channel_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->id, client);
  EXPECT_EQ(up->param.ud.qp_num, child->qp->qp_num);
  EXPECT_EQ(up->param.ud.qkey, RDMA_UDP_QKEY);
  EXPECT_EQ(up->param.ud.ah_attr.is_global, 1);
  ibv_ah* ah = ibv_create_ah(client->pd, &up->param.ud.ah_attr);
  ASSERT_NE(ah, nullptr);
  uint32_t qpn = up->param.ud.qp_num;
  rdma_ack_cm_event(up);
  char msg[64] = "datagram";
  ibv_mr* smr = rdma_reg_msgs(client, msg, sizeof msg);
  ASSERT_EQ(rdma_post_ud_send(client, nullptr, msg, sizeof msg, smr, IBV_SEND_SIGNALED, ah, qpn), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(child, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(buf + 40, "datagram");
  ibv_destroy_ah(ah);
  rdma_dereg_mr(rmr);
  rdma_dereg_mr(smr);
  rdma_destroy_qp(client);
  rdma_destroy_qp(child);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(child), 0);
  EXPECT_EQ(rdma_destroy_id(listener), 0);
}

// A group of 239/8 this run alone uses, so tests running at once never
// share one (the process id and a counter pick it).
sockaddr_in NewGroup() {
  static std::atomic<uint32_t> next{0};
  uint32_t n = (static_cast<uint32_t>(getpid()) * 64 + next++) % (1u << 23);
  in_addr group{htonl(0xef000000u | (n << 1) | 1)};
  return Ipv4(group, 0);
}

sockaddr* Sa(sockaddr_in* sin) { return reinterpret_cast<sockaddr*>(sin); }

// Polls `cq` for one completion for up to `timeout_ms`.
bool PollFor(ibv_cq* cq, ibv_wc* wc, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  do {
    if (ibv_poll_cq(cq, 1, wc) == 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (Clock::now() < deadline);
  return false;
}

// The GID RoCE v2 gives IPv4 group a.b.c.d: ::ffff:a.b.c.d.
ibv_gid GroupGid(const sockaddr_in& group) {
  ibv_gid gid{};
  gid.raw[10] = gid.raw[11] = 0xff;
  std::memcpy(&gid.raw[12], &group.sin_addr, 4);
  return gid;
}

class Multicast : public RdmaCm {
 protected:
  // A UD id of `ps` bound to the host's address.
  rdma_cm_id* BoundUd(rdma_port_space ps = RDMA_PS_UDP) {
    rdma_cm_id* id = nullptr;
    EXPECT_EQ(rdma_create_id(channel_, &id, nullptr, ps), 0);
    sockaddr_in sin = Ipv4(address_, 0);
    EXPECT_EQ(rdma_bind_addr(id, Sa(&sin)), 0) << std::strerror(errno);
    return id;
  }

  // A join's failure: -1 with `error`.
  void ExpectJoinFails(rdma_cm_id* id, sockaddr* addr, int error) {
    errno = 0;
    EXPECT_EQ(rdma_join_multicast(id, addr, nullptr), -1);
    EXPECT_EQ(errno, error) << std::strerror(errno);
  }
};

TEST_F(Multicast, JoinEventCarriesTheGroupAsTheKernelReportsIt) {
  rdma_cm_id* id = BoundUd();
  sockaddr_in group = NewGroup();
  int marker = 0;
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), &marker), 0) << std::strerror(errno);
  rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(event->id, id);
  EXPECT_EQ(event->status, 0);
  const rdma_ud_param& ud = event->param.ud;
  EXPECT_EQ(ud.private_data, &marker) << "private_data is the join's context";
  EXPECT_EQ(ud.private_data_len, 0);
  EXPECT_EQ(ud.qp_num, 0xFFFFFFu);
  EXPECT_EQ(ud.qkey, RDMA_UDP_QKEY);
  EXPECT_EQ(ud.ah_attr.is_global, 1);
  ibv_gid mgid = GroupGid(group);
  EXPECT_EQ(std::memcmp(ud.ah_attr.grh.dgid.raw, mgid.raw, 16), 0);
  char text[INET6_ADDRSTRLEN] = "";
  inet_ntop(AF_INET6, ud.ah_attr.grh.dgid.raw, text, sizeof text);
  char want[INET6_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &group.sin_addr, want, sizeof want);
  EXPECT_EQ(std::string(text), "::ffff:" + std::string(want));
  EXPECT_EQ(ud.ah_attr.grh.sgid_index, 0);
  EXPECT_EQ(ud.ah_attr.grh.hop_limit, 64);
  EXPECT_EQ(ud.ah_attr.dlid, 0);
  EXPECT_EQ(ud.ah_attr.sl, 0);
  EXPECT_EQ(ud.ah_attr.port_num, id->port_num);
  rdma_ack_cm_event(event);
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0) << std::strerror(errno);
  // rdma-core's answer for a group the id is not in.
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Multicast, SendOnlyJoinExOnAnIdResolvedToTheGroup) {
  // mckey's path without -b: no source, the group as destination.
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_IPOIB), 0);
  sockaddr_in group = NewGroup();
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&group), 2000), 0) << std::strerror(errno);
  ExpectAndAck(channel_, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_NE(id->verbs, nullptr);
  rdma_cm_join_mc_attr_ex attr{};
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  attr.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
  attr.addr = Sa(&group);
  ibv_qp_init_attr qp_attr = QpAttr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(id, nullptr, &qp_attr), 0) << std::strerror(errno);
  // Send-only: no attach, so this works before the device attaches QPs.
  ASSERT_EQ(rdma_join_multicast_ex(id, &attr, this), 0) << std::strerror(errno);
  rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(event->param.ud.private_data, this);
  EXPECT_EQ(event->param.ud.qkey, RDMA_UDP_QKEY);
  ibv_gid mgid = GroupGid(group);
  EXPECT_EQ(std::memcmp(event->param.ud.ah_attr.grh.dgid.raw, mgid.raw, 16), 0);
  rdma_ack_cm_event(event);
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0);
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Multicast, JoinsTheKernelRefusesFail) {
  sockaddr_in group = NewGroup();
  // No device yet: an idle id, and one bound to the any-address.
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_UDP), 0);
  ExpectJoinFails(id, Sa(&group), EINVAL);
  sockaddr_in any = Ipv4(in_addr{htonl(INADDR_ANY)}, 0);
  ASSERT_EQ(rdma_bind_addr(id, Sa(&any)), 0);
  ExpectJoinFails(id, Sa(&group), EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // Not UD.
  ASSERT_EQ(rdma_create_id(channel_, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in local = Ipv4(address_, 0);
  ASSERT_EQ(rdma_bind_addr(id, Sa(&local)), 0);
  ExpectJoinFails(id, Sa(&group), EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  // Not a group: the host's own address, another unicast one, 0.0.0.0.
  id = BoundUd();
  sockaddr_in unicast = Ipv4(address_, 0);
  ExpectJoinFails(id, Sa(&unicast), EINVAL);
  unicast = Ipv4(in_addr{htonl(0x0a010203)}, 0);
  ExpectJoinFails(id, Sa(&unicast), EINVAL);
  ExpectJoinFails(id, Sa(&any), EINVAL);
  // IPv6 and AF_IB groups: not on RoCE v2 here.
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "ff0e::1:2", &v6.sin6_addr);
  ExpectJoinFails(id, reinterpret_cast<sockaddr*>(&v6), EAFNOSUPPORT);
  sockaddr_storage ib{};
  ib.ss_family = AF_IB;
  ExpectJoinFails(id, reinterpret_cast<sockaddr*>(&ib), EAFNOSUPPORT);
  // rdma_join_multicast_ex's own checks (rdma-core's).
  rdma_cm_join_mc_attr_ex attr{};
  attr.addr = Sa(&group);
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
  EXPECT_EQ(rdma_join_multicast_ex(id, &attr, nullptr), -1);
  EXPECT_EQ(errno, ENOTSUP);
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  EXPECT_EQ(rdma_join_multicast_ex(id, &attr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
  EXPECT_EQ(rdma_join_multicast_ex(id, &attr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  attr.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
  EXPECT_EQ(rdma_join_multicast_ex(id, &attr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  // Leaves: a group never joined, a family that names no group.
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  sockaddr_storage unix_family{};
  unix_family.ss_family = AF_UNIX;
  EXPECT_EQ(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&unix_family)), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_FALSE(Readable(channel_->fd, 0)) << "a refused join queued an event";
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Multicast, JoiningAGroupTwiceIsTwoMembershipsAsInTheKernel) {
  // Neither the kernel's ucma nor its cma refuses a second join of the
  // same address: each gets its event, each is left on its own.
  rdma_cm_id* id = BoundUd();
  sockaddr_in group = NewGroup();
  int first = 1, second = 2;
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), &first), 0);
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), &second), 0);
  for (int* context : {&first, &second}) {
    rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
    ASSERT_NE(event, nullptr);
    EXPECT_EQ(event->param.ud.private_data, context);
    rdma_ack_cm_event(event);
  }
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0);
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0);
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Multicast, LeaveWaitsForTheJoinsAckAndDropsItIfUnread) {
  rdma_cm_id* id = BoundUd();
  sockaddr_in group = NewGroup();
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), nullptr), 0);
  rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
  ASSERT_NE(event, nullptr);
  std::atomic<bool> left{false};
  std::thread leaver([&] {
    EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0);
    left = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(left.load()) << "rdma_leave_multicast returned with the join's event unacked";
  rdma_ack_cm_event(event);
  leaver.join();
  EXPECT_TRUE(left.load());
  // Left before the event is read: the event goes, nothing waits.
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), nullptr), 0);
  ASSERT_TRUE(Readable(channel_->fd, 1000));
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0);
  EXPECT_FALSE(Readable(channel_->fd, 0)) << "the left group's event is still queued";
  // A group still joined when the QP and then the id go.
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), nullptr), 0);
  ExpectAndAck(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

TEST_F(Multicast, SyncJoinCompletesInTheCall) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP), 0);
  sockaddr_in local = Ipv4(address_, 0);
  ASSERT_EQ(rdma_bind_addr(id, Sa(&local)), 0);
  sockaddr_in group = NewGroup();
  int marker = 0;
  ASSERT_EQ(rdma_join_multicast(id, Sa(&group), &marker), 0) << std::strerror(errno);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_MULTICAST_JOIN);
  EXPECT_EQ(id->event->param.ud.private_data, &marker);
  EXPECT_EQ(id->event->param.ud.qp_num, 0xFFFFFFu);
  // The join's event is the id's own here: leaving does not wait for it.
  EXPECT_EQ(rdma_leave_multicast(id, Sa(&group)), 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
}

// The join attaches the receiver's QP (ibv_attach_mcast), and a send to the
// group from another id arrives; after the leave nothing more does.
TEST_F(Multicast, DatagramToTheGroupReachesItsMember) {
  sockaddr_in group = NewGroup();
  // The receiver: a full member with a QP, so the join attaches it.
  rdma_cm_id* receiver = BoundUd();
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(receiver, nullptr, &attr), 0) << std::strerror(errno);
  char buf[40 + 64] = {};
  ibv_mr* rmr = rdma_reg_msgs(receiver, buf, sizeof buf);
  ASSERT_NE(rmr, nullptr);
  ASSERT_EQ(rdma_post_recv(receiver, nullptr, buf, sizeof buf, rmr), 0);
  ASSERT_EQ(rdma_join_multicast(receiver, Sa(&group), nullptr), 0);
  rdma_cm_event* joined = Expect(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
  ASSERT_NE(joined, nullptr);
  ASSERT_EQ(joined->event, RDMA_CM_EVENT_MULTICAST_JOIN)
      << "the receiver's QP was not attached to the group (status " << joined->status
      << "): ibv_attach_mcast failed";
  rdma_ack_cm_event(joined);
  // The sender: a send-only member (no attach), another id of the host.
  rdma_cm_id* sender = BoundUd();
  attr = QpAttr(IBV_QPT_UD);
  ASSERT_EQ(rdma_create_qp(sender, nullptr, &attr), 0);
  rdma_cm_join_mc_attr_ex join{};
  join.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  join.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
  join.addr = Sa(&group);
  ASSERT_EQ(rdma_join_multicast_ex(sender, &join, nullptr), 0);
  rdma_cm_event* event = Expect(channel_, RDMA_CM_EVENT_MULTICAST_JOIN);
  ASSERT_NE(event, nullptr);
  ibv_ah* ah = ibv_create_ah(sender->pd, &event->param.ud.ah_attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);
  uint32_t qpn = event->param.ud.qp_num;
  rdma_ack_cm_event(event);
  char msg[64] = "to the group";
  ibv_mr* smr = rdma_reg_msgs(sender, msg, sizeof msg);
  ASSERT_EQ(rdma_post_ud_send(sender, nullptr, msg, sizeof msg, smr, IBV_SEND_SIGNALED, ah, qpn),
            0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(sender, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(PollFor(receiver->recv_cq, &wc, 5000)) << "the member received nothing";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.src_qp, sender->qp->qp_num);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
  EXPECT_EQ(wc.byte_len, 40u + sizeof msg);
  EXPECT_STREQ(buf + 40, "to the group");
  // Once the receiver has left, the group reaches nobody.
  ASSERT_EQ(rdma_post_recv(receiver, nullptr, buf, sizeof buf, rmr), 0);
  ASSERT_EQ(rdma_leave_multicast(receiver, Sa(&group)), 0);
  ASSERT_EQ(rdma_post_ud_send(sender, nullptr, msg, sizeof msg, smr, IBV_SEND_SIGNALED, ah, qpn),
            0);
  ASSERT_EQ(rdma_get_send_comp(sender, &wc), 1);
  EXPECT_FALSE(PollFor(receiver->recv_cq, &wc, 200)) << "a QP that left still receives";
  ibv_destroy_ah(ah);
  EXPECT_EQ(rdma_leave_multicast(sender, Sa(&group)), 0);
  rdma_dereg_mr(rmr);
  rdma_dereg_mr(smr);
  rdma_destroy_qp(receiver);
  rdma_destroy_qp(sender);
  EXPECT_EQ(rdma_destroy_id(receiver), 0);
  EXPECT_EQ(rdma_destroy_id(sender), 0);
}

// Two processes, each its own host: RDMACM_TEST_ROLE=server binds
// RDMACM_TEST_ADDRESS (making the device take it) and serves one
// connection; =client connects to it. Skipped otherwise.
TEST(TwoProcess, ServerAndClient) {
  const char* role = std::getenv("RDMACM_TEST_ROLE");
  const char* address = std::getenv("RDMACM_TEST_ADDRESS");
  if (role == nullptr || address == nullptr) GTEST_SKIP() << "run by rdmacm_test.sh";
  rdma_event_channel* channel = rdma_create_event_channel();
  ASSERT_NE(channel, nullptr);
  in_addr addr{};
  ASSERT_EQ(inet_pton(AF_INET, address, &addr), 1);
  sockaddr_in sin = Ipv4(addr, 7471);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP), 0);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_RC);
  const char text[] = "across processes";
  if (std::string(role) == "server") {
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sin)), 0) << std::strerror(errno);
    EXPECT_EQ(DeviceAddress().s_addr, addr.s_addr) << "the device did not take the address";
    ASSERT_EQ(rdma_listen(id, 1), 0);
    std::printf("listening\n");
    std::fflush(stdout);
    rdma_cm_event* request = Expect(channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(request, nullptr);
    rdma_cm_id* child = request->id;
    EXPECT_STREQ(static_cast<const char*>(request->param.conn.private_data), text);
    ASSERT_EQ(rdma_create_qp(child, nullptr, &attr), 0);
    rdma_conn_param param{};
    param.private_data = text;
    param.private_data_len = sizeof text;
    ASSERT_EQ(rdma_accept(child, &param), 0);
    rdma_ack_cm_event(request);
    ExpectAndAck(channel, RDMA_CM_EVENT_ESTABLISHED);
    ExpectAndAck(channel, RDMA_CM_EVENT_DISCONNECTED);
    rdma_disconnect(child);
    rdma_destroy_qp(child);
    rdma_destroy_id(child);
  } else {
    ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&sin), 2000), 0);
    ExpectAndAck(channel, RDMA_CM_EVENT_ADDR_RESOLVED);
    EXPECT_NE(id->route.addr.src_sin.sin_addr.s_addr, addr.s_addr);
    ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
    ExpectAndAck(channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
    ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0);
    rdma_conn_param param{};
    param.private_data = text;
    param.private_data_len = sizeof text;
    ASSERT_EQ(rdma_connect(id, &param), 0);
    rdma_cm_event* up = Expect(channel, RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_NE(up, nullptr);
    EXPECT_STREQ(static_cast<const char*>(up->param.conn.private_data), text);
    rdma_ack_cm_event(up);
    ASSERT_EQ(rdma_disconnect(id), 0);
    ExpectAndAck(channel, RDMA_CM_EVENT_DISCONNECTED);
    rdma_destroy_qp(id);
  }
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(channel);
}

// A program that exits with its connection open: its ids go as the
// kernel's do when the process's rdma_cm file closes, so the peer is
// disconnected at once instead of waiting on a connection nobody holds.
// RDMACM_TEST_ROLE=leaving-server accepts and exits; =staying-client
// connects and waits for DISCONNECTED.
TEST(TwoProcess, PeerThatExitsDisconnects) {
  const char* role = std::getenv("RDMACM_TEST_ROLE");
  const char* address = std::getenv("RDMACM_TEST_ADDRESS");
  if (role == nullptr || address == nullptr || std::string(role).find('-') == std::string::npos) {
    GTEST_SKIP() << "run by rdmacm_test.sh";
  }
  rdma_event_channel* channel = rdma_create_event_channel();
  ASSERT_NE(channel, nullptr);
  in_addr addr{};
  ASSERT_EQ(inet_pton(AF_INET, address, &addr), 1);
  sockaddr_in sin = Ipv4(addr, 7471);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP), 0);
  ibv_qp_init_attr attr = QpAttr(IBV_QPT_RC);
  if (std::string(role) == "leaving-server") {
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sin)), 0) << std::strerror(errno);
    ASSERT_EQ(rdma_listen(id, 1), 0);
    std::printf("listening\n");
    std::fflush(stdout);
    rdma_cm_event* request = Expect(channel, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(request, nullptr);
    rdma_cm_id* child = request->id;
    ASSERT_EQ(rdma_create_qp(child, nullptr, &attr), 0);
    rdma_conn_param param{};
    ASSERT_EQ(rdma_accept(child, &param), 0);
    rdma_ack_cm_event(request);
    ExpectAndAck(channel, RDMA_CM_EVENT_ESTABLISHED);
    std::exit(::testing::Test::HasFailure() ? 1 : 0);  // nothing destroyed
  }
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&sin), 2000), 0);
  ExpectAndAck(channel, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ExpectAndAck(channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
  ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0);
  rdma_conn_param param{};
  ASSERT_EQ(rdma_connect(id, &param), 0);
  ExpectAndAck(channel, RDMA_CM_EVENT_ESTABLISHED);
  ExpectAndAck(channel, RDMA_CM_EVENT_DISCONNECTED);  // the server's DREQ at its exit
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(channel);
}

}  // namespace
