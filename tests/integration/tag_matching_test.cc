// Tag matching on SRQs (IBV_SRQT_TM) through the verbs API, on one device
// in one process: an RC sender whose SENDs begin with a TMH, and an RC
// receiver on a TM SRQ whose list operations and messages complete on an
// extended CQ with IBV_WC_EX_WITH_TM_INFO. Eager and rendezvous matches,
// unexpected messages and the sync they need, NO_TAG, tag deletion, and the
// errors bad input gets (docs/tag-matching.md).
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "tests/integration/rc_pair.h"

namespace rdmaemu::testing {
namespace {

// Layout of buf_: what the sender sends, its rendezvous data, the
// receiver's ordinary receives, tagged buffers, the sender's receives.
constexpr size_t kSendAt = 0;
constexpr size_t kRndvDataAt = 0x10000;
constexpr size_t kRecvAt = 0x20000;  // ordinary receive i at kRecvAt + i * kSlot
constexpr size_t kTagAt = 0x40000;   // tagged buffer i at kTagAt + i * kSlot
constexpr size_t kFinAt = 0x60000;
constexpr uint32_t kSlot = 0x2000;
constexpr int kOrdinaryRecvs = 8;

struct TmCompletion {
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  unsigned flags = 0;
  uint32_t byte_len = 0;
  ibv_wc_tm_info tm{};
};

class TagMatchingTest : public RcPairTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(RcPairTest::SetUp());
    ibv_device_attr_ex dev{};
    ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dev), 0);
    caps_ = dev.tm_caps;
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 256;
    ca.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO};
    tm_cq_ = ibv_create_cq_ex(ctx_, &ca);
    ASSERT_NE(tm_cq_, nullptr) << strerror(errno);
  }
  void DestroyExtras() override {
    if (srq_) {
      EXPECT_EQ(ibv_destroy_srq(srq_), 0);
    }
    if (tm_cq_) {
      EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(tm_cq_)), 0);
    }
  }

  ibv_srq_init_attr_ex TmAttr(uint32_t max_num_tags) {
    ibv_srq_init_attr_ex a{};
    a.attr.max_wr = 64;
    a.attr.max_sge = 1;
    a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
                  IBV_SRQ_INIT_ATTR_TM;
    a.srq_type = IBV_SRQT_TM;
    a.pd = pd_;
    a.cq = ibv_cq_ex_to_cq(tm_cq_);
    a.tm_cap.max_num_tags = max_num_tags;
    a.tm_cap.max_ops = 10;
    return a;
  }

  // A TM SRQ with ordinary receives posted, a receiver QP on it (no send
  // queue, as rdma-core's test_tag_matching.py makes it) and a sender,
  // connected.
  void Build(uint32_t max_num_tags = 16) {
    ibv_srq_init_attr_ex a = TmAttr(max_num_tags);
    srq_ = ibv_create_srq_ex(ctx_, &a);
    ASSERT_NE(srq_, nullptr) << strerror(errno);
    for (int i = 0; i < kOrdinaryRecvs; ++i) {
      ibv_sge sge = Sge(kRecvAt + i * kSlot, kSlot);
      ibv_recv_wr wr{};
      wr.wr_id = 1000 + i;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_srq_recv(srq_, &wr, &bad), 0);
    }
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(tm_cq_);
    qa.srq = srq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap = {0, 0, 0, 0, 0};
    receiver_ = Own(ibv_create_qp(pd_, &qa));
    ASSERT_NE(receiver_, nullptr);
    sender_ = CreateRc();
    ASSERT_NE(sender_, nullptr);
    ASSERT_NO_FATAL_FAILURE(Connect(sender_, receiver_));
  }

  int Add(uint64_t op_wr_id, uint64_t tag, uint64_t recv_wr_id, size_t at, uint32_t len,
          uint32_t* handle, uint32_t unexpected_cnt = 0, int flags = IBV_OPS_SIGNALED) {
    ibv_sge sge = Sge(at, len);
    ibv_ops_wr wr{};
    wr.wr_id = op_wr_id;
    wr.opcode = IBV_WR_TAG_ADD;
    wr.flags = flags;
    wr.tm.unexpected_cnt = unexpected_cnt;
    wr.tm.add.recv_wr_id = recv_wr_id;
    wr.tm.add.sg_list = &sge;
    wr.tm.add.num_sge = 1;
    wr.tm.add.tag = tag;
    wr.tm.add.mask = 0xffff;
    ibv_ops_wr* bad = nullptr;
    int rc = ibv_post_srq_ops(srq_, &wr, &bad);
    if (handle != nullptr) *handle = wr.tm.handle;
    return rc;
  }
  int Op(ibv_ops_wr_opcode opcode, uint64_t op_wr_id, uint32_t handle, uint32_t unexpected_cnt,
         int flags = IBV_OPS_SIGNALED) {
    ibv_ops_wr wr{};
    wr.wr_id = op_wr_id;
    wr.opcode = opcode;
    wr.flags = flags;
    wr.tm.handle = handle;
    wr.tm.unexpected_cnt = unexpected_cnt;
    ibv_ops_wr* bad = nullptr;
    return ibv_post_srq_ops(srq_, &wr, &bad);
  }

  // Writes a TMH (and for RNDV an RVH naming `rndv_len` bytes at
  // kRndvDataAt) at kSendAt followed by `payload`, and sends it.
  void SendTagged(uint8_t op, uint64_t tag, uint32_t app_ctx, const std::string& payload,
                  uint32_t rndv_len = 0) {
    uint8_t* p = buf_.data() + kSendAt;
    std::memset(p, 0, 32);
    p[0] = op;
    uint32_t ctx_be = htobe32(app_ctx);
    uint64_t tag_be = htobe64(tag);
    std::memcpy(p + 4, &ctx_be, 4);
    std::memcpy(p + 8, &tag_be, 8);
    size_t header = sizeof(ibv_tmh);
    if (op == IBV_TMH_RNDV) {
      uint64_t va = htobe64(At(kRndvDataAt));
      uint32_t rkey = htobe32(mr_->rkey);
      uint32_t len = htobe32(rndv_len);
      std::memcpy(p + 16, &va, 8);
      std::memcpy(p + 24, &rkey, 4);
      std::memcpy(p + 28, &len, 4);
      header += sizeof(ibv_rvh);
    }
    std::memcpy(p + header, payload.data(), payload.size());
    ibv_sge sge = Sge(kSendAt, static_cast<uint32_t>(header + payload.size()));
    ibv_send_wr wr{};
    wr.wr_id = 77;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(sender_, &wr, &bad), 0);
    ibv_wc wc{};
    ASSERT_TRUE(Completion(sender_, 77, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  }

  // The next completion on the TM CQ within `ms`.
  bool NextTm(TmCompletion* out, int ms = 3000) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    ibv_poll_cq_attr attr{};
    int rc;
    while ((rc = ibv_start_poll(tm_cq_, &attr)) == ENOENT) {
      if (std::chrono::steady_clock::now() > until) return false;
    }
    if (rc != 0) return false;
    out->wr_id = tm_cq_->wr_id;
    out->status = tm_cq_->status;
    out->opcode = ibv_wc_read_opcode(tm_cq_);
    out->flags = ibv_wc_read_wc_flags(tm_cq_);
    out->byte_len = ibv_wc_read_byte_len(tm_cq_);
    ibv_wc_read_tm_info(tm_cq_, &out->tm);
    ibv_end_poll(tm_cq_);
    return true;
  }
  void ExpectOp(ibv_wc_opcode opcode, uint64_t wr_id, unsigned flags = 0) {
    TmCompletion c;
    ASSERT_TRUE(NextTm(&c)) << "no completion for list operation " << wr_id;
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.opcode, opcode);
    EXPECT_EQ(c.wr_id, wr_id);
    EXPECT_EQ(c.flags & (IBV_WC_TM_SYNC_REQ | IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), flags);
  }
  std::string Bytes(size_t at, size_t len) {
    return std::string(reinterpret_cast<const char*>(buf_.data() + at), len);
  }

  ibv_tm_caps caps_{};
  ibv_cq_ex* tm_cq_ = nullptr;
  ibv_srq* srq_ = nullptr;
  ibv_qp* receiver_ = nullptr;
  ibv_qp* sender_ = nullptr;
};

TEST_F(TagMatchingTest, DeviceReportsTagMatchingCaps) {
  EXPECT_TRUE(caps_.flags & IBV_TM_CAP_RC);
  EXPECT_EQ(caps_.max_rndv_hdr_size, 64u);
  EXPECT_GE(caps_.max_num_tags, 1u);
  EXPECT_GE(caps_.max_ops, 10u);
  EXPECT_EQ(caps_.max_sge, 1u);
}

TEST_F(TagMatchingTest, EagerMessageLandsAfterItsTmhInTheMatchingBuffer) {
  ASSERT_NO_FATAL_FAILURE(Build());
  uint32_t h1 = 0, h2 = 0;
  ASSERT_EQ(Add(1, 0x10005, 50, kTagAt, kSlot, &h1), 0);  // matches 0x5 under mask 0xffff
  ASSERT_EQ(Add(2, 0x5, 51, kTagAt + kSlot, kSlot, &h2), 0);
  EXPECT_NE(h1, 0u);
  EXPECT_NE(h1, h2);
  ExpectOp(IBV_WC_TM_ADD, 1);
  ExpectOp(IBV_WC_TM_ADD, 2);
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 0x5, 0xabc, "eager payload"));
  TmCompletion c;
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 50u);  // the oldest matching tag
  EXPECT_EQ(c.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID),
            unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(c.byte_len, 13u);
  EXPECT_EQ(c.tm.tag, 0x5u);
  EXPECT_EQ(c.tm.priv, 0xabcu);
  EXPECT_EQ(Bytes(kTagAt, 13), "eager payload");
  // The tag was consumed: the next message matches the second one.
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 0x5, 1, "second"));
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.wr_id, 51u);
  EXPECT_EQ(Bytes(kTagAt + kSlot, 6), "second");
}

TEST_F(TagMatchingTest, UnexpectedMessageSuspendsMatchingUntilSync) {
  ASSERT_NO_FATAL_FAILURE(Build());
  ASSERT_EQ(Add(1, 7, 70, kTagAt, kSlot, nullptr), 0);
  ExpectOp(IBV_WC_TM_ADD, 1);
  // Tag 8 matches nothing: whole, TMH included, into an ordinary receive.
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 8, 0x88, "unexpected"));
  TmCompletion c;
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 1000u);
  EXPECT_EQ(c.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0u);
  EXPECT_EQ(c.byte_len, 16u + 10u);
  EXPECT_EQ(c.tm.tag, 0u);  // as a ConnectX: the tag is in the TMH received
  EXPECT_EQ(buf_[kRecvAt], IBV_TMH_EAGER);
  EXPECT_EQ(Bytes(kRecvAt + 16, 10), "unexpected");
  // Tag 7 is posted, but matching waits for the software's sync.
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 7, 0, "early"));
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 1001u);
  EXPECT_EQ(c.flags & IBV_WC_TM_MATCH, 0u);
  // An ADD that counted none of the two asks for a sync.
  ASSERT_EQ(Add(2, 9, 90, kTagAt + kSlot, kSlot, nullptr, 0), 0);
  ExpectOp(IBV_WC_TM_ADD, 2, IBV_WC_TM_SYNC_REQ);
  // A stale count changes nothing; the device's count resumes matching.
  ASSERT_EQ(Op(IBV_WR_TAG_SYNC, 3, 0, 1), 0);
  ExpectOp(IBV_WC_TM_SYNC, 3);
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 7, 0, "still"));
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.wr_id, 1002u);
  ASSERT_EQ(Op(IBV_WR_TAG_SYNC, 4, 0, 3, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC), 0);
  ExpectOp(IBV_WC_TM_SYNC, 4);
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 7, 0x77, "matched"));
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 70u);
  EXPECT_EQ(c.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID),
            unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(c.tm.priv, 0x77u);
  EXPECT_EQ(Bytes(kTagAt, 7), "matched");
}

TEST_F(TagMatchingTest, NoTagMessageGoesWholeToAnOrdinaryReceive) {
  ASSERT_NO_FATAL_FAILURE(Build());
  ASSERT_EQ(Add(1, 3, 30, kTagAt, kSlot, nullptr), 0);
  ExpectOp(IBV_WC_TM_ADD, 1);
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_NO_TAG, 3, 0, "no tag"));
  TmCompletion c;
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(c.wr_id, 1000u);
  EXPECT_EQ(c.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0u);
  EXPECT_EQ(c.byte_len, 22u);
  EXPECT_EQ(Bytes(kRecvAt + 16, 6), "no tag");
  // Not unexpected: matching goes on without a sync.
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 3, 0, "tagged"));
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.wr_id, 30u);
  EXPECT_TRUE(c.flags & IBV_WC_TM_MATCH);
}

TEST_F(TagMatchingTest, RendezvousReadsTheSendersDataAndSendsItAFin) {
  ASSERT_NO_FATAL_FAILURE(Build());
  // The FIN consumes a receive of the sender's.
  ASSERT_EQ(PostRecv(sender_, 500, Sge(kFinAt, 64)), 0);
  constexpr uint32_t kLen = 3000;  // three READ response packets at MTU 1024
  for (uint32_t i = 0; i < kLen; ++i) buf_[kRndvDataAt + i] = static_cast<uint8_t>(i * 7);
  std::memset(buf_.data() + kTagAt, 0, kSlot);
  ASSERT_EQ(Add(1, 0x42, 420, kTagAt, kSlot, nullptr), 0);
  ExpectOp(IBV_WC_TM_ADD, 1);
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_RNDV, 0x42, 0x1234, "", kLen));
  TmCompletion c;
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 420u);
  EXPECT_EQ(c.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(c.tm.tag, 0x42u);
  EXPECT_EQ(c.tm.priv, 0x1234u);
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.status, IBV_WC_SUCCESS) << ibv_wc_status_str(c.status);
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 420u);
  EXPECT_EQ(c.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(c.byte_len, kLen);
  EXPECT_EQ(c.tm.tag, 0u);  // the MATCH completion carried it
  EXPECT_EQ(c.tm.priv, 0u);
  EXPECT_EQ(std::memcmp(buf_.data() + kTagAt, buf_.data() + kRndvDataAt, kLen), 0);
  ibv_wc wc{};
  ASSERT_TRUE(Completion(sender_, 500, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, 16u);
  EXPECT_EQ(buf_[kFinAt], IBV_TMH_FIN);
}

TEST_F(TagMatchingTest, DeletedTagMatchesNothing) {
  ASSERT_NO_FATAL_FAILURE(Build());
  uint32_t handle = 0;
  ASSERT_EQ(Add(1, 0x9, 90, kTagAt, kSlot, &handle), 0);
  ExpectOp(IBV_WC_TM_ADD, 1);
  ASSERT_EQ(Op(IBV_WR_TAG_DEL, 2, handle, 0), 0);
  ExpectOp(IBV_WC_TM_DEL, 2);
  EXPECT_EQ(Op(IBV_WR_TAG_DEL, 3, handle, 0), EINVAL);  // gone already
  ASSERT_NO_FATAL_FAILURE(SendTagged(IBV_TMH_EAGER, 0x9, 0, "late"));
  TmCompletion c;
  ASSERT_TRUE(NextTm(&c));
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.wr_id, 1000u);
  EXPECT_EQ(c.flags & IBV_WC_TM_MATCH, 0u);
  // An unsignaled operation completes nothing.
  ASSERT_EQ(Add(4, 0x9, 91, kTagAt, kSlot, &handle, 1, 0), 0);
  TmCompletion none;
  EXPECT_FALSE(NextTm(&none, 200));
}

TEST_F(TagMatchingTest, BadInputIsRefused) {
  // A TM SRQ without its attributes, or with more tags than the device has.
  ibv_srq_init_attr_ex a = TmAttr(4);
  a.comp_mask &= ~IBV_SRQ_INIT_ATTR_TM;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a = TmAttr(caps_.max_num_tags + 1);
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // List operations on a basic SRQ.
  ibv_srq_init_attr basic{};
  basic.attr.max_wr = 4;
  basic.attr.max_sge = 1;
  ibv_srq* plain = ibv_create_srq(pd_, &basic);
  ASSERT_NE(plain, nullptr);
  ibv_ops_wr op{};
  op.opcode = IBV_WR_TAG_SYNC;
  ibv_ops_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_ops(plain, &op, &bad), EINVAL);
  EXPECT_EQ(bad, &op);
  EXPECT_EQ(ibv_destroy_srq(plain), 0);
  // Too many tags, an unknown handle, an unknown opcode, two SGEs.
  ASSERT_NO_FATAL_FAILURE(Build(2));
  ASSERT_EQ(Add(1, 1, 10, kTagAt, 64, nullptr, 0, 0), 0);
  ASSERT_EQ(Add(2, 2, 20, kTagAt, 64, nullptr, 0, 0), 0);
  EXPECT_EQ(Add(3, 3, 30, kTagAt, 64, nullptr, 0, 0), ENOMEM);
  EXPECT_EQ(Op(IBV_WR_TAG_DEL, 4, 99, 0), EINVAL);
  EXPECT_EQ(Op(static_cast<ibv_ops_wr_opcode>(17), 5, 0, 0), EINVAL);
  ibv_sge sges[2] = {Sge(kTagAt, 8), Sge(kTagAt + 8, 8)};
  ibv_ops_wr two{};
  two.opcode = IBV_WR_TAG_ADD;
  two.tm.add.sg_list = sges;
  two.tm.add.num_sge = 2;
  EXPECT_EQ(ibv_post_srq_ops(srq_, &two, &bad), EINVAL);
  // Tag matching is RC's: a UD QP may not receive through a TM SRQ.
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq_;
  qa.srq = srq_;
  qa.qp_type = IBV_QPT_UD;
  qa.cap = {1, 0, 1, 0, 0};
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &qa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // No list operation completed.
  TmCompletion none;
  EXPECT_FALSE(NextTm(&none, 200));
}

}  // namespace
}  // namespace rdmaemu::testing
