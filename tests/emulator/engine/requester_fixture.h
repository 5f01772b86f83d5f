// The RC requester's tests against a fake responder: an emulated RC QP
// connected to FakePeer, a UDP socket in the test that reads the engine's
// requests and answers with crafted ACKs, NAKs and read responses.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "emulator/wire/psn.h"
#include "tests/emulator/engine/fake_peer.h"

namespace rdmaemu::testing {

class RequesterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu_.ok());
    peer_ = std::make_unique<FakePeer>(emu_.ip(), emu_.udp_port());
    ASSERT_TRUE(peer_->ok()) << "cannot bind the fake peer";
    buf_ = emu_.Register(16384, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(buf_, nullptr);
    for (size_t i = 0; i < buf_->data.size(); ++i) buf_->data[i] = static_cast<uint8_t>(i * 13);
  }

  // The next request packet; fails the test if none comes.
  RxPacket NextRequest(std::chrono::milliseconds timeout = 2000ms) {
    auto rx = peer_->Receive(timeout);
    EXPECT_TRUE(rx.has_value()) << "no request from the engine";
    if (!rx) return {};
    EXPECT_TRUE(rx->icrc_ok);
    EXPECT_EQ(rx->dest_qpn, kPeerQpn);
    return *rx;
  }

  void Ack(ibv_qp* qp, uint32_t psn, uint8_t syndrome = wire::AckSyndrome(), uint32_t msn = 0) {
    peer_->Send(FakePeer::Ack(qp->qp_num, psn, syndrome, msn));
  }

  EmuRc emu_;
  std::unique_ptr<FakePeer> peer_;
  EmuRc::Buffer* buf_ = nullptr;
};

}  // namespace rdmaemu::testing
