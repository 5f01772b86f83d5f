// The protection boundary, model-checked (issue 16, item 2): some thousands
// of random cases of protection_runner.h, from a fixed seed, on each engine
// backend. RDMAEMU_MODEL_SEED and RDMAEMU_MODEL_CASES replay a failure or
// run more; tools/model-check runs millions.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/emulator/engine/protection_runner.h"

namespace rdmaemu::testing {
namespace {

uint64_t FromEnv(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 0) : fallback;
}

TEST(ProtectionPropertyTest, NoRemoteRequestTouchesMemoryTheModelForbidsAndEveryAnswerMatches) {
  const uint64_t seed = FromEnv("RDMAEMU_MODEL_SEED", 20261205);
  const uint64_t cases = FromEnv("RDMAEMU_MODEL_CASES", 4000);
  ProtectionRunner runner(seed);
  ASSERT_EQ(runner.setup_error(), "");
  const bool ok = runner.Run(cases);
  std::string counts;
  for (const auto& [outcome, n] : runner.stats().outcomes) counts += "\n  " + outcome + ": " + std::to_string(n);
  EXPECT_TRUE(ok) << runner.failure();
  std::printf("seed %llu: %llu cases%s\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(runner.stats().cases), counts.c_str());
}

}  // namespace
}  // namespace rdmaemu::testing
