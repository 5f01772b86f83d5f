// A traffic class set in a GRH travels as RoCE v2 carries it, in the IP
// header's TOS byte (issue 14, item 3): from a UD address handle into the
// receiver's GRH (and back out of ibv_init_ah_from_wc), and from an RC QP's
// path on every packet both ways, on the wire (the receiving side's capture
// records the TOS its socket saw). On each engine backend.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "emulator/capture/capture.h"
#include "emulator/capture/pcap.h"
#include "tests/integration/rc_pair.h"

namespace {

using rdmaemu::testing::RcPairTest;

constexpr uint8_t kClass = 0x28;  // DSCP 10 (AF11), ECN 0

class TrafficClassTest : public RcPairTest {};

TEST_F(TrafficClassTest, AUdAhsTrafficClassArrivesInTheReceiversGrh) {
  ibv_qp_init_attr ua{};
  ua.send_cq = ua.recv_cq = cq_;
  ua.qp_type = IBV_QPT_UD;
  ua.cap = {8, 8, 1, 1, 0};
  ibv_qp* ud = Own(ibv_create_qp(pd_, &ua));
  ASSERT_NE(ud, nullptr);
  ASSERT_EQ(UdToRts(ud, 0x11, 0), 0);
  ibv_ah_attr av = Av(Gid(1), 1);
  av.grh.traffic_class = kClass;
  ibv_ah* ah = ibv_create_ah(pd_, &av);
  ASSERT_NE(ah, nullptr);

  ibv_sge rsge{reinterpret_cast<uintptr_t>(buf_.data() + 8192), 40 + 64, mr_->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 1;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_recv(ud, &rwr, &rbad), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 64, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 2;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = ud->qp_num;
  wr.wr.ud.remote_qkey = 0x11;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(ud, &wr, &bad), 0);
  auto wcs = Poll(2);
  ASSERT_EQ(wcs.size(), 2u);
  const ibv_wc* recv = wcs[0].wr_id == 1 ? &wcs[0] : &wcs[1];
  ASSERT_EQ(recv->status, IBV_WC_SUCCESS);
  // The GRH area of an IPv4 RoCE v2 receive holds the IPv4 header at 20.
  EXPECT_EQ(buf_[8192 + 20 + 1], kClass);
  ibv_ah_attr back{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx_, 1, const_cast<ibv_wc*>(recv),
                                reinterpret_cast<ibv_grh*>(buf_.data() + 8192), &back),
            0);
  EXPECT_EQ(back.grh.traffic_class, kClass);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST_F(TrafficClassTest, AnRcPathsTrafficClassIsOnEveryPacketOnTheWire) {
  char path[] = "/tmp/rdmaemu-tclass-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ibv_qp* a = CreateRc();
  ibv_qp* b = CreateRc();
  ASSERT_TRUE(a && b);
  ibv_gid gid = Gid(1);
  for (auto [qp, peer] : {std::pair{a, b}, std::pair{b, a}}) {
    ASSERT_EQ(ToInit(qp), 0);
    ibv_ah_attr av = Av(gid, 1);
    av.grh.traffic_class = kClass;
    ASSERT_EQ(ToRtr(qp, peer->qp_num, av), 0);
    ASSERT_EQ(ToRts(qp), 0);
  }
  ASSERT_TRUE(rdmaemu::capture::Start(path).ok());
  ASSERT_EQ(PostWrite(a, 3, 0, 4096, 3000), 0);  // three packets and an ACK
  auto wcs = Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  ASSERT_TRUE(rdmaemu::capture::Stop().ok());

  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  ASSERT_GT(file.size(), 24u);
  // The two QPs talk through the device's own address. A datagram from
  // another address is another process's (tests run side by side on
  // loopback, and an address is reused once its process exits): the
  // capture records it as it arrives, before the device drops it.
  const uint8_t* own = gid.raw + 12;
  size_t at = 24, frames = 0;  // pcap global header, then record header + frame
  while (at + 16 <= file.size()) {
    uint32_t caplen;
    std::memcpy(&caplen, file.data() + at + 8, 4);
    const uint8_t* frame = file.data() + at + 16;
    ASSERT_LE(at + 16 + caplen, file.size());
    ASSERT_GE(caplen, rdmaemu::capture::kFrameHeaderBytes);
    const uint8_t* ip = frame + rdmaemu::capture::kEthernetBytes;
    at += 16 + caplen;
    if (std::memcmp(ip + 12, own, 4) != 0 || std::memcmp(ip + 16, own, 4) != 0) continue;
    EXPECT_EQ(ip[1], kClass) << "frame " << frames;
    ++frames;
  }
  // Each packet is recorded leaving and arriving: the arriving copy's TOS is
  // the one the socket received.
  EXPECT_GE(frames, 8u);
}

}  // namespace
