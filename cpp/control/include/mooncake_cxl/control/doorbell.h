// The doorbell of the CXL RPC rings (Superblock::ring_doorbell and
// ring_server_sleeping): a client rings it after pushing a request, and it
// writes the shared line only when the ring server is not polling, so a
// polling server costs the client no extra line transfer.
//
// Ordering (Dekker, within one host): the client's head store, seq_cst
// fence, state load pair with the server's state store, seq_cst fence, ring
// re-scan (RingServer::SetState): either the server sees the request or the
// client sees it not polling and rings. A futex wake does not cross hosts;
// on a non-coherent pool the server polls instead of sleeping.
#pragma once

#include "mooncake_cxl/pool/layout.h"

namespace mcxl {

// True when it woke a sleeping server: the answer then comes only after the
// server's core wakes (tens of µs on an idle core), so the caller spins
// longer for it (a second sleep would add a second wake-up).
bool RingDoorbell(Superblock* sb);

}  // namespace mcxl
