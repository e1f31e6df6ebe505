#include "mooncake_cxl/pool/populate.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fcntl.h>

#include <cerrno>
#include <cstring>

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

void BackgroundPopulator::Start(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode) {
  Stop();
  stop_.store(false, std::memory_order_relaxed);
  done_.store(false, std::memory_order_relaxed);
  thread_ = std::thread([this, pool, plan = std::move(plan), who = std::move(who), mode]() mutable {
    Run(pool, std::move(plan), std::move(who), mode);
  });
}

void BackgroundPopulator::Stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void BackgroundPopulator::Run(const Pool* pool, std::vector<PoolRange> plan, std::string who, PopulateMode mode) {
  bool allocate = mode == PopulateMode::kAllocate && PopulateDataPays(*pool);
  // Zeroing pages yields the core to ring threads and putters (nice 19, not
  // SCHED_IDLE: a fault on a page this thread holds waits for it, and an
  // idle-class thread on a busy machine made such waits last 100s of ms).
  // Mapping allocated pages is cheap and holds the mapping's lock: it runs
  // at normal priority, to be done before large puts need it.
  if (allocate) (void)setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), 19);
  uint64_t step = allocate ? kAllocateStepBytes : kMapStepBytes;
  uint64_t t0 = MonoNs(), total = 0;
  for (const PoolRange& r : plan) {
    for (uint64_t off = r.offset; off < r.offset + r.len; off += step) {
      if (stop_.load(std::memory_order_relaxed)) return;  // closing: nothing to log
      if (pool->failed()) return;
      uint64_t n = std::min(step, r.offset + r.len - off);
      Status st = allocate ? AllocateRange(*pool, off, n) : PopulateRange(*pool, off, n);
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
           plan.size() > 1 ? ", data included" : ", metadata only", allocate ? "allocated" : "mapped",
           double(MonoNs() - t0) / 1e9);
  done_.store(true, std::memory_order_release);
}

}  // namespace mcxl
