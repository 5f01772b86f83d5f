#include "emulator/device/subnet.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>

#include <fmt/format.h>

namespace rdmaemu::device::subnet {
namespace {

struct Record {
  std::string value;  // the address (lid-N) or the LID (addr-A)
  pid_t pid = 0;
};

std::string AddressText(in_addr a) {
  char text[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

// A record of a live process, or nothing.
std::optional<Record> Read(const std::string& name) {
  std::ifstream in(Directory() + "/" + name);
  Record r;
  if (!(in >> r.value >> r.pid) || !ProcessRunning(r.pid)) return std::nullopt;
  return r;
}

Status EnsureDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::Error(EIO, fmt::format("cannot create the subnet directory {}: {}", dir, std::strerror(errno)));
  }
  return Status::Ok();
}

Status Write(const std::string& name, const std::string& value) {
  const std::string dir = Directory();
  if (Status s = EnsureDirectory(dir); !s.ok()) return s;
  // Written whole, then renamed: a reader sees the old record or the new one.
  const std::string tmp = fmt::format("{}/.{}.{}", dir, name, ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << value << ' ' << ::getpid() << '\n';
    if (!out) return Status::Error(EIO, fmt::format("cannot write {}", tmp));
  }
  if (::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::Error(EIO, fmt::format("cannot write {}/{}: {}", dir, name, std::strerror(errno)));
  }
  return Status::Ok();
}

// Removes a record only if this process wrote it.
void RemoveOwn(const std::string& name) {
  auto r = Read(name);
  if (r && r->pid == ::getpid()) ::unlink((Directory() + "/" + name).c_str());
}

std::string LidFile(uint16_t lid) { return fmt::format("lid-{}", lid); }
std::string AddrFile(in_addr a) { return "addr-" + AddressText(a); }

}  // namespace

std::string Directory() {
  if (const char* d = std::getenv("RDMAEMU_SUBNET_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* r = std::getenv("XDG_RUNTIME_DIR"); r != nullptr && *r != '\0') {
    return std::string(r) + "/rdmaemu-subnet";
  }
  return fmt::format("/tmp/rdmaemu-subnet-{}", ::getuid());
}

uint16_t DefaultLid(in_addr address) { return static_cast<uint16_t>(ntohl(address.s_addr) & 0xffff); }

namespace {

// Held by a thread for as long as it holds a DirectoryLock, and by fork()
// (pthread_atfork) while it copies the process. A flock belongs to the open
// file description, which a fork child shares: a child forked while a
// thread held the lock would keep it held until the child exits or execs,
// and every other process would wait for it. With this, no DirectoryLock's
// file is open while fork copies the fds. Registered when the library
// loads, before the engine's handlers (engine.cc, registered on first use),
// so that fork takes it last, after the locks a DirectoryLock is taken
// under (prepare handlers run in reverse order of registration).
std::mutex& ForkMutex() {
  static std::mutex* mu = new std::mutex();  // never destroyed: a detached thread may hold it at exit
  return *mu;
}
[[maybe_unused]] const bool kForkHandlers = [] {
  ::pthread_atfork([] { ForkMutex().lock(); }, [] { ForkMutex().unlock(); }, [] { ForkMutex().unlock(); });
  return true;
}();

}  // namespace

DirectoryLock::DirectoryLock() {
  ForkMutex().lock();
  const std::string dir = Directory();
  if (status_ = EnsureDirectory(dir); !status_.ok()) return;
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    status_ = Status::Error(EIO, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    return;
  }
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    status_ = Status::Error(EIO, fmt::format("cannot lock {}: {}", path, std::strerror(errno)));
    ::close(fd_);
    fd_ = -1;
    return;
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing lets go of the flock
  ForkMutex().unlock();
}

Status Assign(in_addr address, uint16_t old_lid, uint16_t lid) {
  const std::string me = AddressText(address);
  DirectoryLock lock;
  if (!lock.status().ok()) return lock.status();
  if (auto holder = Read(LidFile(lid)); holder && holder->value != me) {
    return Status::Error(EADDRINUSE, fmt::format("LID {:#x} is already the LID of the port at {} (process {})",
                                                 lid, holder->value, holder->pid));
  }
  if (lid == DefaultLid(address)) {
    RemoveOwn(LidFile(lid));
    RemoveOwn(AddrFile(address));
  } else {
    if (Status s = Write(LidFile(lid), me); !s.ok()) return s;
    if (Status s = Write(AddrFile(address), std::to_string(lid)); !s.ok()) return s;
  }
  if (old_lid != lid && old_lid != DefaultLid(address)) RemoveOwn(LidFile(old_lid));
  return Status::Ok();
}

void Release(in_addr address, uint16_t lid) {
  if (lid == DefaultLid(address)) return;
  DirectoryLock lock;
  RemoveOwn(LidFile(lid));
  RemoveOwn(AddrFile(address));
}

uint32_t Resolve(in_addr own, uint16_t lid) {
  if (auto r = Read(LidFile(lid))) {
    in_addr a{};
    if (::inet_pton(AF_INET, r->value.c_str(), &a) == 1) return a.s_addr;
  }
  in_addr def{};
  def.s_addr = htonl((ntohl(own.s_addr) & 0xffff0000u) | lid);
  if (Read(AddrFile(def))) return 0;  // its port took another LID
  return def.s_addr;
}

bool ProcessRunning(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  // /proc/PID/stat: "PID (COMM) STATE ...", COMM may hold spaces and ')'.
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;  // no /proc: kill() said so
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace rdmaemu::device::subnet
