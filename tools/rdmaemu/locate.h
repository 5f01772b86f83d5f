// Finding the built libibverbs.so.1 that `run` and `devices` use.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace rdmaemu::cli {

inline constexpr const char* kLibraryName = "libibverbs.so.1";
// The checker's free/realloc/munmap interposer, built and installed beside
// kLibraryName (provider/check/interpose/hook.h names it too).
inline constexpr const char* kInterposerName = "librdmaemu_interpose.so";

struct LibrarySearch {
  std::optional<std::string> lib_option;  // --lib DIR (or the file itself)
  std::optional<std::string> lib_env;     // RDMAEMU_LIB
  std::optional<std::string> runfiles_dir;  // RUNFILES_DIR, set by Bazel
  std::string argv0;                      // how the tool was invoked
  std::string self_exe;                   // its real path (/proc/self/exe)
};

struct LibraryLocation {
  std::string dir;    // absolute directory to put first on LD_LIBRARY_PATH
  std::string path;   // dir + "/libibverbs.so.1"
  std::string error;  // non-empty: not found, and why
};

// Looks, in order, at --lib, RDMAEMU_LIB (either is final: if given and
// wrong, that is the error), then the tool's Bazel runfiles, then, from the
// tool's real path, an installed layout (PREFIX/bin/rdmaemu ->
// PREFIX/lib/rdmaemu/libibverbs.so.1) and `bazel-bin/verbs/`
// (bazel-bin/tools/rdmaemu/rdmaemu -> bazel-bin/verbs/libibverbs.so.1).
LibraryLocation FindLibrary(const LibrarySearch& search);

// LD_PRELOAD's value with the interposer at `dir` added after what `old`
// (LD_PRELOAD as it was, or NULL) holds: after, since AddressSanitizer's
// runtime must come first. A directory with a space or colon (LD_PRELOAD's
// separators) gives the bare name, which the loader then finds on
// LD_LIBRARY_PATH, where `dir` comes first. Unchanged if already there.
std::string WithInterposer(const char* old, const std::string& dir);

// The search inputs of this process.
LibrarySearch CurrentSearch(const std::optional<std::string>& lib_option, const char* argv0);

// Where FindLibrary looks after --lib and RDMAEMU_LIB, for error messages.
std::vector<std::string> DefaultCandidates(const LibrarySearch& search);

}  // namespace rdmaemu::cli
