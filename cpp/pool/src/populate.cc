#include "mooncake_cxl/pool/populate.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 uapi value
#endif

namespace mcxl {

bool PopulateDataPays(const Pool& pool) {
  constexpr long kTmpfsMagic = 0x01021994;
  constexpr long kHugetlbfsMagic = 0x958458f6;
  if (!S_ISREG(pool.file_mode())) return false;  // device-DAX: 2 MiB faults, nothing allocated
  struct statfs fs {};
  if (fstatfs(pool.fd(), &fs) != 0) return false;
  return long(fs.f_type) == kTmpfsMagic || long(fs.f_type) == kHugetlbfsMagic;
}

std::vector<PoolRange> PopulatePlan(const Pool& pool, bool data) {
  const PoolGeometry& g = pool.geometry();
  std::vector<PoolRange> plan;
  uint64_t meta_end = std::min<uint64_t>(g.data_offset, pool.size());
  plan.push_back({0, meta_end});
  if (data && PopulateDataPays(pool) && meta_end < pool.size()) plan.push_back({meta_end, pool.size() - meta_end});
  return plan;
}

Status PopulateRange(const Pool& pool, uint64_t offset, uint64_t len) {
  uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  if (offset >= pool.size()) return ErrorCode::OK;
  len = std::min(len, pool.size() - offset);
  uint64_t start = offset & ~(page - 1);
  uint64_t end = std::min(pool.size(), (offset + len + page - 1) & ~(page - 1));
  if (end <= start) return ErrorCode::OK;
  if (madvise(pool.base() + start, end - start, MADV_POPULATE_WRITE) != 0) return ErrorCode::INTERNAL_ERROR;
  return ErrorCode::OK;
}

Status AllocateRange(const Pool& pool, uint64_t offset, uint64_t len) {
  if (offset >= pool.size()) return ErrorCode::OK;
  len = std::min(len, pool.size() - offset);
  // Never past the file's end: a file that shrank stays shrunk, for
  // CheckSize to see (KEEP_SIZE, and no allocation beyond EOF either).
  struct stat st {};
  if (fstat(pool.fd(), &st) != 0) return ErrorCode::INTERNAL_ERROR;
  if (uint64_t(st.st_size) < offset + len) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  int rc;
  do rc = fallocate(pool.fd(), FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(len));
  while (rc != 0 && errno == EINTR);
  return rc == 0 ? Status(ErrorCode::OK) : Status(ErrorCode::INTERNAL_ERROR);
}

ForegroundBusy BusySinceLastPoll(const ActivityCounter* counter) {
  return [counter, seen = uint64_t(0)]() mutable {
    uint64_t now = counter->count.load(std::memory_order_relaxed);
    bool moved = now != seen;
    seen = now;
    return moved;
  };
}

void BackgroundPopulator::Start(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode,
                                ForegroundBusy busy, ForegroundFrontier frontier) {
  Stop();
  stop_.store(false, std::memory_order_relaxed);
  done_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this, pool, plan = std::move(plan), who = std::move(who), mode, busy = std::move(busy),
                         frontier = std::move(frontier)]() mutable {
    Run(pool, std::move(plan), std::move(who), mode, busy, frontier);
  });
}

bool BackgroundPopulator::Admit(const ForegroundBusy& busy, const ForegroundFrontier& frontier, const PoolRange& r,
                                uint64_t step, uint64_t* off, std::vector<PoolRange>* later, bool* leading) {
  const uint64_t end = r.offset + r.len;
  *leading = false;
  while (busy && busy()) {
    if (stop_.load(std::memory_order_relaxed)) return false;
    uint64_t f = frontier ? frontier() : 0;
    if (f > *off) {
      // The foreground passed these steps (it faulted their pages itself):
      // later, when quiet; go on from the step that holds the frontier.
      uint64_t to = f >= end ? end : r.offset + (f - r.offset) / step * step;
      if (to > *off) {
        later->push_back({*off, to - *off});
        *off = to;
      }
      if (*off >= end) return true;  // all of `r` passed
    }
    if (f != 0 && *off <= f + kLeadBytes) return *leading = true;  // just ahead of it (*off + step > f here)
    struct timespec ts {0, long(kQuietPollNs)};  // a pause between polls, not a synchronisation
    nanosleep(&ts, nullptr);
  }
  return !stop_.load(std::memory_order_relaxed);
}

void BackgroundPopulator::Stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void BackgroundPopulator::Run(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode,
                              const ForegroundBusy& busy, const ForegroundFrontier& frontier) {
  bool allocate = mode == PopulateMode::kAllocate && PopulateDataPays(*pool);
  // Normal priority: the run yields to foreground work by deferring its
  // steps (Admit), not by niceness. At nice 19 on a busy machine a step
  // was preempted for ms while it held pages or a mapping lock, and the put
  // that faulted on one of them waited that long.
  uint64_t step = allocate ? kAllocateStepBytes : kMapStepBytes;
  uint64_t t0 = MonoNs(), total = 0;
  const bool with_data = plan.size() > 1;
  uint64_t planned = 0;
  for (const PoolRange& r : plan) planned += r.len;
  std::vector<PoolRange> later;  // steps the foreground passed while busy: filled in after the plan
  for (int pass = 0; pass < 2; ++pass) {
    // Pass 1 fills in what pass 0 skipped; it leads nothing (Admit adds nothing to `later`).
    std::vector<PoolRange> ranges;
    ranges.swap(pass == 0 ? plan : later);
    const ForegroundFrontier lead = pass == 0 ? frontier : nullptr;
    for (const PoolRange& r : ranges) {
      bool leading = false;
      for (uint64_t off = r.offset, n = 0; off < r.offset + r.len; off += n) {
        if (!Admit(busy, lead, r, step, &off, &later, &leading)) return;  // closing: nothing to log
        if (off >= r.offset + r.len) break;  // the foreground passed the rest
        if (pool->failed()) return;
        // Beside a busy foreground, short steps: each takes a core from it
        // for a few µs rather than a few hundred.
        n = std::min(leading ? kLeadStepBytes : step, r.offset + r.len - off);
        Status st = allocate ? AllocateRange(*pool, off, n) : PopulateRange(*pool, off, n);
        // The master writes each new object's header into its extent: mapped
        // here, that first write takes no page fault on the put's path.
        const PoolRange parts{off, n};
        for (uint64_t m = off; allocate && st.ok() && m < off + n; m += kMapStepBytes) {
          bool part_leading = false;
          if (!Admit(busy, lead, parts, kMapStepBytes, &m, &later, &part_leading)) return;
          if (m >= off + n) break;
          st = PopulateRange(*pool, m, std::min(kMapStepBytes, off + n - m));
        }
        if (st.error() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) return;  // shrank: CheckSize logs it
        if (!st.ok()) {
          int err = errno;
          MCXL_LOG(kWarn, who.c_str(), "stopped populating pool %s at %llu of %llu MiB: %s; later pages fault "
                   "in on first touch", pool->path().c_str(), (unsigned long long)(total >> 20),
                   (unsigned long long)(pool->size() >> 20), strerror(err));
          return;
        }
        total += n;  // progress for the log line above (a skipped part is counted again when filled in)
      }
    }
  }
  MCXL_LOG(kInfo, who.c_str(), "populated the pool (%llu of %llu MiB%s, %s) in %.3f s in the background",
           (unsigned long long)(planned >> 20), (unsigned long long)(pool->size() >> 20),
           with_data ? ", data included" : ", metadata only", allocate ? "allocated and mapped" : "mapped",
           double(MonoNs() - t0) / 1e9);
  done_.store(true, std::memory_order_release);
}

}  // namespace mcxl
