// The fault rule language: text -> RuleSet (docs/faults.md is the reference).
//
//   rules  := rule (';' rule)*                      (newlines separate rules too)
//   rule   := effect (',' effect)* ['@' filter (',' filter)*]
//   effect := drop | dup | corrupt | reorder [=TRIGGER]
//           | delay=DURATION[~JITTER][/TRIGGER]
//           | rnr[=TRIGGER] | nak=seq|invalid|access|operational[/TRIGGER]
//           | error[=TRIGGER]
//           | rate=auto|off|RATE | latency=DURATION  (link shaping)
//           | seed=N                                  (for the whole set)
//   TRIGGER := P (0..1) | N% | #N | #N..M | #N..    (no trigger: every match)
//   filter := dir=tx|rx|both | dev=NAME | port=N | qpn=N | dst_qpn=N
//           | op=NAME['|'NAME...]
//
// e.g. `drop=0.05,dup=0.02,reorder=0.05,corrupt=0.01,seed=7`,
// `drop=#3@op=READ_RESPONSE`, `delay=100us~50us@dir=rx,qpn=0x11`,
// `nak=access/#1@qpn=17`, `rate=10gbps,latency=50us@port=1`.
//
// Every error quotes the rule and names the token that is wrong, e.g.
//   "dorp=0.1": unknown fault "dorp" (known: drop, dup, ...)
#pragma once

#include <string>
#include <string_view>

#include "emulator/base/status.h"
#include "emulator/fault/rule.h"

namespace rdmaemu::fault {

// Parses a whole rule text (an empty text gives an empty set). EINVAL with a
// message naming the bad rule and token.
Result<RuleSet> ParseRules(std::string_view text);

// The names the language knows, for help texts and error messages.
std::string KnownEffects();
std::string KnownFilters();

}  // namespace rdmaemu::fault
