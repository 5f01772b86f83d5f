// Destroyed objects' memory, kept for a while before it is freed (as
// AddressSanitizer's quarantine does), only while the checker is on: a
// program that still holds a destroyed QP then reaches a pointer the library
// recognises as destroyed, never one malloc has handed to a new object.
#pragma once

#include <new>

#include "provider/check/check.h"

namespace rdmaemu::check {

// Keeps `memory` (destructed already) until kQuarantineObjects newer ones
// have come in, then frees it with `release`. Any thread.
inline constexpr int kQuarantineObjects = 4096;
void Quarantine(void* memory, void (*release)(void*));

// `delete object`, except that with the checker on the memory stays in the
// quarantine, with the public struct's fields (its context pointer, which
// verbs.h's inline functions follow) as they were.
template <typename T>
void Dispose(T* object) {
  if (!On()) {
    delete object;
    return;
  }
  object->~T();
  Quarantine(object, [](void* p) { ::operator delete(p); });
}

}  // namespace rdmaemu::check
