// `rdmaemu devices`: lists the emulated devices as applications see them.
// The tool loads the built libibverbs.so.1 with dlopen and asks it through
// the public verbs API, so the configuration is read exactly the way the
// library reads it for any program (RDMAEMU_CONFIG, RDMAEMU_ADDRESS, ...).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rdmaemu/rdmaemu.h"
#include "tools/rdmaemu/loaded_verbs.h"
#include "tools/rdmaemu/commands.h"
#include "tools/rdmaemu/locate.h"
#include "tools/rdmaemu/options.h"

namespace rdmaemu::cli {
namespace {



std::string StateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
  }
  return fmt::format("state {}", static_cast<int>(s));
}

std::string LinkLayerName(uint8_t ll) {
  switch (ll) {
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    case IBV_LINK_LAYER_INFINIBAND:
    case IBV_LINK_LAYER_UNSPECIFIED: return "InfiniBand";
  }
  return fmt::format("link layer {}", ll);
}

std::string WidthSpeed(uint8_t width, uint8_t speed) {
  std::string w;
  switch (width) {
    case 1: w = "1x"; break;
    case 2: w = "4x"; break;
    case 4: w = "8x"; break;
    case 8: w = "12x"; break;
    case 16: w = "2x"; break;
    default: w = fmt::format("width {}", width);
  }
  std::string s;
  switch (speed) {
    case 1: s = "SDR"; break;
    case 2: s = "DDR"; break;
    case 4: s = "QDR"; break;
    case 8: s = "FDR10"; break;
    case 16: s = "FDR"; break;
    case 32: s = "EDR"; break;
    case 64: s = "HDR"; break;
    case 128: s = "NDR"; break;
    default: s = fmt::format("speed {}", speed);
  }
  return w + " " + s;
}

// GID[0] of a RoCE port holds its IP address, IPv4-mapped for IPv4.
std::string GidAddress(const ibv_gid& gid) {
  static constexpr uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(gid.raw, kV4Mapped, sizeof(kV4Mapped)) == 0) {
    ::inet_ntop(AF_INET, gid.raw + 12, buf, sizeof(buf));
  } else {
    ::inet_ntop(AF_INET6, gid.raw, buf, sizeof(buf));
  }
  return buf;
}

std::string GidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
  }
  return fmt::format("type {}", type);
}

struct Row {
  std::string device, guid, port, state, link, mtu, rate, lid, address, gid_type, mac;
};

// The MAC raw packet QPs see for a RoCE port: 02:00 and its IPv4 address
// (network order), as the device derives it (docs/raw-packet.md).
std::string PortMac(in_addr address) {
  const uint32_t ip = ntohl(address.s_addr);
  return fmt::format("02:00:{:02x}:{:02x}:{:02x}:{:02x}", ip >> 24, (ip >> 16) & 0xff,
                     (ip >> 8) & 0xff, ip & 0xff);
}

void PrintTable(const std::vector<Row>& rows) {
  std::vector<Row> all;
  all.push_back({"DEVICE", "NODE GUID", "PORT", "STATE", "LINK LAYER", "MTU", "RATE", "LID",
                 "GID[0] ADDRESS", "GID TYPE", "MAC"});
  all.insert(all.end(), rows.begin(), rows.end());
  auto cols = [](const Row& r) {
    return std::vector<const std::string*>{&r.device, &r.guid, &r.port, &r.state, &r.link,
                                           &r.mtu, &r.rate, &r.lid, &r.address, &r.gid_type,
                                           &r.mac};
  };
  std::vector<size_t> width(11, 0);
  for (const auto& r : all) {
    auto c = cols(r);
    for (size_t i = 0; i < c.size(); ++i) width[i] = std::max(width[i], c[i]->size());
  }
  for (const auto& r : all) {
    auto c = cols(r);
    std::string line;
    for (size_t i = 0; i < c.size(); ++i) {
      line += (i + 1 == c.size()) ? *c[i] : fmt::format("{:<{}}  ", *c[i], width[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace

std::string DevicesHelp() {
  return "Usage: rdmaemu devices [OPTIONS]\n"
         "\n"
         "Lists the emulated RDMA devices with their node GUID and ports (state, link\n"
         "layer, active MTU, rate, LID, the address in GID[0] and its type), as any\n"
         "program sees them: the tool loads the built libibverbs.so.1 and asks it\n"
         "through the verbs API, so the configuration is read as the library reads it.\n"
         "A port with no configured address takes the first free address of\n"
         "127.0.0.0/8 when a process opens its device: the listing marks it (auto) and\n"
         "shows the one it got with every device open at once, as one program opening\n"
         "them all would; another process gets other ones. Set address= in the\n"
         "configuration or --address to fix it.\n"
         "\n"
         "Options (each sets the variable in brackets, as for `rdmaemu run`):\n" +
         FormatOptions(kEnvironmentOptions) +
         "\n"
         "Exit status: 0 listed, 1 the library failed to load or to list the devices\n"
         "(a configuration error, say), 2 usage error.\n";
}

int DevicesMain(std::span<const std::string> args, const char* argv0) {
  ParsedArgs parsed = ParseArgs(args, kEnvironmentOptions);
  if (!parsed.error.empty()) return UsageError("devices", parsed.error);
  if (parsed.help) {
    std::fputs(DevicesHelp().c_str(), stdout);
    return kExitOk;
  }
  if (std::string e = CheckEnvironmentOptions(parsed); !e.empty()) return UsageError("devices", e);
  if (!parsed.operands.empty()) {
    return UsageError("devices", fmt::format("unexpected argument '{}'", parsed.operands[0]));
  }

  LibraryLocation lib = FindLibrary(CurrentSearch(parsed.Get("lib"), argv0));
  if (!lib.error.empty()) {
    PrintError("devices", lib.error);
    return kExitFailure;
  }
  // The library reads its environment when first used: set it before loading.
  ExportEnvironment(parsed);
  void* handle = ::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    PrintError("devices", fmt::format("cannot load {}: {}", lib.path, ::dlerror()));
    return kExitFailure;
  }
  LoadedVerbs v;
  if (std::string missing = LoadVerbs(handle, v); !missing.empty()) {
    PrintError("devices", fmt::format("{}: the library does not export {}", lib.path, missing));
    return kExitFailure;
  }

  int count = 0;
  errno = 0;
  ibv_device** list = v.get_device_list(&count);
  if (list == nullptr) {
    int err = errno;
    PrintError("devices", fmt::format("cannot list the devices: {} (the library says why above; "
                                      "RDMAEMU_LOG=off hides it)",
                                      err != 0 ? std::strerror(err) : "unknown error"));
    return kExitFailure;
  }

  int status = kExitOk;
  std::vector<Row> rows;
  // Every device stays open until all are listed: devices with automatic
  // addresses then get distinct ones, as in a program that opens them all,
  // instead of each taking the one its predecessor just released.
  std::vector<ibv_context*> open;
  bool any_auto = false;
  for (int i = 0; i < count; ++i) {
    std::string name = v.get_device_name(list[i]);
    std::string guid = fmt::format("{:016x}", be64toh(v.get_device_guid(list[i])));
    ibv_context* ctx = v.open_device(list[i]);
    if (ctx == nullptr) {
      PrintError("devices", fmt::format("{}: cannot open: {}", name, std::strerror(errno)));
      status = kExitFailure;
      continue;
    }
    ibv_device_attr dev{};
    if (int rc = v.query_device(ctx, &dev); rc != 0) {
      PrintError("devices", fmt::format("{}: ibv_query_device: {}", name, std::strerror(rc)));
      status = kExitFailure;
      v.close_device(ctx);
      continue;
    }
    open.push_back(ctx);
    for (uint8_t p = 1; p <= dev.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (int rc = QueryPort(v, ctx, p, &pa); rc != 0) {
        PrintError("devices", fmt::format("{} port {}: ibv_query_port: {}", name, p,
                                          std::strerror(rc > 0 ? rc : errno)));
        status = kExitFailure;
        continue;
      }
      Row r{name, guid, std::to_string(p), StateName(pa.state), LinkLayerName(pa.link_layer),
            std::to_string(128 << pa.active_mtu), WidthSpeed(pa.active_width, pa.active_speed),
            std::to_string(pa.lid), "-", "-", "-"};
      ibv_gid_entry entry{};
      if (v.query_gid_ex(ctx, p, 0, &entry, 0, sizeof(entry)) == 0) {
        r.address = GidAddress(entry.gid);
        r.gid_type = GidTypeName(entry.gid_type);
      }
      int fixed = 1;
      in_addr address{};
      if (int rc = v.query_port_address(ctx, p, &address, &fixed); rc != 0) {
        PrintError("devices", fmt::format("{} port {}: rdmaemu_query_port_address: {}", name, p,
                                          std::strerror(rc)));
        status = kExitFailure;
      } else {
        if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) r.mac = PortMac(address);
        if (fixed == 0) {
          r.address += " (auto)";
          any_auto = true;
        }
      }
      rows.push_back(std::move(r));
    }
  }
  for (ibv_context* ctx : open) v.close_device(ctx);
  v.free_device_list(list);
  if (count == 0) {
    std::printf("no devices\n");
  } else {
    PrintTable(rows);
    if (any_auto) {
      std::printf("\n(auto): the first free address of 127.0.0.0/8, picked when a process opens the\n"
                  "device; each process gets its own. address= in the configuration or --address\n"
                  "fixes it.\n");
    }
  }
  // The handle stays open: the library may own threads until exit.
  return status;
}

}  // namespace rdmaemu::cli
