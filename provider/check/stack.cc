// Capture through glibc's backtrace (the unwinder every C++ program already
// carries); symbolization through elfutils (libdwfl), which reads the
// program's DWARF line tables and its separate debug files the way gdb does.
#include "provider/check/stack.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "provider/check/interpose/hook.h"

namespace rdmaemu::check {
namespace {

std::string Demangle(const char* name) {
  if (name == nullptr) return {};
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return name;
  std::string s(out);
  std::free(out);
  return s;
}

// The ELF object holding this file's code: frames in it are ours.
const Dl_info& OwnObject() {
  static const Dl_info info = [] {
    Dl_info i{};
    dladdr(reinterpret_cast<void*>(&OwnObject), &i);
    return i;
  }();
  return info;
}

std::string_view Directory(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string_view{} : path.substr(0, slash);
}

// rdmaemu's libraries: this one, and the librdmacm.so.1 and interposer
// built beside it, whose frames also sit between the program and the checker.
bool Ours(uintptr_t pc) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0) return false;
  if (info.dli_fbase == OwnObject().dli_fbase) return true;
  std::string_view file = info.dli_fname != nullptr ? info.dli_fname : "";
  std::string_view own = OwnObject().dli_fname != nullptr ? OwnObject().dli_fname : "";
  if (Directory(file) != Directory(own)) return false;
  return file.ends_with("/librdmacm.so.1") || file.ends_with(std::string("/") + kInterposerName);
}

}  // namespace

Stack CaptureStack() {
  Stack s;
  void* buf[Stack::kMaxFrames];
  int n = backtrace(buf, Stack::kMaxFrames);
  for (int i = 0; i < n; ++i) s.pcs[i] = reinterpret_cast<uintptr_t>(buf[i]);
  s.depth = n;
  return s;
}

std::vector<Frame> Symbolize(const Stack& stack) {
  // The outermost frame of ours: everything inside it is the library's.
  int first = 0;
  for (int i = 0; i < stack.depth; ++i) {
    if (Ours(stack.pcs[i])) first = i + 1;
  }
  // A stack wholly inside one object (a test linked statically with the
  // checker) keeps every frame rather than none.
  if (first >= stack.depth) first = 0;

  static std::mutex mu;  // libdwfl sessions are not thread-safe
  std::lock_guard lock(mu);
  static char* debuginfo_path = nullptr;
  static const Dwfl_Callbacks callbacks = {
      .find_elf = dwfl_linux_proc_find_elf,
      .find_debuginfo = dwfl_standard_find_debuginfo,
      .section_address = nullptr,
      .debuginfo_path = &debuginfo_path,
  };
  // A session per report: the program may have loaded libraries since the
  // last one, and reports are rare.
  Dwfl* dwfl = dwfl_begin(&callbacks);
  if (dwfl != nullptr) {
    if (dwfl_linux_proc_report(dwfl, getpid()) != 0) {
      dwfl_end(dwfl);
      dwfl = nullptr;
    } else {
      dwfl_report_end(dwfl, nullptr, nullptr);
    }
  }
  std::vector<Frame> frames;
  for (int i = first; i < stack.depth; ++i) {
    Frame f;
    f.pc = stack.pcs[i];
    // A return address points after the call; the call's line is the one
    // before it (every frame but a signal's is a return address here).
    uintptr_t pc = f.pc - 1;
    Dwfl_Module* mod = dwfl != nullptr ? dwfl_addrmodule(dwfl, pc) : nullptr;
    if (mod != nullptr) {
      Dwarf_Addr base = 0;
      const char* modname = dwfl_module_info(mod, nullptr, &base, nullptr, nullptr, nullptr,
                                             nullptr, nullptr);
      if (modname != nullptr) f.module = modname;
      f.offset = f.pc - base;
      f.function = Demangle(dwfl_module_addrname(mod, pc));
      if (Dwfl_Line* line = dwfl_module_getsrc(mod, pc); line != nullptr) {
        int lineno = 0;
        const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
        if (file != nullptr) f.file = file;
        f.line = lineno;
      }
    } else {
      Dl_info info{};
      if (dladdr(reinterpret_cast<void*>(pc), &info) != 0) {
        if (info.dli_fname != nullptr) f.module = info.dli_fname;
        f.offset = f.pc - reinterpret_cast<uintptr_t>(info.dli_fbase);
        f.function = Demangle(info.dli_sname);
      }
    }
    frames.push_back(std::move(f));
    // Nothing a reader needs lies below main.
    if (frames.back().function == "main") break;
  }
  if (dwfl != nullptr) dwfl_end(dwfl);
  return frames;
}

std::string FormatFrames(const std::vector<Frame>& frames) {
  std::string out;
  int n = 0;
  for (const Frame& f : frames) {
    std::string where;
    if (!f.file.empty()) {
      where = fmt::format("{}:{}", f.file, f.line);
    } else {
      where = fmt::format("({}+{:#x})", f.module.empty() ? "?" : f.module, f.offset);
    }
    out += fmt::format("    #{} {} {}\n", n++, f.function.empty() ? "??" : f.function, where);
  }
  return out;
}

}  // namespace rdmaemu::check
