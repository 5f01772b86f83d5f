// The main of a fuzz target outside libFuzzer (the plain gcc build): feeds
// every file named on the command line (a directory: each file in it, in
// name order) to LLVMFuzzerTestOneInput once. `bazel test //...` runs each
// target this way over its checked-in seed corpus, so every seed and every
// crash reproducer kept there stays a regression test without clang.
//
// Usage: TARGET FILE_OR_DIR...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional, as in libFuzzer.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

bool RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A copy of exactly the input's size, as libFuzzer gives it, so a read
  // past the end is a read past an allocation (ASan sees it).
  std::vector<uint8_t> input(bytes.begin(), bytes.end());
  std::unique_ptr<uint8_t[]> exact(new uint8_t[input.size() + 1]);
  std::copy(input.begin(), input.end(), exact.get());
  LLVMFuzzerTestOneInput(exact.get(), input.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(arg);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs given\n");
    return 1;
  }
  size_t run = 0;
  for (const auto& f : files) {
    if (!RunFile(f)) return 1;
    ++run;
  }
  std::printf("replay: %zu input(s) ran without a crash\n", run);
  return 0;
}
