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
// The master allocates (kAllocate, 2 MiB steps), then maps each
// step in 256 KiB parts (it writes every new object's header: unmapped, each
// new page cost a put a fault); a client maps
// (kMap, 256 KiB steps: each holds the mapping's lock for reading, which an
// mmap or munmap of that process, a large malloc, then waits for).
// Foreground work comes first: before each step (and each 256 KiB part of an
// allocate step) the run asks its ForegroundBusy probe, and while that says
// a request or store call ran since the last ask it waits kQuietPollNs and
// asks again. A step starts only after a quiet poll period, so population
// never takes a core from a burst of puts; under a steady stream a put that
// reaches a page first takes that fault, as without prefault. The run keeps
// normal priority (a niced step, preempted while it holds a page or the
// mapping lock, stalls the put that waits for it). BusySinceLastPoll builds
// the probe from a counter the foreground bumps (ActivityCounter).
// Except just ahead of the foreground: a run given a ForegroundFrontier (the
// end of the extent the latest put was handed, which fresh space hands out
// in ascending order) populates, even while busy, a step that starts within
// kLeadBytes past it, kLeadStepBytes at a time (pages the next puts would
// fault in themselves, on their path), and skips the steps the frontier already passed (the puts
// touched them) until the rest of the plan is done, then fills them in when
// quiet.
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
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

constexpr uint64_t kAllocateStepBytes = 2ull << 20;
constexpr uint64_t kMapStepBytes = 256ull << 10;

constexpr uint64_t kQuietPollNs = 200'000;
// How far past the foreground's frontier a busy run still populates, and
// in steps of how much.
constexpr uint64_t kLeadBytes = 1ull << 20;
constexpr uint64_t kLeadStepBytes = 64ull << 10;

enum class PopulateMode { kAllocate, kMap };

// True while foreground work ran lately: the run waits. Called on the
// populating thread only.
using ForegroundBusy = std::function<bool()>;
// The pool offset the foreground's writes reached lately (0: none yet).
// Called on the populating thread only.
using ForegroundFrontier = std::function<uint64_t()>;

// Bumped by the foreground (a request served, a store call) at a cost of
// one relaxed load and store: a hint, so concurrent bumps may lose a count
// (the value still moves). On its own line: the bumping threads own it.
struct alignas(64) ActivityCounter {
  // Relaxed: only "did it move" is read, by one populating thread,
  // host-local; nothing is published through it.
  std::atomic<uint64_t> count{0};
  void Note() { count.store(count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
};

// A probe that says busy when `counter` moved since the probe's previous
// call (the first call: busy when it ever moved). `counter` must outlive it.
ForegroundBusy BusySinceLastPoll(const ActivityCounter* counter);

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
  // `busy`, when set, defers each step to a quiet moment (above); it is
  // called on the run's thread. Stops a previous run first.
  // `frontier`, when set, lets a busy run lead the foreground (above).
  void Start(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode,
             ForegroundBusy busy = nullptr, ForegroundFrontier frontier = nullptr);
  // Ends the run within one step and joins it. Idempotent.
  void Stop();
  // True once the whole plan was populated.
  bool done() const { return done_.load(std::memory_order_acquire); }

 private:
  void Run(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode,
           const ForegroundBusy& busy, const ForegroundFrontier& frontier);
  // Before the step at *off of `r`: true to run it now, false when stopped.
  // While busy, a step the frontier passed is skipped (its range added to
  // *later, *off moved past it) and one within kLeadBytes ahead of it runs
  // (*leading: then a step of kLeadStepBytes).
  bool Admit(const ForegroundBusy& busy, const ForegroundFrontier& frontier, const PoolRange& r, uint64_t step,
             uint64_t* off, std::vector<PoolRange>* later, bool* leading);
  std::thread thread_;
  // Relaxed: a stop hint polled between steps; Stop's join orders the rest.
  std::atomic<bool> stop_{false};
  // Release/acquire: done() after the last step (host-local, this process).
  std::atomic<bool> done_{false};
};

}  // namespace mcxl
