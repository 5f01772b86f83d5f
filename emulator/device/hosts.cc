#include "emulator/device/hosts.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "emulator/device/subnet.h"

namespace rdmaemu::device::hosts {
namespace {

struct Record {
  unsigned value = 0;  // a UDP port (slot-) or a slot (listen-)
  pid_t pid = 0;
};

std::string Text(in_addr a) {
  char text[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

std::string SlotFile(in_addr a, uint8_t slot) { return fmt::format("slot-{}-{}", Text(a), slot); }
std::string ListenFile(in_addr a, uint16_t ps, uint16_t port) {
  return fmt::format("listen-{}-{}-{}", Text(a), ps, port);
}

std::string PathOf(const std::string& name) { return subnet::Directory() + "/" + name; }

// A record of a live process, or nothing.
std::optional<Record> Read(const std::string& name) {
  std::ifstream in(PathOf(name));
  Record r;
  if (!(in >> r.value >> r.pid) || !subnet::ProcessRunning(r.pid)) return std::nullopt;
  return r;
}

// Creates the record only if no live process holds it: written whole to a
// private file, then linked into place (link fails if the name exists). A
// dead holder's record is replaced, under the directory's lock: without
// it, two processes that both found the record dead could each unlink
// what the other had just linked, and both hold the slot.
// EADDRINUSE when a live process holds it.
Status CreateExclusive(const std::string& name, unsigned value) {
  subnet::DirectoryLock lock;
  if (!lock.status().ok()) return lock.status();
  const std::string tmp = PathOf(fmt::format(".{}.{}", name, ::getpid()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << value << ' ' << ::getpid() << '\n';
    if (!out) return Status::Error(EIO, fmt::format("cannot write {}", tmp));
  }
  Status result = Status::Ok();
  for (int attempt = 0;; ++attempt) {
    if (::link(tmp.c_str(), PathOf(name).c_str()) == 0) break;
    const int err = errno;
    if (err == EEXIST && attempt == 0) {
      // This process's own record is held too: two devices of one process
      // at one address are two slots.
      if (auto holder = Read(name)) {
        result = Status::Error(EADDRINUSE, fmt::format("{} is held by process {}", name, holder->pid));
        break;
      }
      ::unlink(PathOf(name).c_str());  // a dead process's record
      continue;
    }
    result = Status::Error(err == EEXIST ? EADDRINUSE : EIO,
                           fmt::format("cannot create {}: {}", PathOf(name), std::strerror(err)));
    break;
  }
  ::unlink(tmp.c_str());
  return result;
}

// Removes a record only if this process wrote it.
void RemoveOwn(const std::string& name) {
  subnet::DirectoryLock lock;
  auto r = Read(name);
  if (r && r->pid == ::getpid()) ::unlink(PathOf(name).c_str());
}

}  // namespace

Result<uint8_t> Claim(in_addr address, uint16_t udp_port) {
  for (uint8_t slot = 1; slot < kSlots; ++slot) {
    Status s = CreateExclusive(SlotFile(address, slot), udp_port);
    if (s.ok()) return slot;
    if (s.code() != EADDRINUSE) return s;
  }
  return Status::Error(EADDRINUSE, fmt::format("all {} processes that may share {} are running", kSlots, Text(address)));
}

void Release(in_addr address, uint8_t slot) {
  if (slot != 0) RemoveOwn(SlotFile(address, slot));
}

std::optional<uint16_t> PortOf(in_addr address, uint8_t slot) {
  auto r = Read(SlotFile(address, slot));
  if (!r || r->value == 0 || r->value > 0xffff) return std::nullopt;
  return static_cast<uint16_t>(r->value);
}

Status Listen(in_addr address, uint16_t ps, uint16_t port, uint8_t slot) {
  return CreateExclusive(ListenFile(address, ps, port), slot);
}

void StopListening(in_addr address, uint16_t ps, uint16_t port) { RemoveOwn(ListenFile(address, ps, port)); }

uint8_t ListenerSlot(in_addr address, uint16_t ps, uint16_t port) {
  auto r = Read(ListenFile(address, ps, port));
  return r && r->value < kSlots ? static_cast<uint8_t>(r->value) : 0;
}

}  // namespace rdmaemu::device::hosts
