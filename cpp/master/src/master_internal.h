// Helpers shared by the master's parts (master*.cc) and its SSD tier
// (tier_*.cc); not a public header.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "mooncake_cxl/common/error_code.h"

namespace mcxl {

constexpr uint64_t kNsPerSec = 1000000000ull;
constexpr uint64_t kClientCheckIntervalNs = 500 * 1000000ull;
// How long a new leader waits for a previous one on another host that is
// marked inside a write batch (it cannot tell a pause from a crash there).
constexpr uint64_t kHaRemoteBatchWaitNs = 10ull * 1000000000ull;

// gethostname(): pid checks are meaningful only for clients of this machine.
std::string ThisMachine();
// True when `pid` is gone or a zombie (a killed child not yet reaped).
bool LocalPidDead(uint64_t pid);
// One member of a sampled window of the index (eviction ahead of the
// watermark, pre-demotion): its last access, sorted on; state_gen names the
// object sampled, so a slot reused since is recognised.
struct SampledSlot {
  uint64_t last_access, slot, state_gen;
  bool operator<(const SampledSlot& o) const { return last_access < o.last_access; }
};
// Probe lengths (index slots read) in power-of-two buckets, the last one
// open: a Prometheus histogram on /metrics.
struct ProbeHistogram {
  static constexpr int kBuckets = 8;  // <= 1, 2, 4, ..., 64, more
  uint64_t counts[kBuckets] = {}, sum = 0, n = 0;
  void Add(uint64_t len) {
    int b = 0;
    while (b < kBuckets - 1 && (uint64_t(1) << b) < len) ++b;
    ++counts[b];
    sum += len;
    ++n;
  }
};
// A reply payload carrying only `status`.
std::string StatusReply(ErrorCode status);
// Between two slices of an index scan, mu_ released: std::mutex is not fair,
// and without a pause the scanning thread would take it again before a woken
// waiter (a put on the ring thread) runs.
inline void SlicePause() { std::this_thread::sleep_for(std::chrono::microseconds(20)); }

}  // namespace mcxl
