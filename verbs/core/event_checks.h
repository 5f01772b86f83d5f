// The checker's event checks (docs/check.md), on libibverbs' own event
// machinery: ack-mismatch (more acknowledgements than events returned, or
// events returned and never acknowledged, reported when a destroy waits for
// them or at exit) and unarmed-wait (ibv_get_cq_event blocking on a channel
// none of whose CQs is armed). Each is called only when check::On().
#pragma once

#include <infiniband/verbs.h>

#include "provider/handles.h"

namespace rdmaemu::verbs {

// After an acknowledgement brought `object`'s count to `completed`, of
// `reported` events returned (`kind` "completion" or "async").
void CheckAckCount(const char* verb, const void* object, provider::Kind object_kind,
                   const char* kind, unsigned completed, unsigned reported);

// A destroy of `object` has waited a second for `missing` acknowledgements.
void ReportDestroyWaiting(const char* what, const void* object, unsigned missing);

// Before a blocking ibv_get_cq_event on `channel`: waits up to a second for
// an event; if none came and no CQ on the channel is armed, reports it. The
// caller then reads the event as usual.
void WatchCqEventWait(ibv_comp_channel* channel);

// Registers the exit scan for events never acknowledged (once).
void WatchUnacknowledgedAtExit();

}  // namespace rdmaemu::verbs
