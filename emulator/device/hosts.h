// Several processes at one address, as on a real host.
//
// Each process is its own emulated host, and normally its own address: the
// first free one of 127.0.0.0/8, or the one it was given. A program that
// forks its server and client and gives both the same address (rdma-core's
// own RDMA CM tests do) makes two processes share one. The first binds the
// RoCE port (4791) and is host slot 0; each later one binds an ephemeral
// UDP port and takes a slot 1..15 at that address, recorded in the subnet
// directory (subnet.h) beside the LID table:
//   slot-a.b.c.d-K            "PORT pid"   slot K at a.b.c.d receives on PORT
//   listen-a.b.c.d-PS-PORT    "K pid"      slot K listens there (RDMA CM)
// Records of processes that are gone are ignored and replaced, under the
// directory's lock (subnet::DirectoryLock), so two processes that start
// together never both take a dead one's slot.
//
// The slot travels in the identifiers a peer sends to, so the peer knows
// which process of the address a packet is for, with no lookup on the
// wire: bits 20-23 of every QP number (a process has 2^20 QPNs), and bits
// 28-31 of every CM communication ID and SIDR request ID. Only a REQ or a
// SIDR_REQ, which names a service rather than an ID, needs the listener
// records; a service nobody recorded is slot 0's.
//
// Slot 0's listeners are not recorded, so a slot 0 and a slot K listening
// on one port are not refused (slot K gets the requests).
//
// A slot that no live process holds is slot 0: a peer that is not an
// emulated process (the kernel's CM draws communication IDs at random, a
// NIC numbers its QPs as it likes) has bits there that name no slot, and
// it receives on 4791. Such a peer reaches only slot 0 of an address, as
// it sends everything to 4791.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <optional>

#include "emulator/base/status.h"

namespace rdmaemu::device::hosts {

inline constexpr uint8_t kSlots = 16;
inline constexpr int kQpnSlotShift = 20;
inline constexpr uint32_t kQpnIndexMask = (1u << kQpnSlotShift) - 1;
inline constexpr int kCommIdSlotShift = 28;
inline constexpr uint32_t kCommIdIndexMask = (1u << kCommIdSlotShift) - 1;

inline uint8_t SlotOfQpn(uint32_t qpn) { return (qpn >> kQpnSlotShift) & (kSlots - 1); }
inline uint8_t SlotOfCommId(uint32_t id) { return static_cast<uint8_t>(id >> kCommIdSlotShift); }

// Takes a free slot 1..15 at `address` for this process, which receives on
// `udp_port`. EADDRINUSE when all are held; EIO when the record cannot be
// written.
Result<uint8_t> Claim(in_addr address, uint16_t udp_port);
// Gives the slot back (the device closes).
void Release(in_addr address, uint8_t slot);
// The UDP port slot `slot` (1..15) at `address` receives on; nullopt when no
// live process holds it.
std::optional<uint16_t> PortOf(in_addr address, uint8_t slot);

// Records that slot `slot` listens on (address, port space, port).
// EADDRINUSE when another live process recorded it.
Status Listen(in_addr address, uint16_t ps, uint16_t port, uint8_t slot);
void StopListening(in_addr address, uint16_t ps, uint16_t port);
// The slot that listens there: the recorded one, else 0.
uint8_t ListenerSlot(in_addr address, uint16_t ps, uint16_t port);

}  // namespace rdmaemu::device::hosts
