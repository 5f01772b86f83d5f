// Call stacks for the checker's reports: captured cheaply where a mistake or
// an object's creation happens (return addresses only), symbolized only when
// a report prints them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rdmaemu::check {

struct Stack {
  static constexpr int kMaxFrames = 24;
  uintptr_t pcs[kMaxFrames];
  int depth = 0;
};

// The stack of the calling thread.
Stack CaptureStack();

struct Frame {
  uintptr_t pc = 0;
  std::string function;  // demangled; empty if no symbol covers pc
  std::string file;      // empty without debug info
  int line = 0;
  std::string module;    // the ELF file pc lies in
  uintptr_t offset = 0;  // of pc in it
};

// The frames a reader cares about: the program's and its other libraries',
// from the outermost call into rdmaemu's own libraries outwards (the frames
// inside them say nothing about the program's mistake). Symbolized through
// elfutils' libdwfl from the process's own mappings.
std::vector<Frame> Symbolize(const Stack& stack);

// "    #0 main prog.c:30" lines, one per frame, each ending in '\n'.
std::string FormatFrames(const std::vector<Frame>& frames);

}  // namespace rdmaemu::check
