// The control server: every process that opens an emulated device serves
// the control socket (protocol.h says where and what crosses it), through
// which `rdmaemu port|event|list|...` act on the process from outside.
//
// One thread, blocked in poll() on the listening socket until a client
// connects (no periodic wakeups: an idle process uses no CPU), serving one
// request at a time, each within a deadline. The socket is removed when the
// process ends: at exit() and return from main (atexit and a static
// destructor), and on SIGTERM / SIGINT when the application has no handler of
// its own (ours removes the socket, then the signal does what it would have
// done). After a kill -9 the socket stays; clients remove it when they find
// its process gone. A forked child does not serve its parent's socket; it
// starts its own if it opens a device.
#pragma once

#include <string>

namespace rdmaemu::control {

// Starts this process's server unless it runs. Called whenever a device
// context opens; cheap when running. A failure (the directory belongs to
// someone else, say) is logged once; the device works without the control
// plane.
void EnsureServer();
// The socket this process serves; empty if none.
std::string ServingPath();
// Stops the server and removes its socket (at exit, and for tests).
void StopServer();

}  // namespace rdmaemu::control
