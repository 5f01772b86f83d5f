// The emulated devices a program run by `rdmaemu run` will see, asked of the
// built library itself (so RDMAEMU_CONFIG, RDMAEMU_ADDRESS, ... are read
// exactly as the program's library will read them), for the sysfs view.
#pragma once

#include <string>
#include <vector>

#include "tools/rdmaemu/sysfs_tree.h"

namespace rdmaemu::cli {

struct DeviceProbe {
  std::vector<DeviceInfo> devices;
  std::string error;  // non-empty: nothing could be learnt, and why
  // One line per device that could not be opened (its DeviceInfo then has
  // no fw_ver and no ports).
  std::vector<std::string> warnings;
};

// Loads `library_path` (libibverbs.so.1) with dlopen into this process and
// lists the devices: their names and node GUIDs are this process's own, and
// so the program's, since `run` execs it with this pid (the library puts
// the pid in the GUID). Opening a device starts threads and binds sockets,
// so the ports are queried in a forked child that then exits: this process
// stays single-threaded, which unshare(2) of a mount or user namespace
// requires. The child's library logs nothing, creates no control socket
// (`rdmaemu list` does not see it), writes no pcap and applies no faults.
DeviceProbe ProbeDevices(const std::string& library_path);

}  // namespace rdmaemu::cli
