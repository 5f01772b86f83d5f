// The fault rule language: good rules parse into what they say, canonical
// text parses back to the same thing, and every bad rule is refused with a
// message that quotes it and names the bad token.
#include "emulator/fault/parse.h"

#include <gtest/gtest.h>

#include <limits>

#include "emulator/wire/opcode.h"

namespace rdmaemu::fault {
namespace {

using wire::Opcode;

RuleSet Parse(std::string_view text) {
  auto set = ParseRules(text);
  EXPECT_TRUE(set.ok()) << text << ": " << set.status().message();
  return set.ok() ? *set : RuleSet{};
}

std::string Error(std::string_view text) {
  auto set = ParseRules(text);
  EXPECT_FALSE(set.ok()) << text << " was accepted";
  EXPECT_EQ(set.status().code(), EINVAL);
  return set.status().message();
}

TEST(FaultParse, TheIssuesExample) {
  RuleSet set = Parse("drop=0.05,dup=0.02,reorder=0.05,corrupt=0.01,seed=7");
  ASSERT_EQ(set.rules.size(), 1u);
  EXPECT_EQ(set.seed, 7u);
  const Rule& r = set.rules[0];
  ASSERT_EQ(r.effects.size(), 4u);
  EXPECT_EQ(r.effects[0].action, Action::kDrop);
  EXPECT_EQ(r.effects[0].trigger.kind, Trigger::Kind::kProbability);
  EXPECT_DOUBLE_EQ(r.effects[0].trigger.probability, 0.05);
  EXPECT_EQ(r.effects[1].action, Action::kDup);
  EXPECT_DOUBLE_EQ(r.effects[1].trigger.probability, 0.02);
  EXPECT_EQ(r.effects[2].action, Action::kReorder);
  EXPECT_EQ(r.effects[3].action, Action::kCorrupt);
  EXPECT_DOUBLE_EQ(r.effects[3].trigger.probability, 0.01);
  // Packet effects act on what the device sends unless told otherwise.
  EXPECT_EQ(r.filter.dir, kTx);
  EXPECT_TRUE(r.filter.any_opcode);
  EXPECT_TRUE(set.shaping.empty());
}

TEST(FaultParse, Triggers) {
  RuleSet set = Parse("drop; dup=5%; corrupt=#3; drop=#3..5; reorder=#10..; drop=1; drop=0");
  ASSERT_EQ(set.rules.size(), 7u);
  EXPECT_EQ(set.rules[0].effects[0].trigger.kind, Trigger::Kind::kAlways);
  EXPECT_DOUBLE_EQ(set.rules[1].effects[0].trigger.probability, 0.05);
  const Trigger& third = set.rules[2].effects[0].trigger;
  EXPECT_EQ(third.kind, Trigger::Kind::kCount);
  EXPECT_EQ(third.first, 3u);
  EXPECT_EQ(third.last, 3u);
  EXPECT_EQ(set.rules[3].effects[0].trigger.first, 3u);
  EXPECT_EQ(set.rules[3].effects[0].trigger.last, 5u);
  EXPECT_EQ(set.rules[4].effects[0].trigger.first, 10u);
  EXPECT_EQ(set.rules[4].effects[0].trigger.last, std::numeric_limits<uint64_t>::max());
  EXPECT_DOUBLE_EQ(set.rules[5].effects[0].trigger.probability, 1.0);
  EXPECT_DOUBLE_EQ(set.rules[6].effects[0].trigger.probability, 0.0);
}

TEST(FaultParse, DelayFixedJitteredAndTriggered) {
  RuleSet set = Parse("delay=200us; delay=100us~50us; delay=1.5ms/0.1; delay=2ms~1ms/#2");
  ASSERT_EQ(set.rules.size(), 4u);
  EXPECT_EQ(set.rules[0].effects[0].delay, std::chrono::microseconds(200));
  EXPECT_EQ(set.rules[0].effects[0].jitter.count(), 0);
  EXPECT_EQ(set.rules[0].effects[0].trigger.kind, Trigger::Kind::kAlways);
  EXPECT_EQ(set.rules[1].effects[0].delay, std::chrono::microseconds(100));
  EXPECT_EQ(set.rules[1].effects[0].jitter, std::chrono::microseconds(50));
  EXPECT_EQ(set.rules[2].effects[0].delay, std::chrono::microseconds(1500));
  EXPECT_DOUBLE_EQ(set.rules[2].effects[0].trigger.probability, 0.1);
  EXPECT_EQ(set.rules[3].effects[0].trigger.kind, Trigger::Kind::kCount);
  EXPECT_EQ(set.rules[3].effects[0].trigger.first, 2u);
}

TEST(FaultParse, Filters) {
  RuleSet set = Parse("drop=#3@op=READ_RESPONSE,dir=rx,dev=emu1,port=1,qpn=0x11,dst_qpn=42");
  ASSERT_EQ(set.rules.size(), 1u);
  const Filter& f = set.rules[0].filter;
  EXPECT_EQ(f.dir, kRx);
  EXPECT_EQ(f.device, "emu1");
  EXPECT_EQ(f.port, 1);
  EXPECT_EQ(f.qpn, 0x11u);
  EXPECT_EQ(f.dst_qpn, 42u);
  EXPECT_FALSE(f.any_opcode);
  // The family is every read response and nothing else.
  for (const wire::OpcodeInfo& info : wire::kOpcodeTable) {
    if (!info.valid()) continue;
    const bool response = info.Has(wire::kReadMask | wire::kResponseMask);
    EXPECT_EQ(f.opcodes[static_cast<uint8_t>(info.opcode)], response) << info.name;
  }
}

TEST(FaultParse, OpcodeNamesWithAndWithoutTransportAndFamilies) {
  auto ops = [](std::string_view text) { return Parse(text).rules.at(0).filter.opcodes; };
  auto only = ops("drop@op=RC_RDMA_READ_RESPONSE_ONLY");
  EXPECT_TRUE(only[static_cast<uint8_t>(Opcode::RC_RDMA_READ_RESPONSE_ONLY)]);
  EXPECT_FALSE(only[static_cast<uint8_t>(Opcode::RC_RDMA_READ_RESPONSE_LAST)]);
  // Without the transport: every transport's opcode of that name.
  auto send_only = ops("drop@op=send_only");
  EXPECT_TRUE(send_only[static_cast<uint8_t>(Opcode::RC_SEND_ONLY)]);
  EXPECT_TRUE(send_only[static_cast<uint8_t>(Opcode::UC_SEND_ONLY)]);
  EXPECT_TRUE(send_only[static_cast<uint8_t>(Opcode::UD_SEND_ONLY)]);
  EXPECT_FALSE(send_only[static_cast<uint8_t>(Opcode::RC_SEND_FIRST)]);
  auto ack = ops("drop@op=ACK");
  EXPECT_TRUE(ack[static_cast<uint8_t>(Opcode::RC_ACKNOWLEDGE)]);
  EXPECT_TRUE(ack[static_cast<uint8_t>(Opcode::RC_ATOMIC_ACKNOWLEDGE)]);
  EXPECT_FALSE(ack[static_cast<uint8_t>(Opcode::RC_RDMA_READ_RESPONSE_ONLY)]);
  auto several = ops("drop@op=WRITE|UD");
  EXPECT_TRUE(several[static_cast<uint8_t>(Opcode::UC_RDMA_WRITE_MIDDLE)]);
  EXPECT_TRUE(several[static_cast<uint8_t>(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE)]);
  EXPECT_FALSE(several[static_cast<uint8_t>(Opcode::RC_SEND_ONLY)]);
}

TEST(FaultParse, ForcedEventsActOnWhatAQpReceives) {
  RuleSet set = Parse("rnr=#1@qpn=17; nak=access/#2@qpn=17; nak=seq; error=0.5");
  ASSERT_EQ(set.rules.size(), 4u);
  EXPECT_EQ(set.rules[0].effects[0].action, Action::kRnr);
  EXPECT_EQ(set.rules[0].filter.dir, kRx);
  EXPECT_EQ(set.rules[1].effects[0].action, Action::kNak);
  EXPECT_EQ(set.rules[1].effects[0].nak, wire::NakCode::kRemoteAccessError);
  EXPECT_EQ(set.rules[1].effects[0].trigger.first, 2u);
  EXPECT_EQ(set.rules[2].effects[0].nak, wire::NakCode::kPsnSequenceError);
  EXPECT_EQ(set.rules[3].effects[0].action, Action::kError);
  EXPECT_EQ(set.rules[3].filter.dir, kRx);
}

TEST(FaultParse, Shaping) {
  RuleSet set = Parse("rate=10gbps,latency=50us@port=1; rate=auto; rate=off@dev=emu1; rate=1.5Mbps");
  EXPECT_TRUE(set.rules.empty());
  ASSERT_EQ(set.shaping.size(), 4u);
  EXPECT_EQ(set.shaping[0].rate_bps, 10000000000u);
  EXPECT_EQ(set.shaping[0].latency, std::chrono::microseconds(50));
  EXPECT_EQ(set.shaping[0].port, 1);
  EXPECT_TRUE(set.shaping[1].rate_auto);
  EXPECT_TRUE(set.shaping[2].rate_set);
  EXPECT_EQ(set.shaping[2].rate_bps, 0u);
  EXPECT_EQ(set.shaping[2].device, "emu1");
  EXPECT_EQ(set.shaping[3].rate_bps, 1500000u);
}

TEST(FaultParse, SeparatorsAndSpaces) {
  RuleSet set = Parse(" drop = 0.1 , dup ;\n delay=1ms @ dir = rx ;; ");
  ASSERT_EQ(set.rules.size(), 2u);
  EXPECT_EQ(set.rules[1].filter.dir, kRx);
  EXPECT_TRUE(Parse("").rules.empty());
}

TEST(FaultParse, CanonicalTextParsesBackTheSame) {
  const char* texts[] = {
      "drop=0.05,dup=0.02,reorder=0.05,corrupt=0.01",
      "drop=#3@op=READ_RESPONSE",
      "delay=100us~50us/0.25@dir=both,dev=emu0,port=1,qpn=0x11,dst_qpn=0x2a,op=SEND|ACK",
      "nak=operational/#1..2@qpn=0x11",
      "rnr=#4..@op=SEND_ONLY",
      "error",
  };
  for (const char* text : texts) {
    RuleSet set = Parse(text);
    ASSERT_EQ(set.rules.size(), 1u) << text;
    const std::string canonical = ToString(set.rules[0]);
    EXPECT_EQ(canonical, text);
    RuleSet again = Parse(canonical);
    ASSERT_EQ(again.rules.size(), 1u);
    EXPECT_EQ(ToString(again.rules[0]), canonical);
  }
  RuleSet shaping = Parse("rate=10gbps,latency=50us@port=1");
  EXPECT_EQ(ToString(shaping.shaping.at(0)), "rate=10gbps,latency=50us@port=1");
}

TEST(FaultParse, UnknownFaultNamesItAndTheKnownOnes) {
  const std::string e = Error("dorp=0.1");
  EXPECT_EQ(e.rfind("\"dorp=0.1\": unknown fault \"dorp\" (known: drop, dup, corrupt, reorder, delay", 0), 0u)
      << e;
  EXPECT_NE(Error("drop=0.1; bogus").find("\"bogus\": unknown fault \"bogus\""), std::string::npos);
}

TEST(FaultParse, BadValuesNameTheToken) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"drop=1.5", "drop: \"1.5\" is not a trigger"},
      {"drop=-0.1", "drop: \"-0.1\" is not a trigger"},
      {"drop=150%", "drop: \"150%\" is not a trigger"},
      {"drop=#0", "counts start at #1"},
      {"drop=#5..3", "must not run backwards"},
      {"drop=abc", "drop: \"abc\" is not a trigger"},
      {"delay", "delay needs a duration"},
      {"delay=200", "delay: \"200\" is not a duration"},
      {"delay=5parsecs", "delay: \"5parsecs\" is not a duration"},
      {"delay=10us~20us", "the jitter \"20us\" is larger than the delay \"10us\""},
      {"delay=1ms/2", "delay: \"2\" is not a trigger"},
      {"nak", "nak needs a kind"},
      {"nak=rude", "nak: unknown kind \"rude\" (known: seq, invalid, access, operational)"},
      {"rate=fast", "rate: \"fast\" is not a rate"},
      {"latency=soon", "latency: \"soon\" is not a duration"},
      {"seed=x", "seed: \"x\" is not a number"},
      {"drop@qnp=3", "unknown filter \"qnp\" (known: dir, dev, port, qpn, dst_qpn, op)"},
      {"drop@dir=up", "dir: \"up\" is not tx, rx or both"},
      {"drop@port=3", "port: \"3\" is not a port number"},
      {"drop@qpn=0x1000000", "qpn: \"0x1000000\" is not a QP number"},
      {"drop@dev=em u0", "dev: \"em u0\" is not a device name"},
      {"drop@op=READ_RESP", "op: unknown opcode \"READ_RESP\""},
      {"drop@op", "filter \"op\" needs a value"},
      {"drop,drop=0.1", "\"drop\" is given twice"},
      {"drop@dir=rx,dir=tx", "filter \"dir\" is given twice"},
      {"drop,,dup", "an empty fault between commas"},
      {"@dir=rx", "an empty fault"},
      {"drop,rate=1gbps", "give them in a rule of their own"},
      {"rate=1gbps@qpn=3", "filter them by dev= and port= only"},
      {"drop,rnr", "forced events (rnr, nak, error) act on a QP"},
      {"rnr@dir=tx", "they take no dir=tx"},
      {"seed=3@dev=emu0", "seed is for the whole set"},
      {"seed=3;seed=4", "a second seed"},
  };
  for (const Case& c : cases) {
    const std::string e = Error(c.text);
    EXPECT_NE(e.find(c.expected), std::string::npos) << c.text << " gave: " << e;
    // Every message quotes the rule it is about.
    EXPECT_EQ(e.front(), '"') << e;
  }
}

TEST(FaultParse, NeverCrashesOnJunk) {
  const char* junk[] = {"@", ";", ",", "=", "#", "drop=#", "drop=#..", "drop=%", "delay=~",
                        "delay=1ms~", "delay=/", "nak=/", "op=", "drop@", "drop@=", "drop@op=|",
                        "rate=", "rate=gbps", "latency", "\xff\xfe", "drop=0x10", "drop=#1..x"};
  for (const char* j : junk) {
    auto set = ParseRules(j);
    if (!set.ok()) {
      EXPECT_FALSE(set.status().message().empty()) << j;
    }
  }
}

}  // namespace
}  // namespace rdmaemu::fault
