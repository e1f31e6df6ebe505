// SimHost: a simulated host of a CXL pod without cross-host coherence, so
// that a missing write-back, a missing invalidate or a cross-host atomic
// breaks visibly on one machine (docs/architecture.md §7).
//
// Contract. MC_CXL_SIM_HOST=<id> (0..32766) puts every Pool this process
// opens on simulated host <id>; the pool must be formatted
// --coherence=noncoherent (Pool refuses otherwise). Such a process maps
// `<pool>.simhost-<id>`, the host copy, where the pool would be mapped: all
// its loads, stores and atomics act on the host copy, which every process of
// that host shares (one host's cores share caches). Bytes move between the
// host copy and the pool file only through WriteBack and Invalidate (the
// primitives of publish.h in simulated mode), a whole 64-byte line at a time:
//   WriteBack: each dirty line of the range is copied to the pool.
//   Invalidate: each dirty line is written back first (as clflushopt does),
//     then the line is refetched from the pool, so the next load sees the
//     pool's bytes.
// Dirty means "differs from the clean snapshot": `<pool>.simhost-<id>.state`
// holds, per host, the bytes of each line as last fetched or written back
// (so a store of the value already there is not a store). Lines are always
// valid: an invalidated clean line is refetched at once, as a prefetcher
// would.
//
// Concurrent stores by other processes of the same host. Every line
// operation, from any host, holds the line's stripe lock in
// `<pool>.simlines` (a pid; a dead holder's lock is taken over), so line
// copies never interleave. Stores to the host copy take no lock, so a
// refetch replaces each 8-byte word by a CAS from its snapshot value: a word
// stored locally since the line was read stays (it is now dirty against the
// new snapshot and will be written back), as if the store came after the
// refetch. A lock per line for the stores would need a hook in every store.
//
// Spontaneous churn. A thread per process (MC_CXL_SIM_CHURN line operations
// per second, default 20000, 0 = none) picks lines from a schedule seeded by
// MC_CXL_SIM_SEED (default random), the host and the process's attach
// ordinal on that host: half from the pool's metadata (below data_offset),
// half from the whole pool. A dirty line is written back, a clean one is
// refetched: what evictions and prefetches do. ChurnSteps runs the same
// schedule synchronously (tests). One log line at attach names the host,
// the seed and the rate: "simulated host <id> ...".
//
// The checker (always on). `<pool>.simlines` keeps, per line, a version
// (bumped by every write-back) and its last writer; each host keeps the
// version its copy of the line is based on. A synchronisation point of
// host h for line L is h's fetch of L (Invalidate or a spontaneous refetch)
// or h's write-back of L: afterwards h's copy is based on the pool's current
// line. A write-back of L by h is flagged when another host wrote L back
// since h's last synchronisation point for L, that is when h's copy was not
// based on the pool's current bytes and the whole-line write-back destroys
// the other host's bytes. It is counted as a lost update when h's changed
// bytes overlap the other host's (two hosts wrote one field, or h modified a
// value it read stale: a cross-host read-modify-write, a read without an
// invalidate that fed a write), else as false sharing (different fields of
// one line). Each flag is one log line (the first 20 per process) and a
// counter in the header of `<pool>.simlines` (SimCounters, ReadSimCounters).
// A stale read that feeds no write to that line is not detectable here.
//
// Thread safety: all members are thread-safe; the files are shared by the
// processes of every simulated host of one pool. Remove the sim files with
// the pool (SimFilePaths); a new pool at the same path (another inode or
// size) resets them.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/error_code.h"

namespace mcxl {

constexpr int kMaxSimHost = 32766;

// The header of `<pool>.simlines`, at offset 0 (tests read it with struct).
struct SimCounters {
  uint64_t conflicts = 0;      // write-backs flagged by the checker
  uint64_t lost_updates = 0;   // of which the bytes overlapped
  uint64_t false_sharing = 0;  // of which they did not
};
// Reads the counters of the pool at `pool_path` (all zero when no simulated
// process attached it yet).
SimCounters ReadSimCounters(const std::string& pool_path);
// The files the simulator keeps beside `pool_path` for hosts [0, hosts).
std::vector<std::string> SimFilePaths(const std::string& pool_path, int hosts);

// A region of the pool, for the checker's log lines: "<name> <i> +<byte>"
// for an offset in [offset, offset + count * stride).
struct SimRegion {
  std::string name;
  uint64_t offset = 0, stride = 0, count = 0;
};

// The deterministic line schedule of the churn (see the contract).
class ChurnSchedule {
 public:
  ChurnSchedule(uint64_t seed, int host, uint64_t ordinal);
  // REQUIRES: lines > 0. The next line in [0, lines), or in [0, hot_lines)
  // for half the picks when hot_lines > 0.
  uint64_t Next(uint64_t lines, uint64_t hot_lines);

 private:
  uint64_t state_;
};

class SimHost {
 public:
  // MC_CXL_SIM_HOST as a host id, or -1 when unset. An unparsable value or
  // one past kMaxSimHost is logged and -2 (Pool::Open fails).
  static int HostFromEnv();
  // Maps the host copy of the pool open on `pool_fd` (`size` bytes, file
  // mode `mode`), creating and filling the host's files from the pool when
  // they are missing or belong to another pool. Starts the churn thread.
  static Result<std::unique_ptr<SimHost>> Attach(const std::string& pool_path, int pool_fd, uint64_t size,
                                                 mode_t mode, int host);
  ~SimHost();
  SimHost(const SimHost&) = delete;
  SimHost& operator=(const SimHost&) = delete;

  // The host copy (what the Pool maps as its base).
  char* base() const { return copy_; }
  uint64_t size() const { return size_; }
  int host() const { return host_; }
  uint64_t seed() const { return seed_; }
  const std::string& copy_path() const { return copy_path_; }

  // The primitives (see the contract); bytes outside the mapping are ignored.
  void WriteBack(const void* p, size_t n);
  void Invalidate(const void* p, size_t n);
  // Bytes of pool metadata from offset 0 (the churn's hot half).
  void SetHotBytes(uint64_t n) { hot_lines_.store(n / 64, std::memory_order_relaxed); }
  // Names the pool's regions in the checker's log lines (set once the
  // layout is known).
  void SetRegions(std::vector<SimRegion> regions);
  // n spontaneous line operations of this process's schedule, now.
  void ChurnSteps(uint64_t n);
  // Tests: fn(arg, line) runs inside Invalidate between the line's
  // write-back and its refetch (the window a concurrent local store hits).
  void SetBeforeRefetchForTest(void (*fn)(void*, uint64_t), void* arg) { before_refetch_ = fn, before_refetch_arg_ = arg; }
  // Process-local totals (diagnostics).
  uint64_t write_backs() const { return write_backs_.load(std::memory_order_relaxed); }
  uint64_t fetches() const { return fetches_.load(std::memory_order_relaxed); }

 private:
  SimHost() = default;
  // fn(line) under the line's lock for each line of [p, p+n) in the mapping.
  template <typename Fn>
  void ForEachLine(const void* p, size_t n, Fn fn);
  void LockLine(uint64_t line);
  void UnlockLine(uint64_t line);
  // REQUIRES: the line's lock. True when written back.
  bool WriteBackLocked(uint64_t line);
  void RefetchLocked(uint64_t line);
  void Flag(uint64_t line, int other_host, const uint64_t* mine);
  void ChurnLoop(uint64_t per_second);

  std::string copy_path_;
  int host_ = -1;
  uint64_t seed_ = 0;
  uint64_t size_ = 0;
  uint64_t lines_ = 0;
  char* copy_ = nullptr;      // the host copy (MAP_SHARED, this host's processes)
  char* pool_ = nullptr;      // the pool file: only line copies touch it
  char* state_map_ = nullptr; // host header, base versions, clean snapshot
  uint64_t state_bytes_ = 0;
  uint64_t* bases_ = nullptr;
  char* snap_ = nullptr;
  char* global_map_ = nullptr;  // counters, stripe locks, line versions
  uint64_t global_bytes_ = 0;
  uint64_t* locks_ = nullptr;
  uint64_t* versions_ = nullptr;
  std::atomic<uint64_t> hot_lines_{0};  // relaxed: a hint for the churn's picks
  std::mutex churn_mu_;  // guards schedule_ and the stop flag's wait
  ChurnSchedule schedule_{0, 0, 0};
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread churn_;
  // Relaxed, process-local counters (diagnostics and the log cap).
  std::atomic<uint64_t> write_backs_{0}, fetches_{0}, flags_logged_{0};
  std::mutex regions_mu_;
  std::vector<SimRegion> regions_;  // guarded by regions_mu_
  void (*before_refetch_)(void*, uint64_t) = nullptr;
  void* before_refetch_arg_ = nullptr;
};

// The simulated mapping holding p (its host copy), or null.
SimHost* SimHostOf(const void* p);

}  // namespace mcxl
