// Tests of the QP state machine: the transition table (written out again
// here from ibv_modify_qp(3) and Linux's qp_state_table, so that the two
// copies check each other), the mask and value checks with their messages,
// and ApplyModify.
#include "emulator/objects/qp_state.h"

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace rdmaemu::objects {
namespace {

using S = QpState;

// The values the provider relies on when it casts (libibverbs' numbers).
static_assert(static_cast<int>(QpState::kErr) == 6);
static_assert(static_cast<int>(QpType::kRc) == 2 && static_cast<int>(QpType::kUd) == 4);
static_assert(static_cast<int>(Mtu::k256) == 1 && static_cast<int>(Mtu::k4096) == 5);
static_assert(static_cast<int>(MigState::kArmed) == 2);
static_assert(kQpMaxDestRdAtomic == 1u << 17 && kQpDestQpn == 1u << 20);
static_assert(kQpRateLimit == 1u << 25);
static_assert(kQpKnownAttrMask == (((1u << 21) - 1) | kQpRateLimit));

constexpr QpType kTypes[] = {QpType::kRc, QpType::kUc, QpType::kUd, QpType::kXrcSend,
                             QpType::kXrcRecv};
constexpr QpState kStates[] = {S::kReset, S::kInit, S::kRtr, S::kRts, S::kSqd, S::kSqe, S::kErr};

// The expected table, apart from the ->RESET and ->ERR rows.
struct Expected {
  QpType type;
  QpState from;
  QpState to;
  uint32_t required;
  uint32_t optional;
};

constexpr uint32_t kRcOnTheFly =
    kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState | kQpMinRnrTimer;
constexpr uint32_t kUcOnTheFly = kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState;
constexpr uint32_t kUdOnTheFly = kQpCurState | kQpQkey;

const std::vector<Expected> kExpected = {
    // RC
    {QpType::kRc, S::kReset, S::kInit, kQpPkeyIndex | kQpPort | kQpAccessFlags, 0},
    {QpType::kRc, S::kInit, S::kInit, 0, kQpPkeyIndex | kQpPort | kQpAccessFlags},
    {QpType::kRc, S::kInit, S::kRtr,
     kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer,
     kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
    {QpType::kRc, S::kRtr, S::kRts,
     kQpSqPsn | kQpMaxQpRdAtomic | kQpRetryCnt | kQpRnrRetry | kQpTimeout, kRcOnTheFly},
    {QpType::kRc, S::kRts, S::kRts, 0, kRcOnTheFly},
    {QpType::kRc, S::kRts, S::kSqd, 0, kQpEnSqdAsyncNotify},
    {QpType::kRc, S::kSqd, S::kRts, 0, kRcOnTheFly},
    {QpType::kRc, S::kSqd, S::kSqd, 0,
     kQpPort | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic |
         kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpMinRnrTimer |
         kQpPathMigState},
    {QpType::kRc, S::kSqe, S::kRts, 0, 0},
    // UC
    {QpType::kUc, S::kReset, S::kInit, kQpPkeyIndex | kQpPort | kQpAccessFlags, 0},
    {QpType::kUc, S::kInit, S::kInit, 0, kQpPkeyIndex | kQpPort | kQpAccessFlags},
    {QpType::kUc, S::kInit, S::kRtr, kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn,
     kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
    {QpType::kUc, S::kRtr, S::kRts, kQpSqPsn, kUcOnTheFly},
    {QpType::kUc, S::kRts, S::kRts, 0, kUcOnTheFly},
    {QpType::kUc, S::kRts, S::kSqd, 0, kQpEnSqdAsyncNotify},
    {QpType::kUc, S::kSqd, S::kRts, 0, kUcOnTheFly},
    {QpType::kUc, S::kSqd, S::kSqd, 0,
     kQpAv | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpPathMigState},
    {QpType::kUc, S::kSqe, S::kRts, 0, kQpCurState | kQpAccessFlags},
    // UD
    {QpType::kUd, S::kReset, S::kInit, kQpPkeyIndex | kQpPort | kQpQkey, 0},
    {QpType::kUd, S::kInit, S::kInit, 0, kQpPkeyIndex | kQpPort | kQpQkey},
    {QpType::kUd, S::kInit, S::kRtr, 0, kQpPkeyIndex | kQpQkey},
    {QpType::kUd, S::kRtr, S::kRts, kQpSqPsn, kUdOnTheFly},
    {QpType::kUd, S::kRts, S::kRts, 0, kUdOnTheFly},
    {QpType::kUd, S::kRts, S::kSqd, 0, kQpEnSqdAsyncNotify},
    {QpType::kUd, S::kSqd, S::kRts, 0, kUdOnTheFly},
    {QpType::kUd, S::kSqd, S::kSqd, 0, kQpPkeyIndex | kQpQkey},
    {QpType::kUd, S::kSqe, S::kRts, 0, kUdOnTheFly},
    // XRC initiator and target, as Linux's qp_state_table (IB_QPT_XRC_INI, _TGT).
    {QpType::kXrcSend, S::kReset, S::kInit, kQpPkeyIndex | kQpPort | kQpAccessFlags, 0},
    {QpType::kXrcSend, S::kInit, S::kInit, 0, kQpPkeyIndex | kQpPort | kQpAccessFlags},
    {QpType::kXrcSend, S::kInit, S::kRtr, kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn,
     kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
    {QpType::kXrcSend, S::kRtr, S::kRts,
     kQpSqPsn | kQpMaxQpRdAtomic | kQpRetryCnt | kQpRnrRetry | kQpTimeout, kUcOnTheFly},
    {QpType::kXrcSend, S::kRts, S::kRts, 0, kUcOnTheFly},
    {QpType::kXrcSend, S::kRts, S::kSqd, 0, kQpEnSqdAsyncNotify},
    {QpType::kXrcSend, S::kSqd, S::kRts, 0, kUcOnTheFly},
    {QpType::kXrcSend, S::kSqd, S::kSqd, 0,
     kQpPort | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic | kQpAltPath |
         kQpAccessFlags | kQpPkeyIndex | kQpPathMigState},
    {QpType::kXrcSend, S::kSqe, S::kRts, 0, 0},
    {QpType::kXrcRecv, S::kReset, S::kInit, kQpPkeyIndex | kQpPort | kQpAccessFlags, 0},
    {QpType::kXrcRecv, S::kInit, S::kInit, 0, kQpPkeyIndex | kQpPort | kQpAccessFlags},
    {QpType::kXrcRecv, S::kInit, S::kRtr,
     kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer,
     kQpAltPath | kQpAccessFlags | kQpPkeyIndex},
    {QpType::kXrcRecv, S::kRtr, S::kRts, kQpSqPsn | kQpTimeout, kRcOnTheFly},
    {QpType::kXrcRecv, S::kRts, S::kRts, 0, kRcOnTheFly},
    {QpType::kXrcRecv, S::kRts, S::kSqd, 0, kQpEnSqdAsyncNotify},
    {QpType::kXrcRecv, S::kSqd, S::kRts, 0, kRcOnTheFly},
    {QpType::kXrcRecv, S::kSqd, S::kSqd, 0,
     kQpPort | kQpAv | kQpTimeout | kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags |
         kQpPkeyIndex | kQpMinRnrTimer | kQpPathMigState},
    {QpType::kXrcRecv, S::kSqe, S::kRts, 0, 0},
};

std::vector<Expected> AllLegal() {
  std::vector<Expected> all = kExpected;
  for (QpType type : kTypes) {
    for (QpState from : kStates) {
      all.push_back({type, from, S::kReset, 0, 0});
      if (from != S::kReset) all.push_back({type, from, S::kErr, 0, 0});
    }
  }
  return all;
}

std::string Name(const Expected& e) {
  return std::string(ToString(e.type)) + " " + std::string(ToString(e.from)) + "->" +
         std::string(ToString(e.to));
}

QpLimits Limits() {
  QpLimits limits;
  limits.num_ports = 1;
  limits.pkey_table_len = 1;
  limits.gid_table_len = 16;
  limits.max_rd_atomic = 16;
  limits.max_dest_rd_atomic = 16;
  limits.roce = true;
  limits.port_active_mtu = 4096;
  return limits;
}

// A QP of the emulator's one port, in `state`.
QpAttributes InState(QpState state) {
  QpAttributes qp;
  qp.state = state;
  qp.cur_state = state;
  qp.port_num = 1;
  return qp;
}

AddressVector RoceAv() {
  AddressVector av;
  av.has_grh = true;
  av.dgid[10] = 0xff;
  av.dgid[11] = 0xff;
  av.dgid[12] = 127;
  av.dgid[15] = 2;
  av.sgid_index = 0;
  av.hop_limit = 1;
  av.port_num = 1;
  return av;
}

// What ibv_rc_pingpong and friends pass: every field set to a legal value.
QpAttributes Request(QpState from, QpState to) {
  QpAttributes r;
  r.state = to;
  r.cur_state = from;
  r.port_num = 1;
  r.pkey_index = 0;
  r.qkey = 0x11111111;
  r.qp_access_flags = 0x7;  // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
  r.ah_attr = RoceAv();
  r.path_mtu = Mtu::k1024;
  r.dest_qp_num = 0x123;
  r.rq_psn = 0x10;
  r.sq_psn = 0x20;
  r.max_dest_rd_atomic = 4;
  r.min_rnr_timer = 12;
  r.max_rd_atomic = 4;
  r.timeout = 14;
  r.retry_cnt = 7;
  r.rnr_retry = 7;
  r.alt_ah_attr = RoceAv();
  r.alt_port_num = 1;
  r.alt_pkey_index = 0;
  r.alt_timeout = 14;
  r.path_mig_state = MigState::kMigrated;
  r.en_sqd_async_notify = true;
  return r;
}

Status Check(const Expected& e, uint32_t mask) {
  return CheckModify(e.type, InState(e.from), Request(e.from, e.to), mask, Limits());
}

// ---------------------------------------------------------------- the table

TEST(QpTransitionTable, MatchesTheSpecForEveryTypeAndPairOfStates) {
  std::vector<Expected> legal = AllLegal();
  for (QpType type : kTypes) {
    for (QpState from : kStates) {
      for (QpState to : kStates) {
        const Expected* want = nullptr;
        for (const Expected& e : legal) {
          if (e.type == type && e.from == from && e.to == to) want = &e;
        }
        std::optional<TransitionMasks> got = FindTransition(type, from, to);
        Expected probe{type, from, to, 0, 0};
        ASSERT_EQ(got.has_value(), want != nullptr) << Name(probe);
        if (!want) continue;
        EXPECT_EQ(got->required, want->required) << Name(probe);
        EXPECT_EQ(got->optional, want->optional) << Name(probe);
      }
    }
  }
}

TEST(QpTransitionTable, UnknownTypeHasNoTransitions) {
  // 7: no ibv_qp_type has it.
  EXPECT_FALSE(FindTransition(static_cast<QpType>(7), S::kReset, S::kInit));
  Status s = CheckModify(static_cast<QpType>(7), InState(S::kReset), Request(S::kReset, S::kInit),
                         kQpState | kQpPkeyIndex | kQpPort, Limits());
  EXPECT_EQ(s.code(), EINVAL);
}

// Linux's qp_state_table for IB_QPT_RAW_PACKET: the port at RESET->INIT,
// optional at INIT->INIT, nothing else anywhere.
TEST(QpTransitionTable, RawPacketNeedsThePortAlone) {
  auto init = FindTransition(QpType::kRawPacket, S::kReset, S::kInit);
  ASSERT_TRUE(init);
  EXPECT_EQ(init->required, kQpPort);
  EXPECT_EQ(init->optional, 0u);
  auto rtr = FindTransition(QpType::kRawPacket, S::kInit, S::kRtr);
  ASSERT_TRUE(rtr);
  EXPECT_EQ(rtr->required, 0u);
  auto rts = FindTransition(QpType::kRawPacket, S::kRtr, S::kRts);
  ASSERT_TRUE(rts);
  EXPECT_EQ(rts->required, 0u);
  EXPECT_EQ(CheckModify(QpType::kRawPacket, InState(S::kReset), Request(S::kReset, S::kInit),
                        kQpState | kQpPkeyIndex | kQpPort, Limits())
                .code(),
            EINVAL);
}

// ------------------------------------------------------------- the masks

TEST(CheckModify, EveryLegalTransitionWithItsRequiredMaskSucceeds) {
  for (const Expected& e : AllLegal()) {
    Status s = Check(e, kQpState | e.required);
    EXPECT_TRUE(s.ok()) << Name(e) << ": " << s.message();
  }
}

TEST(CheckModify, EachMissingRequiredAttributeFailsNamingIt) {
  for (const Expected& e : AllLegal()) {
    for (const QpAttrName& n : kQpAttrNames) {
      if (!(e.required & n.bit)) continue;
      Status s = Check(e, kQpState | (e.required & ~n.bit));
      EXPECT_EQ(s.code(), EINVAL) << Name(e) << " without " << n.name;
      EXPECT_NE(s.message().find("missing: " + std::string(n.name)), std::string::npos)
          << s.message();
    }
  }
}

TEST(CheckModify, MissingAttributeMessageListsWhatTheTransitionNeeds) {
  Expected e{QpType::kRc, S::kInit, S::kRtr,
             kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer, 0};
  Status s = Check(e, kQpState | (e.required & ~kQpMaxDestRdAtomic));
  EXPECT_EQ(s.message(),
            "INIT→RTR on an RC QP requires IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, "
            "IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER; missing: "
            "IBV_QP_MAX_DEST_RD_ATOMIC");

  Expected ud{QpType::kUd, S::kReset, S::kInit, kQpPkeyIndex | kQpPort | kQpQkey, 0};
  s = Check(ud, kQpState | kQpPkeyIndex);
  EXPECT_EQ(s.message(),
            "RESET→INIT on a UD QP requires IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY; "
            "missing: IBV_QP_PORT, IBV_QP_QKEY");
}

TEST(CheckModify, EachOptionalAttributeIsAccepted) {
  for (const Expected& e : AllLegal()) {
    for (const QpAttrName& n : kQpAttrNames) {
      if (!(e.optional & n.bit)) continue;
      Status s = Check(e, kQpState | e.required | n.bit);
      EXPECT_TRUE(s.ok()) << Name(e) << " with " << n.name << ": " << s.message();
    }
    Status all = Check(e, kQpState | e.required | e.optional);
    EXPECT_TRUE(all.ok()) << Name(e) << " with every optional attribute: " << all.message();
  }
}

TEST(CheckModify, EveryAttributeTheTransitionDoesNotListIsRefused) {
  for (const Expected& e : AllLegal()) {
    for (const QpAttrName& n : kQpAttrNames) {
      if ((e.required | e.optional | kQpState) & n.bit) continue;
      Status s = Check(e, kQpState | e.required | n.bit);
      EXPECT_EQ(s.code(), EINVAL) << Name(e) << " with " << n.name;
      EXPECT_NE(s.message().find("attribute " + std::string(n.name) + " is not allowed on"),
                std::string::npos)
          << s.message();
    }
  }
}

TEST(CheckModify, NotAllowedMessageNamesAttributeTransitionAndType) {
  Expected e{QpType::kRc, S::kRtr, S::kRts,
             kQpSqPsn | kQpMaxQpRdAtomic | kQpRetryCnt | kQpRnrRetry | kQpTimeout, 0};
  EXPECT_EQ(Check(e, kQpState | e.required | kQpQkey).message(),
            "attribute IBV_QP_QKEY is not allowed on RTR→RTS for an RC QP");
  EXPECT_EQ(Check(e, kQpState | e.required | kQpQkey | kQpPort).message(),
            "attributes IBV_QP_PORT, IBV_QP_QKEY are not allowed on RTR→RTS for an RC QP");
}

TEST(CheckModify, CapIsNeverModifiable) {
  for (const Expected& e : AllLegal()) {
    Status s = Check(e, kQpState | e.required | kQpCap);
    EXPECT_EQ(s.code(), EINVAL) << Name(e);
  }
  Expected rts{QpType::kRc, S::kRts, S::kRts, 0, 0};
  EXPECT_NE(Check(rts, kQpCap).message().find("fixed by ibv_create_qp"), std::string::npos);
}

TEST(CheckModify, RateLimitIsOnlyForRawPacketQps) {
  Expected rts{QpType::kUd, S::kRts, S::kRts, 0, 0};
  Status s = Check(rts, kQpRateLimit);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("raw packet"), std::string::npos) << s.message();
}

TEST(CheckModify, UnknownMaskBitsAreRefused) {
  Expected rts{QpType::kRc, S::kRts, S::kRts, 0, 0};
  for (uint32_t bit : {1u << 21, 1u << 24, 1u << 26, 1u << 31}) {
    Status s = Check(rts, kQpState | bit);
    EXPECT_EQ(s.code(), EINVAL) << std::hex << bit;
    EXPECT_NE(s.message().find("no IBV_QP_* attribute"), std::string::npos) << s.message();
  }
}

// -------------------------------------------------------- the transitions

TEST(CheckModify, IllegalTransitionsAreRefused) {
  struct Case {
    QpType type;
    QpState from;
    QpState to;
  };
  for (Case c : {Case{QpType::kRc, S::kReset, S::kRtr}, Case{QpType::kRc, S::kReset, S::kRts},
                 Case{QpType::kRc, S::kInit, S::kRts}, Case{QpType::kRc, S::kRtr, S::kInit},
                 Case{QpType::kRc, S::kRtr, S::kRtr}, Case{QpType::kRc, S::kRts, S::kInit},
                 Case{QpType::kRc, S::kRts, S::kRtr}, Case{QpType::kRc, S::kErr, S::kRts},
                 Case{QpType::kRc, S::kErr, S::kInit}, Case{QpType::kRc, S::kRtr, S::kSqd},
                 Case{QpType::kUd, S::kReset, S::kRts}, Case{QpType::kUd, S::kInit, S::kSqd},
                 Case{QpType::kUc, S::kSqe, S::kSqd}, Case{QpType::kUc, S::kSqd, S::kSqe},
                 Case{QpType::kRc, S::kRts, S::kSqe}, Case{QpType::kRc, S::kReset, S::kErr}}) {
    Status s = CheckModify(c.type, InState(c.from), Request(c.from, c.to), kQpState, Limits());
    EXPECT_EQ(s.code(), EINVAL) << ToString(c.from) << "->" << ToString(c.to);
    EXPECT_NE(s.message().find("is not a legal transition"), std::string::npos) << s.message();
  }
}

TEST(CheckModify, IllegalTransitionMessageSaysWhereTheQpCanGo) {
  Status s = CheckModify(QpType::kRc, InState(S::kReset), Request(S::kReset, S::kRtr),
                         kQpState | kQpAv, Limits());
  EXPECT_EQ(s.message(),
            "RESET→RTR is not a legal transition for an RC QP: from RESET it can go to RESET or "
            "INIT");
  s = CheckModify(QpType::kUc, InState(S::kInit), Request(S::kInit, S::kRts), kQpState, Limits());
  EXPECT_EQ(s.message(),
            "INIT→RTS is not a legal transition for a UC QP: from INIT it can go to RESET, INIT, "
            "RTR or ERR");
}

// xsrq_pingpong moves its XRC_RECV QP to RTS with IBV_QP_TIMEOUT and
// IBV_QP_SQ_PSN only: a target has no retries of its own.
TEST(CheckModify, XrcTargetTakesNoSendSideAttributes) {
  EXPECT_TRUE(CheckModify(QpType::kXrcRecv, InState(S::kRtr), Request(S::kRtr, S::kRts),
                          kQpState | kQpTimeout | kQpSqPsn, Limits())
                  .ok());
  Status s = CheckModify(QpType::kXrcRecv, InState(S::kRtr), Request(S::kRtr, S::kRts),
                         kQpState | kQpTimeout | kQpSqPsn | kQpRetryCnt, Limits());
  EXPECT_EQ(s.message(),
            "attribute IBV_QP_RETRY_CNT is not allowed on RTR→RTS for an XRC_RECV QP");
  s = CheckModify(QpType::kXrcSend, InState(S::kInit), Request(S::kInit, S::kRtr),
                  kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMinRnrTimer,
                  Limits());
  EXPECT_EQ(s.message(),
            "attribute IBV_QP_MIN_RNR_TIMER is not allowed on INIT→RTR for an XRC_SEND QP");
}

TEST(CheckModify, AnyStateGoesToResetAndAnyButResetToErr) {
  for (QpType type : kTypes) {
    for (QpState from : kStates) {
      Status reset =
          CheckModify(type, InState(from), Request(from, S::kReset), kQpState, Limits());
      EXPECT_TRUE(reset.ok()) << ToString(from) << ": " << reset.message();
      Status err = CheckModify(type, InState(from), Request(from, S::kErr), kQpState, Limits());
      // Linux's table has no RESET->ERR: a QP that never left RESET has nothing to flush.
      EXPECT_EQ(err.ok(), from != S::kReset) << ToString(from) << ": " << err.message();
    }
  }
}

TEST(CheckModify, WithoutStateTheQpKeepsItsState) {
  // RTS -> RTS: tune the RNR timer on the fly.
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kRts), Request(S::kRts, S::kRts),
                          kQpMinRnrTimer, Limits())
                  .ok());
  // INIT -> INIT: change the access flags.
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kInit), Request(S::kInit, S::kInit),
                          kQpAccessFlags, Limits())
                  .ok());
  // There is no RTR -> RTR.
  Status s = CheckModify(QpType::kRc, InState(S::kRtr), Request(S::kRtr, S::kRts),
                         kQpAv | kQpPathMtu, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("RTR→RTR is not a legal transition"), std::string::npos);
  EXPECT_NE(s.message().find("without IBV_QP_STATE in attr_mask the QP stays in RTR"),
            std::string::npos)
      << s.message();
}

TEST(CheckModify, OutOfRangeStatesAreRefused) {
  QpAttributes r = Request(S::kReset, S::kInit);
  r.state = static_cast<QpState>(7);
  Status s = CheckModify(QpType::kRc, InState(S::kReset), r,
                         kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("qp_state 7 is not a QP state"), std::string::npos) << s.message();

  r = Request(S::kRts, S::kRts);
  r.cur_state = static_cast<QpState>(0xffffffff);
  s = CheckModify(QpType::kRc, InState(S::kRts), r, kQpState | kQpCurState, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("cur_qp_state 4294967295 is not a QP state"), std::string::npos)
      << s.message();
}

// ------------------------------------------------------------ CUR_STATE

TEST(CheckModify, CurStateMustMatchTheQpsState) {
  QpAttributes r = Request(S::kRts, S::kRts);
  r.cur_state = S::kRts;
  EXPECT_TRUE(
      CheckModify(QpType::kRc, InState(S::kRts), r, kQpState | kQpCurState, Limits()).ok());

  r.cur_state = S::kSqd;
  Status s = CheckModify(QpType::kRc, InState(S::kRts), r, kQpState | kQpCurState, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_EQ(s.message(), "IBV_QP_CUR_STATE: cur_qp_state says the QP is in SQD but it is in RTS");
}

TEST(CheckModify, CurStateIsRefusedWhereTheTableDoesNotListIt) {
  // A matching cur_qp_state is still refused outside RTR/RTS/SQD/SQE -> RTS,
  // and on the ->ERR and ->RESET rows, as in Linux.
  for (auto [from, to] : {std::pair{S::kInit, S::kRtr}, std::pair{S::kRts, S::kErr},
                          std::pair{S::kRtr, S::kReset}, std::pair{S::kSqd, S::kSqd}}) {
    QpAttributes r = Request(from, to);
    Status s = CheckModify(QpType::kUd, InState(from), r, kQpState | kQpCurState, Limits());
    EXPECT_EQ(s.code(), EINVAL) << ToString(from) << "->" << ToString(to);
    EXPECT_NE(s.message().find("attribute IBV_QP_CUR_STATE is not allowed"), std::string::npos)
        << s.message();
  }
}

// ------------------------------------------------------------ the values

constexpr uint32_t kRcRtr =
    kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
constexpr uint32_t kRcRts =
    kQpState | kQpSqPsn | kQpMaxQpRdAtomic | kQpRetryCnt | kQpRnrRetry | kQpTimeout;

TEST(CheckModify, RoceAddressVectorWithoutGrhIsRefusedWithAHint) {
  QpAttributes r = Request(S::kInit, S::kRtr);
  r.ah_attr.has_grh = false;
  r.ah_attr.dlid = 1;
  Status s = CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_EQ(s.message(),
            "on RoCE (Ethernet link layer) the address vector needs a GRH: set "
            "ah_attr.is_global = 1 and ah_attr.grh.dgid (ibv_rc_pingpong: use -g 0)");

  // On an InfiniBand link a LID-routed AV is fine.
  QpLimits ib = Limits();
  ib.roce = false;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr, ib).ok());
}

TEST(CheckModify, RoceAlternatePathWithoutGrhIsRefused) {
  QpAttributes r = Request(S::kInit, S::kRtr);
  r.alt_ah_attr.has_grh = false;
  Status s = CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr | kQpAltPath, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("IBV_QP_ALT_PATH: on RoCE"), std::string::npos) << s.message();
}

// One bad value, the mask that carries it, and what the message must say.
struct BadValue {
  const char* what;
  QpState from;
  QpState to;
  uint32_t mask;
  void (*spoil)(QpAttributes&);
  const char* says;
};

const BadValue kBadValues[] = {
    {"port 0", S::kReset, S::kInit, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags,
     [](QpAttributes& r) { r.port_num = 0; }, "IBV_QP_PORT: port_num 0 is not a port"},
    {"port 2", S::kReset, S::kInit, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags,
     [](QpAttributes& r) { r.port_num = 2; }, "the device has port 1 only"},
    {"pkey_index 1", S::kReset, S::kInit, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags,
     [](QpAttributes& r) { r.pkey_index = 1; }, "pkey_index 1 is outside the P_Key table"},
    {"unknown access bit", S::kReset, S::kInit, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags,
     [](QpAttributes& r) { r.qp_access_flags = 0x10 | 0x1; }, "has bits 0x10"},
    {"AV port 2", S::kInit, S::kRtr, kRcRtr, [](QpAttributes& r) { r.ah_attr.port_num = 2; },
     "ah_attr.port_num 2 is not a port"},
    {"AV port 0", S::kInit, S::kRtr, kRcRtr, [](QpAttributes& r) { r.ah_attr.port_num = 0; },
     "ah_attr.port_num 0 is not a port"},
    {"sgid_index", S::kInit, S::kRtr, kRcRtr, [](QpAttributes& r) { r.ah_attr.sgid_index = 16; },
     "ah_attr.grh.sgid_index 16 is outside the GID table (16 entries)"},
    {"path_mtu 0", S::kInit, S::kRtr, kRcRtr, [](QpAttributes& r) { r.path_mtu = Mtu{0}; },
     "path_mtu 0 is not an MTU"},
    {"path_mtu 6", S::kInit, S::kRtr, kRcRtr, [](QpAttributes& r) { r.path_mtu = Mtu{6}; },
     "path_mtu 6 is not an MTU"},
    {"dest_qp_num", S::kInit, S::kRtr, kRcRtr,
     [](QpAttributes& r) { r.dest_qp_num = 0x1000000; }, "dest_qp_num 0x1000000 does not fit"},
    {"max_dest_rd_atomic", S::kInit, S::kRtr, kRcRtr,
     [](QpAttributes& r) { r.max_dest_rd_atomic = 17; }, "max_dest_rd_atomic 17 exceeds"},
    {"min_rnr_timer", S::kInit, S::kRtr, kRcRtr, [](QpAttributes& r) { r.min_rnr_timer = 32; },
     "min_rnr_timer 32 is out of range"},
    {"timeout", S::kRtr, S::kRts, kRcRts, [](QpAttributes& r) { r.timeout = 32; },
     "IBV_QP_TIMEOUT: timeout 32 is out of range"},
    {"retry_cnt", S::kRtr, S::kRts, kRcRts, [](QpAttributes& r) { r.retry_cnt = 8; },
     "retry_cnt 8 is out of range"},
    {"rnr_retry", S::kRtr, S::kRts, kRcRts, [](QpAttributes& r) { r.rnr_retry = 8; },
     "rnr_retry 8 is out of range"},
    {"max_rd_atomic", S::kRtr, S::kRts, kRcRts, [](QpAttributes& r) { r.max_rd_atomic = 17; },
     "max_rd_atomic 17 exceeds"},
    {"alt_port_num", S::kRtr, S::kRts, kRcRts | kQpAltPath,
     [](QpAttributes& r) { r.alt_port_num = 3; }, "alt_port_num 3 is not a port"},
    {"alt AV port", S::kRtr, S::kRts, kRcRts | kQpAltPath,
     [](QpAttributes& r) { r.alt_ah_attr.port_num = 4; }, "alt_ah_attr.port_num 4 is not a port"},
    {"alt_pkey_index", S::kRtr, S::kRts, kRcRts | kQpAltPath,
     [](QpAttributes& r) { r.alt_pkey_index = 2; }, "alt_pkey_index 2 is outside the P_Key table"},
    {"alt_timeout", S::kRtr, S::kRts, kRcRts | kQpAltPath,
     [](QpAttributes& r) { r.alt_timeout = 40; }, "alt_timeout 40 is out of range"},
    {"path_mig_state", S::kRtr, S::kRts, kRcRts | kQpPathMigState,
     [](QpAttributes& r) { r.path_mig_state = MigState{3}; }, "path_mig_state 3 is not"},
};

TEST(CheckModify, ValuesOutOfRangeAreRefusedNamingTheField) {
  for (const BadValue& b : kBadValues) {
    QpAttributes r = Request(b.from, b.to);
    ASSERT_TRUE(CheckModify(QpType::kRc, InState(b.from), r, b.mask, Limits()).ok()) << b.what;
    b.spoil(r);
    Status s = CheckModify(QpType::kRc, InState(b.from), r, b.mask, Limits());
    EXPECT_EQ(s.code(), EINVAL) << b.what;
    EXPECT_NE(s.message().find(b.says), std::string::npos) << b.what << ": " << s.message();
  }
}

TEST(CheckModify, ValuesOfUnmaskedAttributesAreNotLookedAt) {
  QpAttributes r = Request(S::kRtr, S::kRts);
  r.timeout = 200;
  r.path_mtu = Mtu{9};
  r.port_num = 0;
  r.ah_attr.has_grh = false;
  EXPECT_TRUE(CheckModify(QpType::kUc, InState(S::kRtr), r, kQpState | kQpSqPsn, Limits()).ok());
}

TEST(CheckModify, BoundaryValuesAreAccepted) {
  QpAttributes r = Request(S::kRtr, S::kRts);
  r.timeout = 31;
  r.retry_cnt = 7;
  r.rnr_retry = 7;
  r.max_rd_atomic = 16;
  r.sq_psn = kMax24Bit;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kRtr), r, kRcRts, Limits()).ok());

  r = Request(S::kInit, S::kRtr);
  r.path_mtu = Mtu::k4096;
  r.dest_qp_num = kMax24Bit;
  r.min_rnr_timer = 31;
  r.max_dest_rd_atomic = 16;
  r.ah_attr.sgid_index = 15;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr, Limits()).ok());
}

TEST(CheckModify, PsnsAbove24BitsAreAcceptedLikeLinuxDoes) {
  // The kernel masks rq_psn and sq_psn to 24 bits with a warning.
  QpAttributes r = Request(S::kRtr, S::kRts);
  r.sq_psn = 0xff123456;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kRtr), r, kRcRts, Limits()).ok());
}

TEST(CheckModify, PathMtuAboveThePortsActiveMtuIsRefused) {
  QpLimits small = Limits();
  small.port_active_mtu = 1024;
  QpAttributes r = Request(S::kInit, S::kRtr);
  r.path_mtu = Mtu::k1024;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr, small).ok());
  r.path_mtu = Mtu::k2048;
  Status s = CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr, small);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("path_mtu 2048 bytes exceeds the port's active MTU of 1024"),
            std::string::npos)
      << s.message();
}

TEST(CheckModify, AvPortMustBeTheQpsPort) {
  QpLimits two = Limits();
  two.num_ports = 2;
  QpAttributes r = Request(S::kInit, S::kRtr);
  r.ah_attr.port_num = 2;  // the QP was brought to INIT on port 1
  Status s = CheckModify(QpType::kRc, InState(S::kInit), r, kRcRtr, two);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("ah_attr.port_num 2 differs from the QP's port_num 1"),
            std::string::npos)
      << s.message();

  // SQD -> SQD may move the QP to another port, AV and port together.
  r = Request(S::kSqd, S::kSqd);
  r.port_num = 2;
  r.ah_attr.port_num = 2;
  EXPECT_TRUE(
      CheckModify(QpType::kRc, InState(S::kSqd), r, kQpState | kQpPort | kQpAv, two).ok());
  EXPECT_EQ(CheckModify(QpType::kRc, InState(S::kSqd), r, kQpState | kQpAv, two).code(), EINVAL);
}

TEST(CheckModify, AlternatePathNeedsDeviceSupport) {
  QpLimits no_apm = Limits();
  no_apm.auto_path_mig = false;
  QpAttributes r = Request(S::kRtr, S::kRts);
  Status s = CheckModify(QpType::kRc, InState(S::kRtr), r, kRcRts | kQpAltPath, no_apm);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("IBV_DEVICE_AUTO_PATH_MIG"), std::string::npos) << s.message();
}

TEST(CheckModify, AllFourRemoteAccessFlagsAreAccepted) {
  QpAttributes r = Request(S::kReset, S::kInit);
  r.qp_access_flags = 0xf;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kReset), r,
                          kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags, Limits())
                  .ok());
}

TEST(CheckModify, LeavesItsInputsAsTheyWere) {
  const QpAttributes current = InState(S::kInit);
  QpAttributes requested = Request(S::kInit, S::kRtr);
  requested.ah_attr.has_grh = false;
  QpAttributes qp = current;
  const QpAttributes requested_before = requested;

  Status s = CheckModify(QpType::kRc, qp, requested, kRcRtr, Limits());
  ASSERT_FALSE(s.ok());
  // A rejected modify is not applied: the QP is exactly what it was.
  EXPECT_EQ(qp, current);
  EXPECT_EQ(requested, requested_before);

  requested.ah_attr.has_grh = true;
  ASSERT_TRUE(CheckModify(QpType::kRc, qp, requested, kRcRtr, Limits()).ok());
  EXPECT_EQ(qp, current);
}

// ---------------------------------------------------------- ApplyModify

// Every attribute different from Request()'s, so a copy shows.
QpAttributes Distinct(QpState state) {
  QpAttributes qp = InState(state);
  qp.qkey = 5;
  qp.qp_access_flags = 1;
  qp.path_mtu = Mtu::k256;
  qp.dest_qp_num = 9;
  qp.rq_psn = 1;
  qp.sq_psn = 2;
  qp.max_dest_rd_atomic = 1;
  qp.max_rd_atomic = 1;
  qp.min_rnr_timer = 1;
  qp.timeout = 1;
  qp.retry_cnt = 1;
  qp.rnr_retry = 1;
  qp.alt_port_num = 2;
  qp.alt_timeout = 2;
  qp.alt_pkey_index = 3;
  qp.pkey_index = 4;
  qp.path_mig_state = MigState::kArmed;
  qp.rate_limit = 7;
  qp.cap = {1, 2, 3, 4, 5};
  return qp;
}

TEST(ApplyModify, CopiesExactlyTheMaskedAttributes) {
  QpAttributes req = Request(S::kRts, S::kRts);
  req.cap = {10, 20, 30, 40, 50};
  req.rate_limit = 1000;
  req.port_num = 2;
  for (const QpAttrName& n : kQpAttrNames) {
    if (n.bit == kQpState || n.bit == kQpCurState) continue;
    QpAttributes qp = Distinct(S::kRts);
    QpAttributes want = qp;
    switch (n.bit) {
      case kQpEnSqdAsyncNotify: want.en_sqd_async_notify = req.en_sqd_async_notify; break;
      case kQpAccessFlags: want.qp_access_flags = req.qp_access_flags; break;
      case kQpPkeyIndex: want.pkey_index = req.pkey_index; break;
      case kQpPort: want.port_num = req.port_num; break;
      case kQpQkey: want.qkey = req.qkey; break;
      case kQpAv: want.ah_attr = req.ah_attr; break;
      case kQpPathMtu: want.path_mtu = req.path_mtu; break;
      case kQpTimeout: want.timeout = req.timeout; break;
      case kQpRetryCnt: want.retry_cnt = req.retry_cnt; break;
      case kQpRnrRetry: want.rnr_retry = req.rnr_retry; break;
      case kQpRqPsn: want.rq_psn = req.rq_psn; break;
      case kQpMaxQpRdAtomic: want.max_rd_atomic = req.max_rd_atomic; break;
      case kQpAltPath:
        want.alt_ah_attr = req.alt_ah_attr;
        want.alt_port_num = req.alt_port_num;
        want.alt_pkey_index = req.alt_pkey_index;
        want.alt_timeout = req.alt_timeout;
        break;
      case kQpMinRnrTimer: want.min_rnr_timer = req.min_rnr_timer; break;
      case kQpSqPsn: want.sq_psn = req.sq_psn; break;
      case kQpMaxDestRdAtomic: want.max_dest_rd_atomic = req.max_dest_rd_atomic; break;
      case kQpPathMigState: want.path_mig_state = req.path_mig_state; break;
      case kQpCap: want.cap = req.cap; break;
      case kQpDestQpn: want.dest_qp_num = req.dest_qp_num; break;
      case kQpRateLimit: want.rate_limit = req.rate_limit; break;
      default: FAIL() << "no expectation for " << n.name;
    }
    ApplyModify(qp, req, n.bit);
    EXPECT_EQ(qp, want) << n.name;
  }
}

TEST(ApplyModify, MovesToTheNewStateAndReportsItAsCurState) {
  QpAttributes qp = Distinct(S::kRtr);
  QpAttributes req = Request(S::kRtr, S::kRts);
  ApplyModify(qp, req, kQpState);
  EXPECT_EQ(qp.state, S::kRts);
  EXPECT_EQ(qp.cur_state, S::kRts);
  EXPECT_EQ(qp.sq_psn, 2u);  // not masked: unchanged
}

TEST(ApplyModify, WithoutStateTheStateStays) {
  QpAttributes qp = Distinct(S::kRts);
  QpAttributes req = Request(S::kRts, S::kErr);  // state ignored without IBV_QP_STATE
  ApplyModify(qp, req, kQpMinRnrTimer);
  EXPECT_EQ(qp.state, S::kRts);
  EXPECT_EQ(qp.min_rnr_timer, req.min_rnr_timer);
}

TEST(ApplyModify, CutsPsnsTo24Bits) {
  QpAttributes qp = Distinct(S::kRtr);
  QpAttributes req = Request(S::kRtr, S::kRts);
  req.sq_psn = 0xff123456;
  req.rq_psn = 0x01abcdef;
  ApplyModify(qp, req, kQpSqPsn | kQpRqPsn);
  EXPECT_EQ(qp.sq_psn, 0x123456u);
  EXPECT_EQ(qp.rq_psn, 0xabcdefu);
}

TEST(ApplyModify, ResetForgetsEverythingButTheQueueSizes) {
  QpAttributes qp = Distinct(S::kRts);
  qp.ah_attr = RoceAv();
  ApplyModify(qp, Request(S::kRts, S::kReset), kQpState);
  QpAttributes want;
  want.cap = Distinct(S::kRts).cap;
  EXPECT_EQ(qp, want);
  EXPECT_EQ(qp.state, S::kReset);
}

TEST(ApplyModify, SqdSetsDrainingAndLeavingItClears) {
  QpAttributes qp = InState(S::kRts);
  QpAttributes req = Request(S::kRts, S::kSqd);
  ApplyModify(qp, req, kQpState | kQpEnSqdAsyncNotify);
  EXPECT_EQ(qp.state, S::kSqd);
  EXPECT_TRUE(qp.sq_draining);
  EXPECT_TRUE(qp.en_sqd_async_notify);

  qp.sq_draining = false;  // the transport saw the send queue drain
  ApplyModify(qp, Request(S::kSqd, S::kSqd), kQpState | kQpTimeout);
  EXPECT_FALSE(qp.sq_draining) << "SQD -> SQD does not start a new drain";

  qp.sq_draining = true;
  ApplyModify(qp, Request(S::kSqd, S::kRts), kQpState);
  EXPECT_EQ(qp.state, S::kRts);
  EXPECT_FALSE(qp.sq_draining);
}

TEST(ApplyModify, RcQpWalksResetInitRtrRts) {
  QpAttributes qp;
  qp.cap = {16, 16, 1, 1, 64};
  const QpLimits limits = Limits();
  struct Step {
    QpState to;
    uint32_t mask;
  };
  QpState from = S::kReset;
  for (Step step : {Step{S::kInit, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags},
                    Step{S::kRtr, kRcRtr}, Step{S::kRts, kRcRts}}) {
    QpAttributes req = Request(from, step.to);
    Status s = CheckModify(QpType::kRc, qp, req, step.mask, limits);
    ASSERT_TRUE(s.ok()) << ToString(step.to) << ": " << s.message();
    ApplyModify(qp, req, step.mask);
    from = step.to;
  }
  EXPECT_EQ(qp.state, S::kRts);
  EXPECT_EQ(qp.port_num, 1);
  EXPECT_EQ(qp.dest_qp_num, 0x123u);
  EXPECT_EQ(qp.path_mtu, Mtu::k1024);
  EXPECT_EQ(qp.rq_psn, 0x10u);
  EXPECT_EQ(qp.sq_psn, 0x20u);
  EXPECT_EQ(qp.timeout, 14);
  EXPECT_EQ(qp.ah_attr, RoceAv());
  EXPECT_EQ(qp.qkey, 0u) << "never masked";
  EXPECT_EQ(qp.cap.max_inline_data, 64u);
}

// ---------------------------------------------------------------- names

TEST(QpStateNames, EveryValueHasAName) {
  EXPECT_EQ(ToString(S::kReset), "RESET");
  EXPECT_EQ(ToString(S::kInit), "INIT");
  EXPECT_EQ(ToString(S::kRtr), "RTR");
  EXPECT_EQ(ToString(S::kRts), "RTS");
  EXPECT_EQ(ToString(S::kSqd), "SQD");
  EXPECT_EQ(ToString(S::kSqe), "SQE");
  EXPECT_EQ(ToString(S::kErr), "ERR");
  EXPECT_EQ(ToString(static_cast<QpState>(7)), "?");
  EXPECT_EQ(ToString(QpType::kRc), "RC");
  EXPECT_EQ(ToString(QpType::kUc), "UC");
  EXPECT_EQ(ToString(QpType::kUd), "UD");
  EXPECT_EQ(ToString(QpType::kXrcSend), "XRC_SEND");
  EXPECT_EQ(ToString(QpType::kXrcRecv), "XRC_RECV");
  EXPECT_EQ(ToString(static_cast<QpType>(1)), "?");
  EXPECT_EQ(ToString(MigState::kMigrated), "MIGRATED");
  EXPECT_EQ(ToString(MigState::kArmed), "ARMED");
  EXPECT_EQ(MtuBytes(Mtu::k256), 256u);
  EXPECT_EQ(MtuBytes(Mtu::k4096), 4096u);
  EXPECT_EQ(MtuBytes(Mtu{0}), 0u);
}

TEST(QpStateNames, AttrNameTableHasEveryBitOnce) {
  uint32_t seen = 0;
  for (const QpAttrName& n : kQpAttrNames) {
    EXPECT_EQ(n.bit & (n.bit - 1), 0u) << n.name << " is one bit";
    EXPECT_EQ(seen & n.bit, 0u) << n.name << " twice";
    EXPECT_EQ(n.name.substr(0, 7), "IBV_QP_");
    seen |= n.bit;
  }
  EXPECT_EQ(seen, kQpKnownAttrMask);
}

TEST(QpStateNames, MaskToStringFollowsTheManPageOrder) {
  EXPECT_EQ(QpAttrMaskToString(0), "");
  EXPECT_EQ(QpAttrMaskToString(kQpTimeout | kQpSqPsn | kQpState),
            "IBV_QP_STATE, IBV_QP_SQ_PSN, IBV_QP_TIMEOUT");
  EXPECT_EQ(QpAttrMaskToString(kQpQkey | (1u << 22)), "IBV_QP_QKEY, 0x400000");
}


// ------------------------------------------------- path migration and SQD

// A QP in `state` whose path migration state is `mig`, with an alternate
// path on port 1 when `alt`.
QpAttributes Migrating(QpState state, MigState mig, bool alt) {
  QpAttributes qp = InState(state);
  qp.path_mig_state = mig;
  if (alt) {
    qp.alt_port_num = 1;
    qp.alt_ah_attr = RoceAv();
  }
  return qp;
}

Status SetMig(const QpAttributes& qp, MigState to, uint32_t extra = 0, QpState state = S::kRts) {
  QpAttributes r = Request(qp.state, state);
  r.path_mig_state = to;
  return CheckModify(QpType::kRc, qp, r, kQpState | kQpPathMigState | extra, Limits());
}

TEST(PathMigration, RearmIsLoadedFromMigratedWithAnAlternatePath) {
  EXPECT_TRUE(SetMig(Migrating(S::kRts, MigState::kMigrated, true), MigState::kRearm).ok());
  // The alternate path may come in the same modify.
  EXPECT_TRUE(SetMig(Migrating(S::kRts, MigState::kMigrated, false), MigState::kRearm, kQpAltPath).ok());
  Status s = SetMig(Migrating(S::kRts, MigState::kMigrated, false), MigState::kRearm);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("IBV_MIG_REARM needs an alternate path"), std::string::npos) << s.message();
  s = SetMig(Migrating(S::kRts, MigState::kArmed, true), MigState::kRearm);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("the path is ARMED"), std::string::npos) << s.message();
}

TEST(PathMigration, ArmedOnlyFollowsRearm) {
  EXPECT_TRUE(SetMig(Migrating(S::kRts, MigState::kRearm, true), MigState::kArmed).ok());
  Status s = SetMig(Migrating(S::kRts, MigState::kMigrated, true), MigState::kArmed);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("REARM\u2192ARMED"), std::string::npos) << s.message();
  // Setting the state the QP is already in changes nothing and is accepted.
  EXPECT_TRUE(SetMig(Migrating(S::kRts, MigState::kArmed, true), MigState::kArmed).ok());
  EXPECT_TRUE(SetMig(Migrating(S::kRts, MigState::kMigrated, false), MigState::kMigrated).ok());
}

TEST(PathMigration, MigratedForcesAMigrationOnlyFromArmedInRts) {
  EXPECT_TRUE(SetMig(Migrating(S::kRts, MigState::kArmed, true), MigState::kMigrated).ok());
  EXPECT_TRUE(SetMig(Migrating(S::kSqd, MigState::kArmed, true), MigState::kMigrated).ok())
      << "SQD -> RTS ends in RTS";
  Status s = SetMig(Migrating(S::kSqd, MigState::kArmed, true), MigState::kMigrated, 0, S::kSqd);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("the QP goes to SQD"), std::string::npos) << s.message();
  s = SetMig(Migrating(S::kRts, MigState::kRearm, true), MigState::kMigrated);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("needs the path ARMED"), std::string::npos) << s.message();
}

TEST(PathMigration, AnArmedAlternatePathCannotBeReplaced) {
  QpAttributes r = Request(S::kRts, S::kRts);
  Status s = CheckModify(QpType::kRc, Migrating(S::kRts, MigState::kArmed, true), r,
                         kQpState | kQpAltPath, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("IBV_QP_ALT_PATH: the alternate path is ARMED"), std::string::npos)
      << s.message();
  EXPECT_TRUE(CheckModify(QpType::kRc, Migrating(S::kRts, MigState::kRearm, true), r,
                          kQpState | kQpAltPath, Limits())
                  .ok());
}

TEST(PathMigration, TheAlternateAvFollowsItsOwnPortsLinkLayer) {
  QpAttributes r = Request(S::kRtr, S::kRts);
  r.alt_ah_attr.has_grh = false;
  QpLimits ib_primary = Limits();
  ib_primary.roce = false;  // port 1 InfiniBand, the alternate port RoCE
  Status s = CheckModify(QpType::kRc, InState(S::kRtr), r, kRcRts | kQpAltPath, ib_primary);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("alternate address vector needs a GRH"), std::string::npos) << s.message();
  ib_primary.alt_roce = false;
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kRtr), r, kRcRts | kQpAltPath, ib_primary).ok());
}

TEST(SqdModify, AttributesChangeOnlyOnceTheSendQueueIsDrained) {
  QpAttributes draining = InState(S::kSqd);
  draining.sq_draining = true;
  QpAttributes r = Request(S::kSqd, S::kSqd);
  Status s = CheckModify(QpType::kRc, draining, r, kQpState | kQpTimeout, Limits());
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("IBV_QP_TIMEOUT cannot be modified while the send queue is still draining"),
            std::string::npos)
      << s.message();
  // Staying in SQD with no attribute, or resuming, is fine while draining.
  EXPECT_TRUE(CheckModify(QpType::kRc, draining, r, kQpState, Limits()).ok());
  EXPECT_TRUE(CheckModify(QpType::kRc, draining, Request(S::kSqd, S::kRts), kQpState, Limits()).ok());
  EXPECT_TRUE(CheckModify(QpType::kRc, InState(S::kSqd), r, kQpState | kQpTimeout, Limits()).ok());
}

}  // namespace
}  // namespace rdmaemu::objects
