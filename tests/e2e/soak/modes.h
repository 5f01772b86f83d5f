// The soak program's two runs; each returns the process's exit code.
#pragma once

#include "tests/e2e/soak/channel.h"
#include "tests/e2e/soak/common.h"

namespace soak {

// rc.cc: every kind of RC message, all checked (see there).
int RunRcClient(const Options& o, Channel& ctl);
int RunRcServer(const Options& o, Channel& ctl);
// ud.cc: UD SENDs; some may be lost, none may arrive altered.
int RunUdClient(const Options& o, Channel& ctl);
int RunUdServer(const Options& o, Channel& ctl);

}  // namespace soak
