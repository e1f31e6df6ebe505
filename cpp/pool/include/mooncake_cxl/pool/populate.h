// Populating a pool's pages ahead of use, off the caller's thread.
//
// Contract: on a pool file on tmpfs or hugetlbfs, the first touch of a page
// nobody touched yet allocates and zeroes it inside a page fault (a 16 MiB
// put into such space takes several times a warm one), and the first touch
// of a page another process allocated costs this process a fault to map it.
// AllocateRange allocates a range of the file (fallocate: the pages are
// zeroed in the page cache, no process's mapping is touched); PopulateRange
// maps a range into this process (MADV_POPULATE_WRITE, Linux 5.14+), and
// allocates what is not yet. Neither changes a byte, so both are safe while
// others read and write the pool. BackgroundPopulator runs one of them over
// a plan on its own thread in steps, so neither master start nor client
// setup waits for it; a put that reaches a page first takes that fault.
// The master allocates (kAllocate, nice 19, 2 MiB steps: nothing of its
// mapping is locked, so its ring thread never waits on it); a client maps
// (kMap, 256 KiB steps: each holds the mapping's lock for reading, which an
// mmap or munmap of that process, a large malloc, then waits for).
// The plan (PopulatePlan) is the metadata regions first (superblock, tables,
// rings, channels, index), then the data region only where it pays
// (PopulateDataPays: tmpfs or hugetlbfs). A device-DAX node maps 2 MiB per
// fault and allocates nothing, and populating a disk file would write its
// blocks: for those only the metadata is populated.
//
// Thread safety: a BackgroundPopulator is started and stopped by one owner;
// the Pool must outlive it (Stop, or the destructor, joins the thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

constexpr uint64_t kAllocateStepBytes = 2ull << 20;
constexpr uint64_t kMapStepBytes = 256ull << 10;

enum class PopulateMode { kAllocate, kMap };

struct PoolRange {
  uint64_t offset = 0;
  uint64_t len = 0;
};

// True when the pool is a regular file on tmpfs or hugetlbfs.
bool PopulateDataPays(const Pool& pool);
// The metadata regions, then the data region when `data` and it pays.
// REQUIRES: the pool was formatted or verified (geometry() is set).
std::vector<PoolRange> PopulatePlan(const Pool& pool, bool data);
// Maps [offset, offset + len) of the pool now (clamped to the mapping,
// page-rounded). INTERNAL_ERROR when the kernel refuses (not logged).
Status PopulateRange(const Pool& pool, uint64_t offset, uint64_t len);
// Allocates [offset, offset + len) of the pool's file (clamped), never past
// its end: UNAVAILABLE_IN_CURRENT_STATUS when the file is shorter (it shrank,
// and must stay so for CheckSize); INTERNAL_ERROR when the file system
// refuses (errno says why; not logged).
Status AllocateRange(const Pool& pool, uint64_t offset, uint64_t len);

class BackgroundPopulator {
 public:
  BackgroundPopulator() = default;
  ~BackgroundPopulator() { Stop(); }
  BackgroundPopulator(const BackgroundPopulator&) = delete;
  BackgroundPopulator& operator=(const BackgroundPopulator&) = delete;

  // Starts populating `plan` of `pool`; `who` names the process in its one
  // log line (done, with the time taken, or why it stopped). kAllocate
  // falls back to kMap where allocating does not pay (PopulateDataPays).
  // Stops a previous run first.
  void Start(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode);
  // Ends the run within one step and joins it. Idempotent.
  void Stop();
  // True once the whole plan was populated.
  bool done() const { return done_.load(std::memory_order_acquire); }

 private:
  void Run(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode);
  std::thread thread_;
  // Relaxed: a stop hint polled between steps; Stop's join orders the rest.
  std::atomic<bool> stop_{false};
  // Release/acquire: done() after the last step (host-local, this process).
  std::atomic<bool> done_{false};
};

}  // namespace mcxl
