// soak: a two-process verbs program that moves many messages of random
// sizes over RC (every kind of work request) or UD and checks every byte,
// the order and the count. Built against rdma-core's headers and linked
// against rdmaemu's libibverbs.so.1; run through `rdmaemu run`.
//
//   soak server [--port P]
//   soak client [--host H] [--port P] [--mode rc|ud] [--messages N] [--seed S] ...
//
// The client chooses the run and tells the server. Exit status: 0 all
// verified, 1 a mismatch (the first one is printed), 2 usage, 3 timeout,
// 4 setup failure or the peer failed.
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "tests/e2e/soak/channel.h"
#include "tests/e2e/soak/common.h"
#include "tests/e2e/soak/modes.h"

namespace soak {
namespace {

constexpr const char* kUsage = R"(usage: soak server|client [options]
  --mode rc|ud        what to run (client, which tells the server; default rc)
  --host ADDR         the server's address for the control connection (client; 127.0.0.1)
  --port N            TCP port of the control connection (18515)
  --messages N        messages to move (client; 100000)
  --seed N            seed of the plan: sizes, kinds, payloads (client; 1)
  --mtu N             RC path MTU: 256..4096 (client; 1024)
  --max-size N        largest message in bytes (client; 4 1/3 MTUs; UD: at most the port MTU)
  --depth N           work requests outstanding at once (client; 32)
  --batch N           messages per credit (RC) or per batch (UD) (client; 256)
  --device NAME       RDMA device (the first one)
  --gid-index N       GID index (0)
  --qp-timeout N      RC local ACK timeout exponent, 4.096 us * 2^N (14)
  --timeout SECONDS   give up after this long (300)
  --flip-byte N       self-test: alter one byte of the first SEND/WRITE payload at or
                      after message N, which the server must report (RC client)
)";

[[noreturn]] void Usage(const std::string& why) {
  fmt::print(stderr, "soak: {}\n{}", why, kUsage);
  std::exit(kExitUsage);
}

uint64_t Number(std::string_view flag, const char* v, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 0);
  if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi) {
    Usage(fmt::format("{} must be a number in {}..{}, not '{}'", flag, lo, hi, v));
  }
  return n;
}

Options Parse(int argc, char** argv) {
  if (argc < 2) Usage("say server or client");
  Options o;
  const std::string_view role = argv[1];
  if (role == "server") {
    o.server = true;
  } else if (role != "client") {
    Usage(fmt::format("the first argument is server or client, not '{}'", role));
  }
  bool max_size_set = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}", kUsage);
      std::exit(kExitOk);
    }
    if (i + 1 >= argc) Usage(fmt::format("{} needs a value", flag));
    const char* v = argv[++i];
    if (flag == "--mode") {
      if (std::strcmp(v, "rc") == 0) o.mode = Mode::kRc;
      else if (std::strcmp(v, "ud") == 0) o.mode = Mode::kUd;
      else Usage(fmt::format("--mode is rc or ud, not '{}'", v));
    } else if (flag == "--host") {
      o.host = v;
    } else if (flag == "--port") {
      o.port = static_cast<uint16_t>(Number(flag, v, 1, 65535));
    } else if (flag == "--messages") {
      o.params.messages = static_cast<uint32_t>(Number(flag, v, 1, 100000000));
    } else if (flag == "--seed") {
      o.params.seed = Number(flag, v, 0, UINT64_MAX);
    } else if (flag == "--mtu") {
      o.params.mtu = static_cast<uint32_t>(Number(flag, v, 256, 4096));
      if ((o.params.mtu & (o.params.mtu - 1)) != 0) Usage("--mtu must be 256, 512, 1024, 2048 or 4096");
    } else if (flag == "--max-size") {
      o.params.max_size = static_cast<uint32_t>(Number(flag, v, 8, 1 << 20));
      max_size_set = true;
    } else if (flag == "--depth") {
      o.params.depth = static_cast<uint32_t>(Number(flag, v, 1, 1024));
    } else if (flag == "--batch") {
      o.params.batch = static_cast<uint32_t>(Number(flag, v, 1, 1 << 16));
    } else if (flag == "--device") {
      o.device = v;
    } else if (flag == "--gid-index") {
      o.gid_index = static_cast<int>(Number(flag, v, 0, 255));
    } else if (flag == "--qp-timeout") {
      o.qp_timeout = static_cast<uint8_t>(Number(flag, v, 1, 31));
    } else if (flag == "--flip-byte") {
      o.flip_byte_at = static_cast<uint32_t>(Number(flag, v, 0, UINT32_MAX - 1));
    } else if (flag == "--timeout") {
      o.timeout_s = static_cast<unsigned>(Number(flag, v, 1, 86400));
    } else {
      Usage(fmt::format("unknown option {}", flag));
    }
  }
  // Over four MTUs, ending mid-packet.
  if (!max_size_set) o.params.max_size = 4 * o.params.mtu + o.params.mtu / 3;
  return o;
}

}  // namespace
}  // namespace soak

int main(int argc, char** argv) {
  using namespace soak;
  const Options o = Parse(argc, argv);
  SetRole(o.server);
  ArmTimeout(o.timeout_s);
  Channel ctl = o.server ? Channel::Accept(o.port) : Channel::Connect(o.host, o.port);
  // The client chooses the mode and tells the server.
  uint8_t mode = o.mode == Mode::kUd ? 1 : 0;
  if (o.server) {
    ctl.Recv(&mode);
  } else {
    ctl.Send(mode);
  }
  if (mode == 1) {
    return o.server ? RunUdServer(o, ctl) : RunUdClient(o, ctl);
  }
  return o.server ? RunRcServer(o, ctl) : RunRcClient(o, ctl);
}
