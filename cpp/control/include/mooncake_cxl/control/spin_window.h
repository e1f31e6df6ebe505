// SpinWindow: how long the ring server keeps polling after its last request
// before it sleeps on the doorbell (ring_server.h).
//
// Contract: ns() starts at `base` and stays within [base, max]. Arrived(gap)
// is told, for each request found, how long the server had been without
// work (0 for back-to-back requests). A gap longer than the window but within
// `max` (the window missed it: the server slept and a client paid its
// wake-up, 30-100 µs on an idle core) widens the window to 1.5x that gap; a
// gap beyond `max` (the clients paused) halves it. So clients whose requests
// come at a steady pace up to `max` apart are answered by a polling server,
// and a server left idle polls at most `max` once per pause, then sleeps:
// idle CPU stays ~0 (what it spends is one window per pause in the traffic).
// The server yields its core at every poll of a long window (SpinWait), so a
// task that wants the core gets it, and one that keeps it longer than the
// window sends the server to sleep. (Sleeping as soon as a yield let another
// task run for 20 µs would not do: a VM's timer ticks do that every ~4 ms,
// and 2.3% of puts at a 100 µs pace would pay a wake-up instead of 0.5%.)
// Not thread-safe: the ring server's loop owns it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mcxl {

class SpinWindow {
 public:
  SpinWindow(uint64_t base_ns, uint64_t max_ns) : base_(base_ns), max_(std::max(base_ns, max_ns)), ns_(base_ns) {}
  uint64_t ns() const { return ns_; }
  void Arrived(uint64_t gap_ns) {
    if (gap_ns <= ns_) return;  // caught while polling
    ns_ = gap_ns <= max_ ? std::min(max_, gap_ns + gap_ns / 2) : std::max(base_, ns_ / 2);
  }

 private:
  uint64_t base_, max_, ns_;
};

}  // namespace mcxl
