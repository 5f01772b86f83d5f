// The verbs checker (rdmaemu run --check, docs/check.md): reports the
// application mistakes a NIC turns into silent corruption, hangs and leaks.
//
// RDMAEMU_CHECK=warn|error is read once, when the library loads. Off, the
// checker costs one test of a constant flag where a hook sits and nothing on
// the data path (its op wrappers are installed only when it is on). On, each
// mistake prints one report on stderr:
//
//   rdmaemu-check: KIND: WHAT
//       #0 function file:line        (the call that made the mistake)
//     NOTE:                          (where the object was created, ...)
//       #0 ...
//
// and, with RDMAEMU_CHECK_REPORT=FILE, one JSON line in FILE. At exit a
// summary line counts the reports by kind; `error` then exits with status
// 86 if there was any.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "provider/check/stack.h"

namespace rdmaemu::check {

enum class Mode { kOff, kWarn, kError };

enum class Kind {
  kSendBufferChanged,
  kFreedRegisteredMemory,
  kDeregInFlight,
  kUnarmedWait,
  kAckMismatch,
  kUseAfterDestroy,
  kLeak,
  kCqTooSmall,
  kUnsignaledSqFull,
};
inline constexpr int kKinds = 9;

// "send-buffer-changed", ...: the KIND of a report's first line.
const char* KindName(Kind kind);

// The exit status of `error` mode when anything was reported.
inline constexpr int kErrorExitStatus = 86;

namespace internal {
extern bool g_on;  // constant once the library has loaded
}

// The one test every hook makes.
inline bool On() { return __builtin_expect(internal::g_on, false); }
Mode CurrentMode();

// A part of a report after the main stack: "qp#17 was created here".
struct Note {
  std::string title;
  Stack stack;
};

// Prints and records one report. `what` is the sentence after "KIND: ".
void Report(Kind kind, std::string_view what, const Stack& where, const std::vector<Note>& notes = {});

// How many reports of `kind` so far (tests).
int Count(Kind kind);

// True on a thread that is printing a report: hooks that a report itself
// can trigger (the allocator interposer) stay quiet then.
bool InReport();

// Called at exit, before the summary, in the order registered: the checks
// that look at what the program left (leaks, unacknowledged events).
void AtExit(void (*scan)());

// Sets the mode for this process from `mode` and `report_path` instead of
// the environment (the checker's own tests). Not thread-safe.
void Configure(Mode mode, const char* report_path);

}  // namespace rdmaemu::check
