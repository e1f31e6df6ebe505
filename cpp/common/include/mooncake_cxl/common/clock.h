// Time for leases and heartbeats that several processes compare.
//
// Contract: NowNs() is CLOCK_REALTIME in nanoseconds, because lease words and
// heartbeats in the pool are compared by processes on different hosts of a
// CXL pod (NTP keeps them within far less than a lease). MonoNs() is for local
// intervals (timeouts, benchmarks) only and never stored in the pool.
#pragma once

#include <cstdint>
#include <ctime>

namespace mcxl {

inline uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace mcxl
