// RingServer: the master's CXL RPC transport. One thread polls the request
// rings of attached clients and has the Service answer them (Service::ServeRing).
//
// Waiting is spin-then-sleep (docs/architecture.md §5): after the last request it keeps
// polling for a window of `spin_ns` that widens up to `max_spin_ns`
// (--ring_max_spin_us) while requests keep coming at a pace the window misses
// (spin_window.h: a sleep costs the next client a wake-up of our core), then
// sets Superblock::ring_server_sleeping and sleeps on the doorbell futex,
// which a client rings (and wakes) after a request only when that word says
// the server is not polling (asleep, or in one of its short
// eviction slices, which a ring of the bell ends early). Idle, it costs
// nothing but a wake-up every `idle_wake_ms` to notice Stop(). A futex wake
// does not cross hosts, so on a pool formatted non-coherent (CXL 2.0
// multi-host) it polls every 100 µs instead: a few percent of one core.
//
// Thread safety: Start/Stop from one thread; the loop runs on its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "mooncake_cxl/control/service.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/control/spin_window.h"

namespace mcxl {

class RingServer {
 public:
  static constexpr uint64_t kDefaultMaxSpinNs = 500000;
  RingServer(Service* service, uint64_t spin_ns = 50000, uint64_t max_spin_ns = kDefaultMaxSpinNs,
             uint64_t idle_wake_ms = 500)
      : service_(service), window_(spin_ns, max_spin_ns), idle_wake_ms_(idle_wake_ms) {}
  ~RingServer() { Stop(); }
  void Start();
  void Stop();

 private:
  void Loop();
  // Superblock::ring_server_sleeping := state (0 or kRingServer*), ordered
  // before the ring re-scan that follows.
  static void SetState(Superblock* sb, uint32_t state);
  // Serves every attached client with a request waiting; true if any.
  bool ServeAll();

  Service* service_;
  SpinWindow window_;  // Loop's polling time before a sleep (spin_window.h)
  uint64_t idle_wake_ms_;
  SpinWait spin_;  // Loop's polling policy (shm_ring.h)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace mcxl
