// The emulator's own counters for the device (rdmaemu.h), printed at the
// end of a run so a soak's summary says what the network did to it.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace soak {

// "packets_sent=N bytes_sent=N ... fault_dropped=N ..." for every counter
// of the device (port 0: all ports), in the header's order, the fault rules'
// counts (fault_*) last; dies if the query fails.
std::string DeviceCounters(ibv_context* ctx);

// The device's active fault rules with how many packets each matched
// (rdmaemu_fault_list), on one line, rules separated by " | "; "none" when
// there are none. Dies if the query fails.
std::string FaultRules(ibv_context* ctx);

}  // namespace soak
