// The tests' don't-hang guard: how long a test waits for something that
// must happen before it calls it a failure. Never a measure of speed: a
// passing test waits far less, a loaded machine may take long.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace mcxl {
namespace testutil {

constexpr auto kGuard = std::chrono::seconds(60);
constexpr uint64_t kGuardNs = std::chrono::duration_cast<std::chrono::nanoseconds>(kGuard).count();

// Polls `done` (yielding between polls) until it holds: true, or false
// once the guard has passed. `step` runs before each poll (e.g. a Tick).
template <typename Done, typename Step>
bool WaitUntil(Done done, Step step) {
  const auto give_up = std::chrono::steady_clock::now() + kGuard;
  for (;;) {
    step();
    if (done()) return true;
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
}
template <typename Done>
bool WaitUntil(Done done) {
  return WaitUntil(done, [] {});
}

}  // namespace testutil
}  // namespace mcxl
