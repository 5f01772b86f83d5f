#include "tools/rdmaemu/sysfs_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "tools/rdmaemu/device_probe.h"
#include "tools/rdmaemu/sysfs_tree.h"

namespace rdmaemu::cli {
namespace {

constexpr const char* kClass = "/sys/class";
constexpr const char* kInfiniband = "/sys/class/infiniband";
// Like sysfs: no devices, no set-id programs, nothing to run.
constexpr unsigned long kTmpfsFlags = MS_NOSUID | MS_NODEV | MS_NOEXEC;

std::string Failed(std::string_view what) { return fmt::format("{}: {}", what, std::strerror(errno)); }

std::vector<Interface> Interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || i->ifa_netmask == nullptr) continue;
    Interface f;
    f.name = i->ifa_name;
    f.address = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    f.netmask = reinterpret_cast<const sockaddr_in*>(i->ifa_netmask)->sin_addr;
    f.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(f));
  }
  ::freeifaddrs(list);
  return out;
}

bool WriteText(const std::string& path, std::string_view text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  int err = errno;
  ::close(fd);
  errno = err;
  return ok;
}

// Enters a mount namespace of this process's own (in a user namespace of
// its own unless root) with / recursively private. Returns why not.
std::string EnterNamespaces() {
  if (::geteuid() == 0) {
    if (::unshare(CLONE_NEWNS) != 0) {
      return Failed("unshare(CLONE_NEWNS)") + " (root without CAP_SYS_ADMIN, as in a container?)";
    }
  } else {
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      return Failed("unshare(CLONE_NEWUSER|CLONE_NEWNS)") +
             " (no unprivileged user namespaces here: sysctl kernel.unprivileged_userns_clone or "
             "user.max_user_namespaces is 0, or a seccomp filter forbids them)";
    }
    // An unprivileged process may map only its own ids, and its gid only
    // once setgroups is denied. A security module may refuse even that.
    constexpr const char* kDenied = " (in the new user namespace; a security module's policy?)";
    if (!WriteText("/proc/self/setgroups", "deny")) return Failed("write /proc/self/setgroups") + kDenied;
    if (!WriteText("/proc/self/uid_map", fmt::format("{} {} 1", uid, uid))) {
      return Failed(fmt::format("mapping uid {}: write /proc/self/uid_map", uid)) + kDenied;
    }
    if (!WriteText("/proc/self/gid_map", fmt::format("{} {} 1", gid, gid))) {
      return Failed(fmt::format("mapping gid {}: write /proc/self/gid_map", gid)) + kDenied;
    }
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return Failed("making / private in the new mount namespace: mount");
  }
  return {};
}

std::string Populate(const std::string& root, const std::vector<SysfsNode>& tree) {
  for (const auto& n : tree) {
    const std::string path = root + "/" + n.path;
    switch (n.kind) {
      case SysfsNode::Kind::kDirectory:
        if (::mkdir(path.c_str(), 0755) != 0) return Failed(fmt::format("mkdir {}", path));
        break;
      case SysfsNode::Kind::kSymlink:
        if (::symlink(n.text.c_str(), path.c_str()) != 0) return Failed(fmt::format("symlink {}", path));
        break;
      case SysfsNode::Kind::kFile: {
        int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
        if (fd < 0) return Failed(fmt::format("create {}", path));
        bool ok = ::write(fd, n.text.data(), n.text.size()) == static_cast<ssize_t>(n.text.size()) &&
                  ::fchmod(fd, 0444) == 0;  // whatever the umask
        int err = errno;
        ::close(fd);
        errno = err;
        if (!ok) return Failed(fmt::format("write {}", path));
        break;
      }
    }
  }
  return {};
}

// An entry of the real /sys/class, held open so that it can be bound back
// once the tmpfs covers it.
struct ClassEntry {
  std::string name;
  int fd = -1;        // O_PATH
  mode_t type = 0;    // S_IFDIR, S_IFREG or S_IFLNK
  std::string target; // a symlink's
};

std::string ListClass(std::vector<ClassEntry>& entries) {
  DIR* dir = ::opendir(kClass);
  if (dir == nullptr) return Failed(fmt::format("cannot read {}", kClass));
  std::string error;
  while (dirent* e = ::readdir(dir)) {
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    ClassEntry c;
    c.name = std::string(name);
    c.fd = ::openat(::dirfd(dir), e->d_name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    if (c.fd < 0 || ::fstat(c.fd, &st) != 0) {
      error = Failed(fmt::format("cannot open {}/{}", kClass, name));
      if (c.fd >= 0) ::close(c.fd);
      break;
    }
    c.type = st.st_mode & S_IFMT;
    if (c.type == S_IFLNK) {
      char buf[4096];
      ssize_t n = ::readlinkat(c.fd, "", buf, sizeof buf);
      if (n < 0) {
        error = Failed(fmt::format("readlink {}/{}", kClass, name));
        ::close(c.fd);
        break;
      }
      c.target.assign(buf, static_cast<size_t>(n));
    }
    entries.push_back(std::move(c));
  }
  ::closedir(dir);
  return error;
}

// Puts an entry of the real /sys/class back at its name in the tmpfs.
std::string BindBack(const ClassEntry& c) {
  const std::string path = fmt::format("{}/{}", kClass, c.name);
  const std::string source = fmt::format("/proc/self/fd/{}", c.fd);
  if (c.type == S_IFLNK) {
    if (::symlink(c.target.c_str(), path.c_str()) != 0) return Failed(fmt::format("symlink {}", path));
    return {};
  }
  if (c.type == S_IFDIR) {
    if (::mkdir(path.c_str(), 0755) != 0) return Failed(fmt::format("mkdir {}", path));
  } else {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
    if (fd < 0) return Failed(fmt::format("create {}", path));
    ::close(fd);
  }
  // MS_REC: a user namespace may bind a mount only with what is mounted
  // under it.
  if (::mount(source.c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return Failed(fmt::format("cannot bind {} back", path));
  }
  return {};
}

// Mounts the view in the current mount namespace. On failure, what was
// mounted is undone, so the program sees /sys/class as it was.
std::string MountView(const std::vector<SysfsNode>& tree) {
  struct stat st {};
  const bool replace = ::stat(kInfiniband, &st) == 0;
  const char* target = replace ? kInfiniband : kClass;
  std::vector<ClassEntry> entries;
  std::string error;
  if (!replace) error = ListClass(entries);
  if (error.empty() && ::mount("rdmaemu", target, "tmpfs", kTmpfsFlags, "mode=755") != 0) {
    error = Failed(fmt::format("cannot mount a tmpfs on {}", target));
    for (auto& c : entries) ::close(c.fd);
    return error;
  }
  for (const auto& c : entries) {
    if (error.empty()) error = BindBack(c);
    ::close(c.fd);
  }
  if (error.empty() && !replace && ::mkdir(kInfiniband, 0755) != 0) error = Failed(fmt::format("mkdir {}", kInfiniband));
  if (error.empty()) error = Populate(kInfiniband, tree);
  if (error.empty() &&
      ::mount(nullptr, target, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | kTmpfsFlags, nullptr) != 0) {
    error = Failed(fmt::format("cannot make {} read-only", target));
  }
  if (!error.empty()) ::umount2(target, MNT_DETACH);
  return error;
}

// Enters the namespaces and mounts the view in a forked child, which then
// exits: returns why it could not, or nothing if this process can do it too.
std::string TryInChild(const std::vector<SysfsNode>& tree) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Failed("pipe");
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Failed("fork");
  }
  if (child == 0) {
    ::close(fds[0]);
    std::string error = EnterNamespaces();
    if (error.empty()) error = MountView(tree);
    if (!error.empty() && ::write(fds[1], error.data(), error.size()) < 0) {
      // The exit status below still says it failed.
    }
    ::_exit(error.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string error;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    error.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (error.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    error = "the process that tried it failed without saying why";
  }
  return error;
}

}  // namespace

std::vector<std::string> EnterSysfsView(const std::string& library_path, const std::string& program) {
  std::vector<std::string> warnings;
  auto not_seen = [&](std::string_view why) {
    warnings.push_back(fmt::format("warning: {} will not see /sys/class/infiniband: {}; --no-sysfs hides this warning",
                                   program, why));
    return warnings;
  };
  DeviceProbe probe = ProbeDevices(library_path);
  if (!probe.error.empty()) return not_seen(probe.error);
  for (const auto& w : probe.warnings) warnings.push_back("warning: /sys/class/infiniband/" + w);
  const std::vector<SysfsNode> tree = BuildSysfsTree(probe.devices, Interfaces());
  if (std::string e = TryInChild(tree); !e.empty()) return not_seen(e);
  if (std::string e = EnterNamespaces(); !e.empty()) return not_seen(e);
  if (std::string e = MountView(tree); !e.empty()) return not_seen(e);
  return warnings;
}

}  // namespace rdmaemu::cli
