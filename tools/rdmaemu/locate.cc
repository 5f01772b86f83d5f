#include "tools/rdmaemu/locate.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

namespace rdmaemu::cli {
namespace fs = std::filesystem;
namespace {

bool IsLibrary(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), R_OK) == 0;
}

LibraryLocation At(const fs::path& file) {
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(fs::absolute(file.parent_path(), ec), ec);
  if (ec) dir = fs::absolute(file.parent_path());
  return LibraryLocation{dir.string(), (dir / kLibraryName).string(), {}};
}

// `value` names a directory holding libibverbs.so.1, or that file itself.
LibraryLocation FromSetting(const std::string& what, const std::string& value) {
  fs::path p(value);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (IsLibrary(p / kLibraryName)) return At(p / kLibraryName);
    return {{}, {}, fmt::format("{}: no readable {} in '{}'", what, kLibraryName, value)};
  }
  if (p.filename() == kLibraryName && IsLibrary(p)) return At(p);
  if (fs::exists(p, ec)) {
    return {{}, {}, fmt::format("{}: '{}' is neither a directory nor a file named {}", what, value,
                                kLibraryName)};
  }
  return {{}, {}, fmt::format("{}: '{}' does not exist", what, value)};
}

}  // namespace

std::vector<std::string> DefaultCandidates(const LibrarySearch& search) {
  std::vector<std::string> out;
  const std::string rel = std::string("verbs/") + kLibraryName;
  if (search.runfiles_dir && !search.runfiles_dir->empty()) {
    out.push_back((fs::path(*search.runfiles_dir) / "rdmaemu" / rel).string());
  }
  // Run from a runfiles tree (a test's data), argv0 is
  // .../rdmaemu/tools/rdmaemu/rdmaemu: the library sits at .../rdmaemu/verbs.
  if (!search.argv0.empty() && search.argv0.find('/') != std::string::npos) {
    fs::path a = fs::absolute(search.argv0);
    out.push_back((a.string() + ".runfiles") + "/rdmaemu/" + rel);
    out.push_back((a.parent_path().parent_path().parent_path() / rel).string());
  }
  if (!search.self_exe.empty()) {
    fs::path e(search.self_exe);
    // Installed (tools/install): PREFIX/bin/rdmaemu, PREFIX/lib/rdmaemu/.
    out.push_back((e.parent_path().parent_path() / "lib" / "rdmaemu" / kLibraryName).string());
    out.push_back(e.string() + ".runfiles/rdmaemu/" + rel);
    out.push_back((e.parent_path().parent_path().parent_path() / rel).string());
  }
  return out;
}

LibraryLocation FindLibrary(const LibrarySearch& search) {
  if (search.lib_option) return FromSetting("--lib", *search.lib_option);
  if (search.lib_env && !search.lib_env->empty()) return FromSetting("RDMAEMU_LIB", *search.lib_env);
  std::vector<std::string> candidates = DefaultCandidates(search);
  for (const auto& c : candidates) {
    if (IsLibrary(c)) return At(c);
  }
  std::string looked;
  for (const auto& c : candidates) looked += fmt::format("\n  {}", c);
  return {{}, {},
          fmt::format("cannot find the built {}; build it with `bazel build //verbs:{}`, "
                      "or pass --lib DIR or set RDMAEMU_LIB=DIR. Looked at:{}",
                      kLibraryName, kLibraryName, looked)};
}

std::string WithInterposer(const char* old, const std::string& dir) {
  std::string entry = (fs::path(dir) / kInterposerName).string();
  if (entry.find_first_of(" :") != std::string::npos) entry = kInterposerName;
  std::string current = old != nullptr ? old : "";
  // Entries are separated by spaces or colons.
  size_t pos = 0;
  while (pos <= current.size()) {
    size_t end = current.find_first_of(" :", pos);
    if (end == std::string::npos) end = current.size();
    if (current.compare(pos, end - pos, entry) == 0) return current;
    pos = end + 1;
  }
  return current.empty() ? entry : current + ":" + entry;
}

LibrarySearch CurrentSearch(const std::optional<std::string>& lib_option, const char* argv0) {
  LibrarySearch s;
  s.lib_option = lib_option;
  if (const char* e = std::getenv("RDMAEMU_LIB")) s.lib_env = e;
  if (const char* r = std::getenv("RUNFILES_DIR")) s.runfiles_dir = r;
  if (argv0 != nullptr) s.argv0 = argv0;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) s.self_exe = exe.string();
  return s;
}

}  // namespace rdmaemu::cli
