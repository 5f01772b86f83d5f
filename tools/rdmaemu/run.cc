// `rdmaemu run [OPTIONS] -- PROGRAM [ARGS...]`: execs PROGRAM with the built
// libibverbs.so.1 (and librdmacm.so.1 beside it) first on LD_LIBRARY_PATH,
// the RDMAEMU_* variables set, and (unless --no-sysfs) a mount namespace
// whose /sys/class/infiniband shows the emulated devices (sysfs_view.h).
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/locate.h"
#include "tools/rdmaemu/options.h"
#include "tools/rdmaemu/sysfs_view.h"

namespace rdmaemu::cli {
namespace {

// With the checker on (from --check or the caller's RDMAEMU_CHECK, as the
// library reads it), the interposer beside the library goes on LD_PRELOAD so
// that free/realloc/munmap of registered memory is seen.
void PreloadInterposer(const std::string& lib_dir) {
  const char* mode = std::getenv("RDMAEMU_CHECK");
  if (mode == nullptr || *mode == '\0' || std::strcmp(mode, "off") == 0) return;
  std::string path = lib_dir + "/" + kInterposerName;
  if (::access(path.c_str(), R_OK) != 0) {
    PrintError("run", fmt::format("warning: {} is missing, so free, realloc and munmap of "
                                  "registered memory are not checked",
                                  path));
    return;
  }
  ::setenv("LD_PRELOAD", WithInterposer(std::getenv("LD_PRELOAD"), lib_dir).c_str(), 1);
}

}  // namespace

std::string RunHelp() {
  return "Usage: rdmaemu run [OPTIONS] [--] PROGRAM [ARGS...]\n"
         "\n"
         "Runs PROGRAM, unmodified, on the emulated RDMA device: puts the directory of\n"
         "the built libibverbs.so.1 first on LD_LIBRARY_PATH, sets the RDMAEMU_*\n"
         "variables from the options, and replaces itself with PROGRAM, so the exit\n"
         "status and signals are PROGRAM's own. PROGRAM is looked up on PATH like a\n"
         "shell does; if it is not found the status is 127 (126 if it cannot be run).\n"
         "The built librdmacm.so.1 (the RDMA CM, rdma_cma.h) is built beside\n"
         "libibverbs.so.1, so programs that use the CM load it from there too.\n"
         "\n"
         "Options (each sets the variable in brackets for PROGRAM):\n" +
         FormatOptions(kRunOptions) +
         "\n"
         "The library is taken from --lib, else RDMAEMU_LIB, else the tool's Bazel\n"
         "runfiles, else bazel-bin/verbs/ next to the tool's own bazel-bin.\n"
         "With the checker on, the librdmaemu_interpose.so beside it is added to\n"
         "LD_PRELOAD, to check free, realloc and munmap of registered memory.\n"
         "\n"
         "PROGRAM sees the emulated devices under /sys/class/infiniband, as the kernel\n"
         "shows real ones (node_guid, ports/N/state, link_layer, gids/0, the netdev in\n"
         "DEV/device/net/, ...), in a mount namespace of its own: a user namespace too\n"
         "unless run as root. Where the kernel allows neither, one warning says so and\n"
         "PROGRAM runs without it. --no-sysfs leaves /sys as it is (docs/sysfs.md).\n"
         "\n"
         "Examples:\n"
         "  rdmaemu run -- ibv_devinfo -v\n"
         "  rdmaemu run --log debug --config devices.conf -- ./my_prog --size 4096\n"
         "  rdmaemu run --check=error --check-report checks.json -- ./my_tests\n";
}

int RunMain(std::span<const std::string> args, const char* argv0) {
  ParsedArgs parsed = ParseArgs(args, kRunOptions);
  if (!parsed.error.empty()) return UsageError("run", parsed.error);
  if (parsed.help) {
    std::fputs(RunHelp().c_str(), stdout);
    return kExitOk;
  }
  if (std::string e = CheckEnvironmentOptions(parsed); !e.empty()) return UsageError("run", e);
  if (parsed.operands.empty()) return UsageError("run", "no PROGRAM given (rdmaemu run -- PROGRAM [ARGS...])");

  LibraryLocation lib = FindLibrary(CurrentSearch(parsed.Get("lib"), argv0));
  if (!lib.error.empty()) {
    PrintError("run", lib.error);
    return kExitFailure;
  }

  std::string path = lib.dir;
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old != nullptr && *old != '\0') {
    path += ":";
    path += old;
  }
  ::setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  ExportEnvironment(parsed);
  PreloadInterposer(lib.dir);
  // Last before exec: the namespace is this process's, and so PROGRAM's.
  if (!parsed.Get("no-sysfs")) {
    for (const auto& w : EnterSysfsView(lib.path, parsed.operands[0])) PrintError("run", w);
  }

  std::vector<char*> argv;
  for (const auto& a : parsed.operands) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(argv[0], argv.data());

  int err = errno;
  const std::string& program = parsed.operands[0];
  if (err == ENOENT || err == ENOTDIR) {
    if (program.find('/') == std::string::npos) {
      PrintError("run", fmt::format("{}: command not found (not on PATH)", program));
    } else {
      PrintError("run", fmt::format("{}: no such file", program));
    }
    return kExitNotFound;
  }
  PrintError("run", fmt::format("cannot execute {}: {}", program, std::strerror(err)));
  return kExitCannotExecute;
}

}  // namespace rdmaemu::cli
