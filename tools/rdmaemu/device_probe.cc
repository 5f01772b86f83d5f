#include "tools/rdmaemu/device_probe.h"

#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "rdmaemu/rdmaemu.h"
#include "tools/rdmaemu/loaded_verbs.h"

namespace rdmaemu::cli {
namespace {

// How long the child may take to open every device (it takes milliseconds).
constexpr auto kProbeTimeout = std::chrono::seconds(10);
constexpr uint32_t kMaxPorts = 8;


// What the child learns of one device, written to the parent through a pipe
// as is (both sides are this binary).
struct PortRecord {
  uint8_t number, state, phys_state, link_layer, width, speed, fixed, gid_ok;
  uint16_t lid, sm_lid;
  uint32_t gid_type;
  in_addr address;
  uint8_t gid[16];
};
struct DeviceRecord {
  int32_t error;      // errno of the call that failed; 0: all went well
  char failed[32];    // that call
  char fw_ver[64];
  uint64_t node_guid;       // host order, as the child saw them (its pid's)
  uint64_t sys_image_guid;
  uint32_t ports;
  PortRecord port[kMaxPorts];
};


DeviceRecord QueryDevice(const LoadedVerbs& v, ibv_device* device) {
  DeviceRecord r{};
  auto failed = [&r](const char* call, int err) {
    r.error = err != 0 ? err : EIO;
    std::snprintf(r.failed, sizeof r.failed, "%s", call);
    return r;
  };
  ibv_context* ctx = v.open_device(device);
  if (ctx == nullptr) return failed("ibv_open_device", errno);
  ibv_device_attr attr{};
  if (int rc = v.query_device(ctx, &attr); rc != 0) {
    v.close_device(ctx);
    return failed("ibv_query_device", rc);
  }
  std::snprintf(r.fw_ver, sizeof r.fw_ver, "%s", attr.fw_ver);
  r.node_guid = be64toh(attr.node_guid);
  r.sys_image_guid = be64toh(attr.sys_image_guid);
  for (uint8_t p = 1; p <= attr.phys_port_cnt && r.ports < kMaxPorts; ++p) {
    ibv_port_attr pa{};
    if (int rc = QueryPort(v, ctx, p, &pa); rc != 0) {
      v.close_device(ctx);
      return failed("ibv_query_port", rc > 0 ? rc : errno);
    }
    PortRecord& out = r.port[r.ports++];
    out.number = p;
    out.state = static_cast<uint8_t>(pa.state);
    out.phys_state = pa.phys_state;
    out.link_layer = pa.link_layer;
    out.width = pa.active_width;
    out.speed = pa.active_speed;
    out.lid = pa.lid;
    out.sm_lid = pa.sm_lid;
    int fixed = 0;
    if (int rc = v.query_port_address(ctx, p, &out.address, &fixed); rc != 0) {
      v.close_device(ctx);
      return failed("rdmaemu_query_port_address", rc);
    }
    out.fixed = fixed != 0;
    ibv_gid_entry entry{};
    if (v.query_gid_ex(ctx, p, 0, &entry, 0, sizeof entry) == 0) {
      out.gid_ok = 1;
      out.gid_type = entry.gid_type;
      std::memcpy(out.gid, entry.gid.raw, sizeof out.gid);
    }
  }
  v.close_device(ctx);
  return r;
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads `size` bytes unless the deadline passes or the writer goes away.
bool ReadAll(int fd, void* data, size_t size, std::chrono::steady_clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Sets (or, with nullopt, removes) variables until destroyed, then puts
// back what was there.
class ScopedEnvironment {
 public:
  void Set(const char* name, std::optional<const char*> value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    if (value) ::setenv(name, *value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnvironment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first, it->second->c_str(), 1);
      else ::unsetenv(it->first);
    }
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

GidType ToGidType(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return GidType::kIb;
    case IBV_GID_TYPE_ROCE_V1: return GidType::kRoceV1;
    default: return GidType::kRoceV2;
  }
}

DeviceInfo ToInfo(std::string name, uint64_t node_guid, const DeviceRecord& r) {
  DeviceInfo d;
  d.name = std::move(name);
  d.node_guid = node_guid;
  if (r.error != 0) return d;  // not opened: the name and GUID only
  d.fw_ver.assign(r.fw_ver, strnlen(r.fw_ver, sizeof r.fw_ver));
  // The child's GUIDs hold the child's pid, not the program's. The library
  // reports the node GUID as the system image GUID too; only then is the
  // program's known (it is its node GUID).
  if (r.sys_image_guid == r.node_guid) d.sys_image_guid = node_guid;
  for (uint32_t i = 0; i < r.ports && i < kMaxPorts; ++i) {
    const PortRecord& pr = r.port[i];
    PortInfo p;
    p.number = pr.number;
    p.state = pr.state;
    p.phys_state = pr.phys_state;
    p.ethernet = pr.link_layer == IBV_LINK_LAYER_ETHERNET;
    p.width = pr.width;
    p.speed = pr.speed;
    p.lid = pr.lid;
    p.sm_lid = pr.sm_lid;
    p.address = pr.address;
    p.address_fixed = pr.fixed != 0;
    if (pr.gid_ok != 0) {
      std::array<uint8_t, 16> gid{};
      std::memcpy(gid.data(), pr.gid, gid.size());
      p.gid0 = gid;
      p.gid_type = ToGidType(pr.gid_type);
    }
    d.ports.push_back(p);
  }
  return d;
}

}  // namespace

DeviceProbe ProbeDevices(const std::string& library_path) {
  DeviceProbe out;
  ScopedEnvironment env;
  // The program's own library reports configuration errors when it runs;
  // the probe's copy stays quiet, and does nothing the program would see.
  env.Set("RDMAEMU_LOG", "off");
  env.Set("RDMAEMU_CHECK", std::nullopt);
  env.Set("RDMAEMU_PCAP", std::nullopt);
  env.Set("RDMAEMU_FAULTS", std::nullopt);
  // A directory that cannot be made: the child serves no control socket.
  env.Set("RDMAEMU_CONTROL_DIR", "/dev/null/rdmaemu-probe");

  void* handle = ::dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    out.error = fmt::format("cannot load {}: {}", library_path, ::dlerror());
    return out;
  }
  // Never closed: the library is not made to be unloaded, and exec drops it.
  LoadedVerbs v;
  if (std::string missing = LoadVerbs(handle, v); !missing.empty()) {
    out.error = fmt::format("{} does not export {}", library_path, missing);
    return out;
  }
  int count = 0;
  errno = 0;
  ibv_device** list = v.get_device_list(&count);
  if (list == nullptr) {
    out.error = fmt::format("the library lists no devices ({}; the program's library says why)",
                            errno != 0 ? std::strerror(errno) : "unknown error");
    return out;
  }

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.error = fmt::format("pipe: {}", std::strerror(errno));
    return out;
  }
  std::fflush(nullptr);  // nothing buffered is written twice
  pid_t child = ::fork();
  if (child < 0) {
    out.error = fmt::format("fork: {}", std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return out;
  }
  if (child == 0) {
    ::close(fds[0]);
    for (int i = 0; i < count; ++i) {
      DeviceRecord r = QueryDevice(v, list[i]);
      if (!WriteAll(fds[1], &r, sizeof r)) std::_Exit(1);
    }
    // exit, not _exit: the library's exit handlers release what the opens
    // took (the emulated subnet's records, say).
    std::exit(0);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + kProbeTimeout;
  std::vector<DeviceRecord> records(static_cast<size_t>(count));
  bool complete = true;
  for (auto& r : records) {
    if (!ReadAll(fds[0], &r, sizeof r, deadline)) {
      complete = false;
      break;
    }
  }
  ::close(fds[0]);
  // The child exits once it has written; a child stuck in its exit handlers
  // must not hold up the program either.
  bool exited = false;
  while (complete && !exited && std::chrono::steady_clock::now() < deadline) {
    pid_t rc = ::waitpid(child, nullptr, WNOHANG);
    exited = rc == child || (rc < 0 && errno != EINTR);
    if (!exited) ::usleep(1000);
  }
  if (!exited) {
    ::kill(child, SIGKILL);
    while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  if (!complete) {
    out.error = std::chrono::steady_clock::now() >= deadline
                    ? fmt::format("opening the devices took more than {} s", kProbeTimeout.count())
                    : "the process that opened the devices died";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    std::string name = v.get_device_name(list[i]);
    const DeviceRecord& r = records[static_cast<size_t>(i)];
    out.devices.push_back(ToInfo(name, be64toh(v.get_device_guid(list[i])), r));
    if (r.error != 0) {
      out.warnings.push_back(fmt::format("{}: {} failed ({}), so it has no ports/ there", name,
                                         std::string_view(r.failed, strnlen(r.failed, sizeof r.failed)),
                                         std::strerror(r.error)));
    }
  }
  v.free_device_list(list);
  return out;
}

}  // namespace rdmaemu::cli
