// The protection boundary, model-checked at length: runs protection_runner.h
// for N cases (tools/model-check) and prints cases per second and how often
// each outcome came. Exit status 0 if the emulator agreed with the model on
// every case, 1 at the first disagreement (printed, with its seed), 2 on a
// usage error.
//
// Usage: protection_bench CASES [SEED]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "tests/emulator/engine/protection_runner.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CASES [SEED]\n", argv[0]);
    return 2;
  }
  const uint64_t cases = std::strtoull(argv[1], nullptr, 0);
  const uint64_t seed = argc == 3 ? std::strtoull(argv[2], nullptr, 0) : std::random_device{}();
  // Every refused request is a warning line; a run of millions would be
  // mostly log. The model's own message says what failed.
  setenv("RDMAEMU_LOG", "error", 0);
  rdmaemu::testing::ProtectionRunner runner(seed);
  if (!runner.setup_error().empty()) {
    std::fprintf(stderr, "model-check: %s\n", runner.setup_error().c_str());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  // In slices, so that a long run shows it is alive.
  constexpr uint64_t kSlice = 100000;
  bool ok = true;
  for (uint64_t done = 0; ok && done < cases; done += kSlice) {
    ok = runner.Run(std::min(kSlice, cases - done));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "model-check: %llu cases, %.0f cases/s\n",
                 static_cast<unsigned long long>(runner.stats().cases), runner.stats().cases / s);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("seed %llu: %llu cases in %.1f s, %.0f cases/s\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(runner.stats().cases), seconds, runner.stats().cases / seconds);
  for (const auto& [outcome, n] : runner.stats().outcomes) {
    std::printf("  %-40s %llu\n", outcome.c_str(), static_cast<unsigned long long>(n));
  }
  if (!ok) {
    std::printf("FAILED: %s\n", runner.failure().c_str());
    return 1;
  }
  return 0;
}
