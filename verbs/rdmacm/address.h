// Devices and addresses: the library's table of devices (contexts opened
// lazily, one per device, shared by every id), which emulated port owns
// which IPv4 address, binding ids, and address and route resolution.
//
// The table is filled once (Init) from ibv_get_device_list and never
// shrinks, so a Device pointer stays valid for the process's life. A
// device's `context` is published with release order once it is open, so
// the device's threads can find it (DeviceByIndex) without a lock.
//
// Thread safety: OpenDevice and the lookups take the table's mutex, except
// DeviceByIndex, which only reads atomics.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "verbs/rdmacm/id.h"

namespace rdmaemu::rdmacm {

struct Port {
  uint8_t num = 0;
  bool has_address = false;  // GID 0 is IPv4-mapped
  in_addr address{};
  ibv_mtu active_mtu = IBV_MTU_1024;
  uint8_t rate = 0;  // enum ibv_rate of the port's width and speed
};

struct Device {
  ibv_device* device = nullptr;
  int index = -1;  // ibv_get_device_index
  std::atomic<ibv_context*> context{nullptr};
  // Constant once `context` is published:
  ibv_pd* pd = nullptr;  // the library's PD for ids on this device
  std::vector<Port> ports;
  uint8_t max_initiator_depth = 0;      // max_qp_init_rd_atom
  uint8_t max_responder_resources = 0;  // max_qp_rd_atom
  ibv_xrcd* xrcd = nullptr;  // DeviceXrcd's; guarded by the device list's lock
};

// Called once by Init with the device list (kept for the process's life).
void SetDevices(ibv_device** list, int count);
size_t DeviceCount();

// Opens the device if it is not open yet. Returns 0 or an errno value.
int OpenDevice(Device* device);
// The XRC domain of XRC ids on an open device (their targets' QPs and
// SRQs), opened at first use and kept for the process's life, as
// rdma-core's ucma_get_xrcd does. NULL with errno set if it cannot be.
ibv_xrcd* DeviceXrcd(Device* device);
// Opens every device; returns how many are open.
size_t OpenAllDevices();
// The open devices, in the device list's order.
std::vector<Device*> OpenDevices();

Device* DeviceOf(const ibv_context* context);
// The open device with this ibv_get_device_index, or NULL; lock-free.
Device* DeviceByIndex(int index);
const Port* FindPort(const Device* device, uint8_t port_num);

// Fills the id's route.addr for a bind to (device, port): verbs, port_num,
// pd, src address, sgid, pkey.
void AttachToDevice(Id* id, Device* device, const Port& port);

// rdma_bind_addr's work for an IPv4 address (port included). Returns 0 or
// -1 with errno, having logged why.
int BindIpv4(Id* id, const sockaddr_in& addr);

// The first open device port whose address is in 127/8, opening devices in
// order until one is found; false if none.
bool FirstLoopbackPort(Device** device, const Port** port);
// The open (or openable) device port that has `addr`; false if none.
bool PortWithAddress(in_addr addr, Device** device, const Port** port);
// "emu0 127.0.0.2, emu1 10.0.0.5" for log lines.
std::string DeviceAddresses();

// Points the id's route at one path record built from its addresses, the
// port's rate and `mtu` (the child of a CONNECT_REQUEST: the REQ's MTU).
void FillChildPath(Id* id, uint8_t mtu);

// An IPv4 sockaddr out of an application's sockaddr: AF_INET, or AF_INET6
// any-address / IPv4-mapped. False (errno EAFNOSUPPORT) otherwise.
bool ToIpv4(const sockaddr* addr, sockaddr_in* out);

}  // namespace rdmaemu::rdmacm
