// `rdmaemu run` shows the program the emulated devices under
// /sys/class/infiniband, as the kernel shows real ones, because unmodified
// programs read it: rdma-core's pyverbs suite finds a device's netdev with
// `ls /sys/class/infiniband/DEV/device/net/` and its IP with `ip addr`.
// What the files hold, and what is left out, is in sysfs_tree.h.
//
// How: this process enters a mount namespace of its own, which the program
// then inherits through exec, and mounts a tmpfs there:
// - root: unshare(CLONE_NEWNS);
// - anyone else: unshare(CLONE_NEWUSER | CLONE_NEWNS), with its own uid and
//   gid mapped to themselves (setgroups denied, as the kernel requires for
//   an unprivileged gid map). The program keeps its uid and gid; what it
//   loses is setgroups(2) and what set-user-ID programs give (root is not
//   mapped: sudo runs without it), and files of other users show as owned
//   by nobody (65534), their access unchanged.
// Then / is made recursively private, so nothing mounted here reaches the
// rest of the system (nor do mounts made elsewhere later reach the
// program). With a /sys/class/infiniband (a machine with RDMA devices) the
// tmpfs goes on it and hides the real devices. Without one (the usual
// case) it goes on /sys/class, every entry of the real /sys/class is
// bind-mounted back into it under its name (/sys/class/net and the rest
// read as before; a class the kernel registers later does not appear), and
// infiniband/ is added. The tmpfs is then made read-only.
//
// Everything is first tried in a forked child: only if the child gets all
// of it done does this process do it too, so a kernel that allows the
// namespace but then refuses the uid map or the mount (as a security
// module's policy may) never leaves the program half-way in one.
// When it cannot be done the program runs as it would have without it, and
// one warning line says why.
#pragma once

#include <string>
#include <vector>

namespace rdmaemu::cli {

// Builds the view for the devices the library at `library_path` gives a
// program (device_probe.h) and enters it. Returns the warnings to print,
// one line each, without a prefix; empty when all went well. `program`
// names the program in them.
std::vector<std::string> EnterSysfsView(const std::string& library_path, const std::string& program);

}  // namespace rdmaemu::cli
