// The emulated subnet manager's LID table, shared by every process on the
// machine (each process is its own host).
//
// There is no LRH on the wire (RoCEv2 over UDP), so a LID-routed packet (an
// AV or AH without a GRH, InfiniBand link layer) finds its host by address:
// a port's LID is, by default, the low 16 bits of its IPv4 address, and LID
// N resolves to the address with this port's upper 16 bits and N below.
// A port given another LID (configuration `lid=` or a LID change) records
// it here, so that every process resolves the new LID to the port and the
// old one to nobody, as a real subnet's forwarding tables would:
//   lid-N          "a.b.c.d pid"  LID N belongs to the port at a.b.c.d
//   addr-a.b.c.d   "N pid"        that port no longer has its default LID
// Files of processes that are gone are ignored (and replaced).
//
// The directory is $RDMAEMU_SUBNET_DIR, else $XDG_RUNTIME_DIR/rdmaemu-subnet,
// else /tmp/rdmaemu-subnet-UID.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "emulator/base/status.h"

namespace rdmaemu::device::subnet {

// The LID an address has when nothing else was assigned: its low 16 bits.
uint16_t DefaultLid(in_addr address);

// Gives the port at `address` the unicast LID `lid` (replacing `old_lid`).
// EADDRINUSE when another live port holds it; EIO when the table cannot be
// written. Giving back the default LID removes the records.
Status Assign(in_addr address, uint16_t old_lid, uint16_t lid);

// Removes this process's records for the port (the device closes).
void Release(in_addr address, uint16_t lid);

// Where LID `lid` is, seen from a port at `own`: an address in network order,
// or 0 when no port has that LID (its default owner took another).
uint32_t Resolve(in_addr own, uint16_t lid);

// The directory in use (for messages and tests).
std::string Directory();

// Holds the directory's lock (flock on DIR/.lock) while it lives: a change
// that reads a record and then replaces it (a dead process's record, a
// LID) is one step to every other process that takes the lock. The kernel
// lets go of it when the holder dies. Held for a few file operations only;
// where the lock file cannot be made, ok() is false and nothing is held.
// Threads of one process take it one at a time, and fork() waits for the
// holder to let go, so a fork child never inherits it (subnet.cc).
class DirectoryLock {
 public:
  DirectoryLock();
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const Status& status() const { return status_; }

 private:
  int fd_ = -1;
  Status status_ = Status::Ok();
};

// Whether the process that wrote a record still runs. A process that has
// exited but not been reaped yet (a zombie) does not: the kernel has
// already closed its files, and with them its RDMA resources, as the
// emulator's records must then count them gone too.
bool ProcessRunning(pid_t pid);

}  // namespace rdmaemu::device::subnet
