// Fuzz target: the fault-rule language (fault::ParseRules), which takes text
// from RDMAEMU_FAULTS and from anyone who can reach the control socket
// (`rdmaemu fault add`). Beyond "never crashes": what parses must print
// (ToString) as text that parses again to the same canonical text, since
// `rdmaemu fault list` shows rules that way and users paste them back.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "emulator/fault/parse.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "fault_rules_fuzzer: %s\n  first:  %s\n  second: %s\n", what, a.c_str(),
               b.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmaemu::fault;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = ParseRules(text);
  if (!parsed.ok()) return 0;
  for (const Rule& rule : parsed->rules) {
    const std::string canonical = ToString(rule);
    auto again = ParseRules(canonical);
    if (!again.ok()) Fail("the canonical text of a rule does not parse", canonical, again.status().message());
    if (again->rules.size() != 1) Fail("the canonical text is not one rule", canonical, std::to_string(again->rules.size()));
    const std::string twice = ToString(again->rules[0]);
    if (twice != canonical) Fail("the canonical text changes when parsed again", canonical, twice);
  }
  for (const Shaping& shaping : parsed->shaping) {
    const std::string canonical = ToString(shaping);
    auto again = ParseRules(canonical);
    if (!again.ok()) Fail("the canonical text of a shaping does not parse", canonical, again.status().message());
    if (again->shaping.size() != 1) Fail("the canonical text is not one shaping", canonical, std::to_string(again->shaping.size()));
    const std::string twice = ToString(again->shaping[0]);
    if (twice != canonical) Fail("the canonical shaping changes when parsed again", canonical, twice);
  }
  return 0;
}
