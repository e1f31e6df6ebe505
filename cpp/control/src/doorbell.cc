#include "mooncake_cxl/control/doorbell.h"

#include <atomic>

#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {

bool RingDoorbell(Superblock* sb) {
  // A non-coherent pool: the server polls every ring in 100 us slices and
  // never sleeps on the futex (host-local), and a fetch_add from clients on
  // several hosts would not be atomic: no doorbell at all.
  if (GetCoherenceMode() == CoherenceMode::kNonCoherent) return false;
  // seq_cst fence: the request's head store (before) and the state load
  // (after) pair with the server's state store, fence and ring re-scan:
  // either it sees our request or we see it not polling and ring.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ObserveRange(&sb->ring_server_sleeping, sizeof(uint32_t));
  // Relaxed: ordered by the fence above.
  uint32_t state = sb->ring_server_sleeping.load(std::memory_order_relaxed);
  if (state == 0) return false;  // polling: it sees our head without a write to this line
  // Relaxed: the futex compares the value; the fence above orders our push.
  sb->ring_doorbell.fetch_add(1, std::memory_order_relaxed);
  PublishRange(&sb->ring_doorbell, sizeof(uint32_t));
  if (state != kRingServerAsleep) return false;
  FutexWakeAll(&sb->ring_doorbell);
  return true;
}

}  // namespace mcxl
