#include "mooncake_cxl/control/ring_server.h"

#include <immintrin.h>
#include <algorithm>
#include <sched.h>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/layout.h"
#include "mooncake_cxl/pool/pool.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {
namespace {
constexpr uint64_t kEvictSliceNs = 3000;
}  // namespace

void RingServer::SetState(Superblock* sb, uint32_t state) {
  // seq_cst store + fence: the state before the ring re-scan that follows;
  // pairs with RingDoorbell's fence (Dekker). (Back to 0 would need no
  // order: a client that still sees the old state only rings once more.)
  sb->ring_server_sleeping.store(state, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  PublishRange(&sb->ring_server_sleeping, sizeof(uint32_t));
}

void RingServer::Start() {
  stop_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this] { Loop(); });
}

void RingServer::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_relaxed);  // polled by Loop
  FutexWakeAll(&service_->pool().superblock()->ring_doorbell);
  thread_.join();
}

bool RingServer::ServeAll() {
  const Pool& pool = service_->pool();
  if (pool.failed()) return false;  // the device shrank: its rings are not to be touched
  uint32_t ring_bytes = pool.geometry().ring_bytes;
  bool any = false;
  // Bounded by this pool's own count too: a replaced device (the master's
  // CheckReplacedDevice) may swap the pool between the two loads.
  uint32_t slots = std::min(service_->client_slot_count(), pool.geometry().client_slot_count);
  // The attached slots only, a bitmap word at a time: a scan is one poll
  // period (how late a request is seen), and most of the slots are free.
  for (uint32_t word = 0; word * 64 < slots; ++word) {
    for (uint64_t bits = service_->AttachedWord(word); bits != 0; bits &= bits - 1) {
      uint32_t slot = word * 64 + uint32_t(__builtin_ctzll(bits));
      if (slot >= slots) break;
      ShmRing requests(pool.ring(slot, 0), ring_bytes);
      if (!requests.HasData()) continue;
      service_->ServeRing(slot);
      any = true;
    }
  }
  return any;
}

void RingServer::Loop() {
  // served: when the last request was served; polled: the latest poll that
  // found none (so polled - served is the gap a request found now ended).
  uint64_t served = MonoNs(), last_work = served, polled = served;
  auto note_served = [&] {
    window_.Arrived(polled - served);
    served = last_work = polled = MonoNs();
  };
  // Relaxed: a stop flag polled every iteration.
  while (!stop_.load(std::memory_order_relaxed)) {
    // Each round: the pool may have been replaced (the old one stays mapped
    // for a grace period far longer than one sleep).
    Superblock* sb = service_->pool().superblock();
    // Every request rings the doorbell after its push (RingDoorbell): read
    // before the scan, a changed count means a request arrived since.
    // Relaxed: a hint; a missed change costs at most one eviction slice.
    uint32_t bell = sb->ring_doorbell.load(std::memory_order_relaxed);
    if (ServeAll()) {
      spin_.Found();
      note_served();
      continue;
    }
    polled = MonoNs();
    uint64_t idle = polled - last_work;
    if (service_->IdleWorkWanted()) {
      // No request waiting: evict ahead of the watermark in a short slice.
      // A request arriving meanwhile ends the slice early: with the state
      // set, clients ring the bell (RingDoorbell), and the re-scan after the
      // fence catches one that pushed before it saw the state.
      SetState(sb, kRingServerEvicting);
      if (ServeAll())
        note_served();
      else
        service_->IdleWork(kEvictSliceNs, [sb, bell] {
          ObserveRange(&sb->ring_doorbell, sizeof(uint32_t));
          return sb->ring_doorbell.load(std::memory_order_relaxed) != bell;
        });
      SetState(sb, 0);
      last_work = polled = MonoNs();
      continue;
    }
    // Past ~20 µs each poll is a sched_yield (SpinWait): a task that wants
    // our core gets it at once, and one that keeps it past the window sends
    // us to sleep (idle > window on our return).
    if (idle < window_.ns()) {
      spin_.Relax(idle);  // pause, or yield to a client that shares our core
      continue;
    }
    service_->Tick();  // going idle: account for puts completed meanwhile
    uint32_t seen = sb->ring_doorbell.load(std::memory_order_relaxed);
    SetState(sb, kRingServerAsleep);
    // Clients on other hosts cannot wake our futex: on a non-coherent
    // (multi-host) pool, poll every 100 µs instead of sleeping long.
    uint64_t sleep_ns = GetCoherenceMode() == CoherenceMode::kNonCoherent ? 100000 : idle_wake_ms_ * 1000000ull;
    if (ServeAll())
      note_served();
    else
      FutexWait(&sb->ring_doorbell, seen, sleep_ns);
    SetState(sb, 0);
    spin_.Slept();
    last_work = polled = MonoNs();
  }
}

}  // namespace mcxl
