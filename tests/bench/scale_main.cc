// tools/bench --scale: many RC QPs between two processes, and many
// create/connect/destroy cycles (tests/bench/scale.h). Prints the table;
// exit status 1 if anything failed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/bench/scale.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: scale [--qps N] [--rounds N] [--cycles N] [--bytes N]\n"
               "  --qps N     RC QPs in each of the two processes (default 10000)\n"
               "  --rounds N  rounds of one message each way per QP (default 3)\n"
               "  --cycles N  create/connect/send/destroy cycles of a QP pair (default 100000)\n"
               "  --bytes N   message size (default 64)\n");
  return 2;
}

bool Number(const char* text, int min, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > 100000000) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  rdmaemu::bench::ScaleOptions o;
  o.qps = 10000;
  o.cycles = 100000;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") return Usage() - 2;
    if (i + 1 >= argc) return Usage();
    int v = 0;
    const char* value = argv[++i];
    if (flag == "--qps" && Number(value, 1, &v)) {
      o.qps = v;
    } else if (flag == "--rounds" && Number(value, 1, &v)) {
      o.rounds = v;
    } else if (flag == "--cycles" && Number(value, 0, &v)) {
      o.cycles = v;
    } else if (flag == "--bytes" && Number(value, 1, &v)) {
      o.message_bytes = static_cast<uint32_t>(v);
    } else {
      std::fprintf(stderr, "scale: bad option or value: %s %s\n", flag.c_str(), value);
      return Usage();
    }
  }
  const rdmaemu::bench::ScaleResult r = rdmaemu::bench::RunScale(o);
  std::fputs(rdmaemu::bench::Describe(r).c_str(), stdout);
  return r.error.empty() ? 0 : 1;
}
