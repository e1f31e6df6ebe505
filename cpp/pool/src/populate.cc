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
                                ForegroundBusy busy) {
  Stop();
  stop_.store(false, std::memory_order_relaxed);
  done_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this, pool, plan = std::move(plan), who = std::move(who), mode,
                         busy = std::move(busy)]() mutable { Run(pool, std::move(plan), std::move(who), mode, busy); });
}

bool BackgroundPopulator::WaitQuiet(const ForegroundBusy& busy) {
  while (busy && busy()) {
    if (stop_.load(std::memory_order_relaxed)) return false;
    // A pause between polls, not a synchronisation: the probe is a hint.
    struct timespec ts {0, long(kQuietPollNs)};
    nanosleep(&ts, nullptr);
  }
  return !stop_.load(std::memory_order_relaxed);
}

void BackgroundPopulator::Stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void BackgroundPopulator::Run(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode,
                              const ForegroundBusy& busy) {
  bool allocate = mode == PopulateMode::kAllocate && PopulateDataPays(*pool);
  // Normal priority: the run yields to foreground work by deferring its
  // steps (WaitQuiet), not by niceness. At nice 19 on a busy machine a step
  // was preempted for ms while it held pages or a mapping lock, and the put
  // that faulted on one of them waited that long.
  uint64_t step = allocate ? kAllocateStepBytes : kMapStepBytes;
  uint64_t t0 = MonoNs(), total = 0;
  for (const PoolRange& r : plan) {
    for (uint64_t off = r.offset; off < r.offset + r.len; off += step) {
      if (!WaitQuiet(busy)) return;  // closing: nothing to log
      if (pool->failed()) return;
      uint64_t n = std::min(step, r.offset + r.len - off);
      Status st = allocate ? AllocateRange(*pool, off, n) : PopulateRange(*pool, off, n);
      // The master writes each new object's header into its extent: mapped
      // here, that first write takes no page fault on the put's path.
      for (uint64_t m = 0; allocate && st.ok() && m < n; m += kMapStepBytes) {
        if (!WaitQuiet(busy)) return;
        st = PopulateRange(*pool, off + m, std::min(kMapStepBytes, n - m));
      }
      if (st.error() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) return;  // shrank: CheckSize logs it
      if (!st.ok()) {
        int err = errno;
        MCXL_LOG(kWarn, who.c_str(), "stopped populating pool %s at %llu of %llu MiB: %s; later pages fault "
                 "in on first touch", pool->path().c_str(), (unsigned long long)(total >> 20),
                 (unsigned long long)(pool->size() >> 20), strerror(err));
        return;
      }
      total += n;
    }
  }
  MCXL_LOG(kInfo, who.c_str(), "populated the pool (%llu of %llu MiB%s, %s) in %.3f s in the background",
           (unsigned long long)(total >> 20), (unsigned long long)(pool->size() >> 20),
           plan.size() > 1 ? ", data included" : ", metadata only", allocate ? "allocated and mapped" : "mapped",
           double(MonoNs() - t0) / 1e9);
  done_.store(true, std::memory_order_release);
}

}  // namespace mcxl
