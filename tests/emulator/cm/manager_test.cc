// The connection manager's state machine, two hosts in one test: each
// Manager is one process's CM on one device; a fake wire carries their MADs
// (and can lose them) and the test pumps it.
#include "emulator/cm/manager.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/cm/mad.h"
#include "emulator/device/hosts.h"

namespace rdmaemu::cm {
namespace {

using namespace std::chrono_literals;

// Events of every manager in the test, by handle; the deliver function is a
// plain function pointer, so they live here.
std::mutex events_mu;
std::vector<rdmaemu_cm_event> events;
uint64_t next_child_handle = 1000;

uint64_t Record(const rdmaemu_cm_event* e) {
  std::lock_guard lock(events_mu);
  events.push_back(*e);
  return e->event == RDMAEMU_CM_EVENT_CONNECT_REQUEST ? next_child_handle++ : 0;
}

uint32_t Ip(const char* s) { return inet_addr(s); }

// Queues what one manager sends; Pump hands it to the manager at its
// destination (never from inside SendMad: the sender holds its lock).
class Net {
 public:
  struct Mad {
    uint32_t src, dst;
    MadBytes bytes;
  };
  class Link : public Wire {
   public:
    Link(Net* net, uint32_t ip) : net_(net), ip_(ip) {}
    void SendMad(uint8_t, uint32_t dst_ip, uint8_t dst_slot, uint8_t, std::span<const uint8_t> mad) override {
      Mad m{ip_, dst_ip, {}};
      std::memcpy(m.bytes.data(), mad.data(), m.bytes.size());
      std::lock_guard lock(net_->mu);
      const auto attribute = static_cast<uint16_t>(ConstMadHeaderView(mad.first(kMadHeaderBytes)).attribute_id());
      ++net_->sent[attribute];
      net_->slots[attribute].push_back(dst_slot);
      net_->last[attribute] = m.bytes;
      if (net_->drop > 0) {
        --net_->drop;
        return;
      }
      net_->queue.push_back(m);
    }
    void Flush(std::chrono::steady_clock::time_point) override {}  // Pump delivers

   private:
    Net* net_;
    uint32_t ip_;
  };

  void Add(uint32_t ip, Manager* m) { hosts.emplace_back(ip, m); }
  // Delivers until nothing is queued (or `wait` passes with nothing new).
  void Pump(std::chrono::milliseconds wait = 50ms) {
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
      std::deque<Mad> q;
      {
        std::lock_guard lock(mu);
        q.swap(queue);
      }
      if (q.empty()) {
        std::this_thread::sleep_for(1ms);
        continue;
      }
      for (const Mad& m : q) {
        for (auto& [ip, manager] : hosts) {
          if (ip == m.dst) manager->OnMad(0, 1, m.src, m.bytes);
        }
      }
    }
  }
  int Sent(AttributeId id) {
    std::lock_guard lock(mu);
    return sent[static_cast<uint16_t>(id)];
  }

  std::mutex mu;
  std::deque<Mad> queue;
  int drop = 0;  // the next N MADs are lost
  std::map<uint16_t, int> sent;
  std::map<uint16_t, MadBytes> last;  // the last MAD sent of each attribute
  std::map<uint16_t, std::vector<uint8_t>> slots;  // the host slot each was sent to, in order
  std::vector<uint8_t> Slots(AttributeId id) {
    std::lock_guard lock(mu);
    return slots[static_cast<uint16_t>(id)];
  }
  MadBytes Last(AttributeId id) {
    std::lock_guard lock(mu);
    return last[static_cast<uint16_t>(id)];
  }
  std::vector<std::pair<uint32_t, Manager*>> hosts;
};

// Fast timers: every retry 32 ms + 2 * 4 ms, three retries; the MRA's
// wait 4 ms.
constexpr Timing kFast{.cm_response_timeout = 13, .packet_life_time = 10, .max_cm_retries = 3,
                       .mra_service_timeout = 10};

class ManagerTest : public ::testing::Test {
 protected:
  ManagerTest()
      : server_(kFast), client_(kFast), server_link_(&net_, Ip("127.0.0.2")), client_link_(&net_, Ip("127.0.0.3")) {
    {
      std::lock_guard lock(events_mu);
      events.clear();
    }
    EXPECT_TRUE(server_.Init(RDMAEMU_CM_ABI_VERSION, Record).ok());
    EXPECT_TRUE(client_.Init(RDMAEMU_CM_ABI_VERSION, Record).ok());
    server_.AttachDevice(0, 0x1111, {{Ip("127.0.0.2"), 5}}, &server_link_);
    client_.AttachDevice(0, 0x2222, {{Ip("127.0.0.3"), 5}}, &client_link_);
    net_.Add(Ip("127.0.0.2"), &server_);
    net_.Add(Ip("127.0.0.3"), &client_);
  }

  // A listener on the server's port 7471; returns its id.
  uint32_t Listen(uint64_t handle = 1, uint16_t ps = RDMAEMU_CM_PS_TCP) {
    auto id = server_.CreateId(handle, ps);
    EXPECT_TRUE(id.ok());
    sockaddr_in a = Addr("127.0.0.2", 7471);
    EXPECT_TRUE(server_.Bind(*id, 0, 1, &a).ok());
    EXPECT_TRUE(server_.Listen(*id, 0).ok());
    return *id;
  }
  // A client id bound to an ephemeral port that connects to `port`.
  uint32_t Connect(uint64_t handle, uint16_t port, uint8_t qp_type = RDMAEMU_CM_QPT_RC,
                   std::vector<uint8_t> data = {}, uint16_t ps = RDMAEMU_CM_PS_TCP) {
    auto id = client_.CreateId(handle, ps);
    EXPECT_TRUE(id.ok());
    sockaddr_in a = Addr("127.0.0.3", 0);
    EXPECT_TRUE(client_.Bind(*id, 0, 1, &a).ok());
    EXPECT_NE(a.sin_port, 0);
    rdmaemu_cm_param p{};
    p.qp_num = 0x42;
    p.starting_psn = 0x123456;
    p.qp_type = qp_type;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.path_mtu = 5;
    p.local_ack_timeout = 10;
    p.responder_resources = 1;
    p.initiator_depth = 1;
    std::memcpy(p.private_data, data.data(), data.size());
    p.private_data_len = static_cast<uint8_t>(data.size());
    sockaddr_in dst = Addr("127.0.0.2", port);
    Status s = client_.Connect(*id, dst, p);
    EXPECT_TRUE(s.ok()) << s.message();
    return *id;
  }
  static sockaddr_in Addr(const char* ip, uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = Ip(ip);
    a.sin_port = htons(port);
    return a;
  }
  // The events of `handle`, in order.
  static std::vector<rdmaemu_cm_event> Of(uint64_t handle) {
    std::lock_guard lock(events_mu);
    std::vector<rdmaemu_cm_event> out;
    for (const auto& e : events) {
      if (e.handle == handle) out.push_back(e);
    }
    return out;
  }
  static std::vector<int> Types(uint64_t handle) {
    std::vector<int> t;
    for (const auto& e : Of(handle)) t.push_back(e.event);
    return t;
  }
  // Waits for `handle` to have `n` events, pumping the wire.
  void WaitFor(uint64_t handle, size_t n, std::chrono::milliseconds limit = 2000ms) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (Of(handle).size() < n && std::chrono::steady_clock::now() < until) net_.Pump(5ms);
  }
  rdmaemu_cm_param Reply(uint32_t qpn) {
    rdmaemu_cm_param p{};
    p.qp_num = qpn;
    p.starting_psn = 0x654321;
    p.qp_type = RDMAEMU_CM_QPT_RC;
    p.rnr_retry_count = 7;
    p.qkey = 0x01234567;
    return p;
  }

  Net net_;
  Manager server_;
  Manager client_;
  Net::Link server_link_;
  Net::Link client_link_;
};

TEST_F(ManagerTest, ConnectAcceptEstablishDisconnect) {
  const uint32_t listener = Listen();
  const std::vector<uint8_t> hello = {'h', 'i'};
  const uint32_t active = Connect(2, 7471, RDMAEMU_CM_QPT_RC, hello);
  WaitFor(1, 1);
  auto req = Of(1);
  ASSERT_EQ(req.size(), 1u);
  EXPECT_EQ(req[0].event, RDMAEMU_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req[0].id, listener);
  EXPECT_EQ(req[0].param.qp_num, 0x42u);
  EXPECT_EQ(req[0].param.starting_psn, 0x123456u);
  EXPECT_EQ(req[0].param.private_data_len, kReqUserPrivateDataBytes);  // the whole field, zero-padded
  EXPECT_EQ(req[0].param.private_data[0], 'h');
  EXPECT_EQ(req[0].src.sin_addr.s_addr, Ip("127.0.0.2"));
  EXPECT_EQ(ntohs(req[0].src.sin_port), 7471);
  EXPECT_EQ(req[0].dst.sin_addr.s_addr, Ip("127.0.0.3"));
  EXPECT_EQ(req[0].param.local_ack_timeout, 10);
  const uint32_t child = req[0].child;
  ASSERT_TRUE(server_.Accept(child, Reply(0x77)).ok());
  WaitFor(2, 1);
  auto rep = Of(2);
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].event, RDMAEMU_CM_EVENT_CONNECT_RESPONSE);
  EXPECT_EQ(rep[0].param.qp_num, 0x77u);
  EXPECT_EQ(rep[0].param.starting_psn, 0x654321u);
  EXPECT_EQ(rep[0].param.private_data_len, kRepPrivateDataBytes);
  ASSERT_TRUE(client_.Establish(active).ok());
  // The child's handle is what the deliver function returned for it.
  std::vector<rdmaemu_cm_event> child_events;
  for (int i = 0; i < 200 && child_events.empty(); ++i) {
    net_.Pump(5ms);
    std::lock_guard lock(events_mu);
    for (const auto& e : events) {
      if (e.id == child) child_events.push_back(e);
    }
  }
  ASSERT_EQ(child_events.size(), 1u);
  EXPECT_EQ(child_events[0].event, RDMAEMU_CM_EVENT_ESTABLISHED);
  const uint64_t server_conn = child_events[0].handle;

  ASSERT_TRUE(client_.Disconnect(active).ok());
  WaitFor(server_conn, 2);
  EXPECT_EQ(Types(server_conn).back(), RDMAEMU_CM_EVENT_DISCONNECTED);
  ASSERT_TRUE(server_.Disconnect(child).ok());  // answers the DREQ with DREP
  WaitFor(2, 3);
  EXPECT_EQ(Types(2), (std::vector<int>{RDMAEMU_CM_EVENT_CONNECT_RESPONSE, RDMAEMU_CM_EVENT_DISCONNECTED,
                                         RDMAEMU_CM_EVENT_TIMEWAIT_EXIT}));
  WaitFor(server_conn, 3);
  EXPECT_EQ(Types(server_conn).back(), RDMAEMU_CM_EVENT_TIMEWAIT_EXIT);
  // Each once, unless a retry timer fired first on a slow machine.
  EXPECT_GE(net_.Sent(AttributeId::kReq), 1);
  EXPECT_EQ(net_.Sent(AttributeId::kRtu), 1);
  EXPECT_GE(net_.Sent(AttributeId::kDreq), 1);
  EXPECT_GE(net_.Sent(AttributeId::kDrep), 1);
  EXPECT_TRUE(client_.DestroyId(active).ok());
  EXPECT_TRUE(server_.DestroyId(child).ok());
  EXPECT_TRUE(server_.DestroyId(listener).ok());
  EXPECT_EQ(server_.ids(), 0u);
  EXPECT_EQ(client_.ids(), 0u);
}

// XRC as the kernel's CM puts it on the wire: the REQ's transport is 3
// with extended type 1; the target answers with its QPN in the EECN field
// and the SRQ bit set, and the initiator takes the QPN from there.
TEST_F(ManagerTest, XrcTargetQpnTravelsAsTheEecn) {
  Listen(1, RDMAEMU_CM_PS_IB);
  const uint32_t active = Connect(2, 7471, RDMAEMU_CM_QPT_XRC_SEND, {}, RDMAEMU_CM_PS_IB);
  WaitFor(1, 1);
  const MadBytes req_mad = net_.Last(AttributeId::kReq);
  ConstReqView req(std::span<const uint8_t>(req_mad).subspan(kMadHeaderBytes));
  EXPECT_EQ(req.transport_service_type(), 3);
  EXPECT_EQ(req.extended_transport_type(), 1);
  EXPECT_EQ(req.local_qpn(), 0x42u);
  auto request = Of(1);
  ASSERT_EQ(request.size(), 1u);
  EXPECT_EQ(request[0].param.qp_type, RDMAEMU_CM_QPT_XRC_RECV);
  rdmaemu_cm_param reply = Reply(0x77);
  reply.qp_type = RDMAEMU_CM_QPT_XRC_RECV;
  ASSERT_TRUE(server_.Accept(request[0].child, reply).ok());
  WaitFor(2, 1);
  const MadBytes rep_mad = net_.Last(AttributeId::kRep);
  ConstRepView rep(std::span<const uint8_t>(rep_mad).subspan(kMadHeaderBytes));
  EXPECT_EQ(rep.local_qpn(), 0u);
  EXPECT_EQ(rep.local_eecn(), 0x77u);
  EXPECT_TRUE(rep.srq());
  auto response = Of(2);
  ASSERT_EQ(response.size(), 1u);
  EXPECT_EQ(response[0].event, RDMAEMU_CM_EVENT_CONNECT_RESPONSE);
  EXPECT_EQ(response[0].param.qp_num, 0x77u);
  EXPECT_EQ(response[0].param.qp_type, RDMAEMU_CM_QPT_XRC_SEND);
  EXPECT_TRUE(client_.Establish(active).ok());
  net_.Pump(20ms);
  EXPECT_EQ(net_.Sent(AttributeId::kRtu), 1);
}

// Transport type 3 without extended type 1, or RD (2), is no transport a
// RoCE CM connects: REJ "invalid transport type", and no request.
TEST_F(ManagerTest, UnknownTransportIsRejected) {
  Listen(1, RDMAEMU_CM_PS_IB);
  Connect(2, 7471, RDMAEMU_CM_QPT_XRC_SEND, {}, RDMAEMU_CM_PS_IB);
  net_.Pump(0ms);  // nothing delivered: the REQ is kept to be tampered with
  MadBytes req = net_.Last(AttributeId::kReq);
  {
    std::lock_guard lock(net_.mu);
    net_.queue.clear();
  }
  for (uint8_t transport : {uint8_t{3}, uint8_t{2}}) {
    ReqView v(std::span<uint8_t>(req).subspan(kMadHeaderBytes));
    v.set_transport_service_type(transport);
    v.set_extended_transport_type(0);
    v.set_local_comm_id(v.local_comm_id() + 1);
    server_.OnMad(0, 1, Ip("127.0.0.3"), req);
    const MadBytes rej_mad = net_.Last(AttributeId::kRej);
    ConstRejView rej(std::span<const uint8_t>(rej_mad).subspan(kMadHeaderBytes));
    EXPECT_EQ(rej.reason(), static_cast<uint16_t>(RejReason::kInvalidTransportType)) << int{transport};
    EXPECT_EQ(rej.remote_comm_id(), v.local_comm_id());
  }
  EXPECT_TRUE(Of(1).empty());
}

TEST_F(ManagerTest, NobodyListeningIsRejectedAtOnce) {
  Listen();  // on 7471
  Connect(2, 7472);
  WaitFor(2, 1, 100ms);
  auto e = Of(2);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].event, RDMAEMU_CM_EVENT_REJECTED);
  EXPECT_EQ(e[0].status, static_cast<int>(RejReason::kInvalidServiceId));
  EXPECT_EQ(net_.Sent(AttributeId::kReq), 1);  // no retry
}

TEST_F(ManagerTest, RejectCarriesReasonAndPrivateData) {
  Listen();
  Connect(2, 7471);
  WaitFor(1, 1);
  const uint8_t why[3] = {1, 2, 3};
  ASSERT_TRUE(server_.Reject(Of(1)[0].child, 28, why).ok());
  WaitFor(2, 1);
  auto e = Of(2);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].event, RDMAEMU_CM_EVENT_REJECTED);
  EXPECT_EQ(e[0].status, 28);
  EXPECT_EQ(e[0].param.private_data_len, kRejPrivateDataBytes);
  EXPECT_EQ(e[0].param.private_data[2], 3);
}

TEST_F(ManagerTest, LostReqIsRetried) {
  Listen();
  net_.drop = 1;
  Connect(2, 7471);
  WaitFor(1, 1);
  ASSERT_EQ(Types(1), std::vector<int>{RDMAEMU_CM_EVENT_CONNECT_REQUEST});
  EXPECT_EQ(net_.Sent(AttributeId::kReq), 2);
}

// A REQ names a service; the process at the address that listens there is
// looked up in the subnet directory (device/hosts.h) at every try, not only
// at the first: Debian's qperf sends its client the port before its server
// child listens, and a child at a host slot > 0 records its listener only
// then, so the first REQ went to slot 0 and, before each retry looked
// again, so did every retry.
TEST_F(ManagerTest, ReqRetryGoesWhereTheListenerIsNowRecorded) {
  const std::string dir = ::testing::TempDir() + "/manager-subnet-" + std::to_string(::getpid());
  ::setenv("RDMAEMU_SUBNET_DIR", dir.c_str(), 1);
  Listen();
  net_.drop = 1;
  Connect(2, 7471);
  EXPECT_EQ(net_.Slots(AttributeId::kReq), std::vector<uint8_t>{0}) << "nobody recorded: slot 0's";
  // The listener records itself after the first REQ left (the record is
  // this process's, so it counts as live).
  in_addr server{};
  server.s_addr = Ip("127.0.0.2");
  ASSERT_TRUE(device::hosts::Listen(server, RDMAEMU_CM_PS_TCP, 7471, 3).ok());
  WaitFor(1, 1);
  ASSERT_EQ(Types(1), std::vector<int>{RDMAEMU_CM_EVENT_CONNECT_REQUEST});
  EXPECT_EQ(net_.Slots(AttributeId::kReq), (std::vector<uint8_t>{0, 3}));
  device::hosts::StopListening(server, RDMAEMU_CM_PS_TCP, 7471);
  ::unsetenv("RDMAEMU_SUBNET_DIR");
}

TEST_F(ManagerTest, NoAnswerEndsUnreachable) {
  Listen();
  net_.drop = 1000;
  Connect(2, 7471);
  WaitFor(2, 1);
  auto e = Of(2);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].event, RDMAEMU_CM_EVENT_UNREACHABLE);
  EXPECT_EQ(e[0].status, -ETIMEDOUT);
  EXPECT_GE(net_.Sent(AttributeId::kReq), 1 + kFast.max_cm_retries);
}

TEST_F(ManagerTest, DuplicateReqAfterAcceptGetsTheRepAgain) {
  Listen();
  const uint32_t active = Connect(2, 7471);
  WaitFor(1, 1);
  // The REP is lost; the client's REQ retry must fetch it again.
  net_.drop = 1;
  ASSERT_TRUE(server_.Accept(Of(1)[0].child, Reply(0x77)).ok());
  WaitFor(2, 1);
  ASSERT_EQ(Types(2), std::vector<int>{RDMAEMU_CM_EVENT_CONNECT_RESPONSE});
  EXPECT_GE(net_.Sent(AttributeId::kRep), 2);
  EXPECT_EQ(Types(1).size(), 1u);  // still one CONNECT_REQUEST
  EXPECT_TRUE(client_.Establish(active).ok());
}

TEST_F(ManagerTest, DestroyingAConnectedIdDisconnectsThePeer) {
  Listen();
  const uint32_t active = Connect(2, 7471);
  WaitFor(1, 1);
  const uint32_t child = Of(1)[0].child;
  ASSERT_TRUE(server_.Accept(child, Reply(0x77)).ok());
  WaitFor(2, 1);
  ASSERT_TRUE(client_.Establish(active).ok());
  net_.Pump();
  ASSERT_TRUE(client_.DestroyId(active).ok());
  net_.Pump();
  std::vector<int> child_types;
  {
    std::lock_guard lock(events_mu);
    for (const auto& e : events) {
      if (e.id == child) child_types.push_back(e.event);
    }
  }
  EXPECT_EQ(child_types, (std::vector<int>{RDMAEMU_CM_EVENT_ESTABLISHED, RDMAEMU_CM_EVENT_DISCONNECTED}));
  EXPECT_EQ(Types(2).size(), 1u);  // nothing more for a destroyed id
  ASSERT_TRUE(server_.DestroyId(child).ok());  // sends the DREP the client still waits for
  net_.Pump();
  EXPECT_EQ(client_.ids(), 0u);
}

// A program that ends with connections open: the kernel destroys its ids
// when the process's rdma_cm file closes, so the peer hears of it at once.
TEST_F(ManagerTest, ProcessEndAnswersEveryPeer) {
  Listen();
  const uint32_t active = Connect(2, 7471);
  WaitFor(1, 1);
  const uint32_t child = Of(1)[0].child;
  ASSERT_TRUE(server_.Accept(child, Reply(0x77)).ok());
  WaitFor(2, 1);
  ASSERT_TRUE(client_.Establish(active).ok());
  net_.Pump();
  ASSERT_TRUE(client_.Disconnect(active).ok());  // DREQ; the server never answers itself
  net_.Pump();
  const int dreps = net_.Sent(AttributeId::kDrep);
  server_.CloseForExit();  // in DREQ received: the DREP the client waits for
  net_.Pump();
  EXPECT_EQ(server_.ids(), 0u);
  EXPECT_EQ(net_.Sent(AttributeId::kDrep), dreps + 1);
  WaitFor(2, 3);  // CONNECT_RESPONSE, DISCONNECTED on the DREP, TIMEWAIT_EXIT
  const std::vector<int> types = Types(2);
  EXPECT_NE(std::find(types.begin(), types.end(), RDMAEMU_CM_EVENT_DISCONNECTED), types.end());

}

TEST_F(ManagerTest, ProcessEndDisconnectsAnEstablishedPeerOnce) {
  Listen();
  const uint32_t active = Connect(2, 7471);
  WaitFor(1, 1);
  const uint32_t child = Of(1)[0].child;
  ASSERT_TRUE(server_.Accept(child, Reply(0x77)).ok());
  WaitFor(2, 1);
  ASSERT_TRUE(client_.Establish(active).ok());
  net_.Pump();
  net_.drop = 1;  // the one DREQ is lost: nobody is left to retry it
  client_.CloseForExit();
  net_.Pump(200ms);  // longer than a retry interval
  EXPECT_EQ(client_.ids(), 0u);
  EXPECT_EQ(net_.Sent(AttributeId::kDreq), 1);

  const uint32_t again = Connect(3, 7471);
  WaitFor(1, 2);
  const uint32_t child2 = Of(1)[1].child;
  ASSERT_TRUE(server_.Accept(child2, Reply(0x78)).ok());
  WaitFor(3, 1);
  ASSERT_TRUE(client_.Establish(again).ok());
  net_.Pump();
  client_.CloseForExit();
  net_.Pump();
  std::vector<int> child_types;
  {
    std::lock_guard lock(events_mu);
    for (const auto& e : events) {
      if (e.id == child2) child_types.push_back(e.event);
    }
  }
  EXPECT_EQ(child_types, (std::vector<int>{RDMAEMU_CM_EVENT_ESTABLISHED, RDMAEMU_CM_EVENT_DISCONNECTED}));
}

TEST_F(ManagerTest, SidrResolvesTheServiceQp) {
  Listen(1, RDMAEMU_CM_PS_UDP);
  Connect(2, 7471, RDMAEMU_CM_QPT_UD, {'u'}, RDMAEMU_CM_PS_UDP);
  WaitFor(1, 1);
  auto req = Of(1);
  ASSERT_EQ(req.size(), 1u);
  EXPECT_EQ(req[0].param.qp_type, RDMAEMU_CM_QPT_UD);
  EXPECT_EQ(req[0].param.private_data_len, kSidrReqUserPrivateDataBytes);
  EXPECT_EQ(req[0].param.private_data[0], 'u');
  ASSERT_TRUE(server_.Accept(req[0].child, Reply(0x99)).ok());
  WaitFor(2, 1);
  auto e = Of(2);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].event, RDMAEMU_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(e[0].param.qp_num, 0x99u);
  EXPECT_EQ(e[0].param.qkey, 0x01234567u);
}

TEST_F(ManagerTest, SidrToNobodyIsUnsupported) {
  Connect(2, 7000, RDMAEMU_CM_QPT_UD, {}, RDMAEMU_CM_PS_UDP);
  WaitFor(2, 1);
  auto e = Of(2);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].event, RDMAEMU_CM_EVENT_UNREACHABLE);
  EXPECT_EQ(e[0].status, static_cast<int>(SidrStatus::kUnsupported));
}

TEST_F(ManagerTest, PortSpaceRules) {
  Listen();
  auto id = server_.CreateId(5, RDMAEMU_CM_PS_TCP);
  ASSERT_TRUE(id.ok());
  sockaddr_in a = Addr("127.0.0.2", 7471);
  EXPECT_EQ(server_.Bind(*id, 0, 1, &a).code(), EADDRINUSE);
  a = Addr("0.0.0.0", 7471);
  EXPECT_EQ(server_.Bind(*id, -1, 1, &a).code(), EADDRINUSE);
  // Another port space has its own ports.
  auto udp = server_.CreateId(6, RDMAEMU_CM_PS_UDP);
  a = Addr("127.0.0.2", 7471);
  EXPECT_TRUE(server_.Bind(*udp, 0, 1, &a).ok());
  // Not this device's address.
  a = Addr("127.0.0.9", 1000);
  EXPECT_EQ(server_.Bind(*id, 0, 1, &a).code(), EADDRNOTAVAIL);
  // REUSEADDR lets two ids share a port that nobody listens on.
  auto r1 = server_.CreateId(7, RDMAEMU_CM_PS_TCP);
  auto r2 = server_.CreateId(8, RDMAEMU_CM_PS_TCP);
  ASSERT_TRUE(server_.SetOption(*r1, RDMAEMU_CM_OPT_REUSEADDR, 1).ok());
  ASSERT_TRUE(server_.SetOption(*r2, RDMAEMU_CM_OPT_REUSEADDR, 1).ok());
  a = Addr("127.0.0.2", 9000);
  ASSERT_TRUE(server_.Bind(*r1, 0, 1, &a).ok());
  a = Addr("127.0.0.2", 9000);
  EXPECT_TRUE(server_.Bind(*r2, 0, 1, &a).ok());
  EXPECT_EQ(server_.SetOption(*r2, RDMAEMU_CM_OPT_REUSEADDR, 0).code(), EINVAL);  // after bind
}

TEST_F(ManagerTest, CallsInTheWrongState) {
  const uint32_t listener = Listen();
  EXPECT_EQ(server_.Listen(listener, 0).code(), EINVAL);                     // twice
  EXPECT_EQ(server_.Accept(listener, Reply(1)).code(), EINVAL);              // no request
  EXPECT_EQ(server_.Reject(listener, 28, {}).code(), EINVAL);
  EXPECT_EQ(server_.Disconnect(listener).code(), EINVAL);
  EXPECT_EQ(server_.Establish(listener).code(), EINVAL);
  auto unbound = client_.CreateId(9, RDMAEMU_CM_PS_TCP);
  rdmaemu_cm_param p{};
  p.qp_type = RDMAEMU_CM_QPT_RC;
  EXPECT_EQ(client_.Connect(*unbound, Addr("127.0.0.2", 7471), p).code(), EINVAL);  // no device yet
  EXPECT_EQ(client_.Listen(*unbound, 0).code(), EINVAL);                            // not bound
  EXPECT_EQ(client_.DestroyId(12345).code(), ENOENT);
  EXPECT_EQ(client_.CreateId(1, 0x4242).status().code(), EINVAL);
  // Private data longer than a REQ carries.
  sockaddr_in a = Addr("127.0.0.3", 0);
  ASSERT_TRUE(client_.Bind(*unbound, 0, 1, &a).ok());
  p.private_data_len = kReqUserPrivateDataBytes + 1;
  EXPECT_EQ(client_.Connect(*unbound, Addr("127.0.0.2", 7471), p).code(), EINVAL);
}

TEST_F(ManagerTest, HostileMadsAreDroppedAndCounted) {
  Listen();
  MadBytes junk{};
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  server_.OnMad(0, 1, Ip("127.0.0.3"), junk);
  server_.OnMad(0, 1, Ip("127.0.0.3"), std::span<const uint8_t>(junk).first(100));  // short
  // A REQ with a CMA header of another version.
  MadBytes req = Encode(Req{.local_comm_id = 5, .service_id = 0x1061d2f, .path_mtu = 5}, 1);
  ReqView(std::span<uint8_t>(req).subspan(kMadHeaderBytes)).private_data()[0] = 7;
  server_.OnMad(0, 1, Ip("127.0.0.3"), req);
  // Answers for connections that do not exist.
  server_.OnMad(0, 1, Ip("127.0.0.3"), Encode(Rep{.local_comm_id = 9, .remote_comm_id = 77}, 2));
  server_.OnMad(0, 1, Ip("127.0.0.3"), EncodeRtu({9, 77}, 3));
  server_.OnMad(0, 1, Ip("127.0.0.3"), Encode(Rej{9, 77, 0, 28, {}}, 4));
  EXPECT_GE(server_.dropped(), 4u);
  EXPECT_TRUE(Of(1).empty());
  // A random fuzz of headers that pass the check.
  for (int i = 0; i < 2000; ++i) {
    MadBytes m{};
    for (auto& b : m) b = static_cast<uint8_t>(std::rand());
    InitMad(m, static_cast<AttributeId>(0x10 + i % 9), i);
    for (size_t j = kMadHeaderBytes; j < m.size(); ++j) m[j] = static_cast<uint8_t>(std::rand());
    server_.OnMad(0, 1, Ip("127.0.0.3"), m);
  }
  net_.Pump(10ms);
  SUCCEED();
}

}  // namespace
}  // namespace rdmaemu::cm
