// The fence of elected masters (master_fence.h).
#include "mooncake_cxl/master/master_fence.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "master_internal.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/master/master_ha.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {

void FencedMutex::Enter() {
  // Relaxed store + seq_cst fence + relaxed load: the Dekker pair with
  // TakeTerm's CAS, fence and load (see the header).
  sb_->master_writing.store(term_, std::memory_order_relaxed);
  PublishRange(&sb_->master_writing, sizeof(uint64_t));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ObserveRange(&sb_->master_term, sizeof(uint64_t));
  if (sb_->master_term.load(std::memory_order_relaxed) != term_) Deposed("the pool names a newer term");
  if (MonoNs() >= lease_deadline_->load(std::memory_order_relaxed)) Deposed("our etcd lease lapsed");
}

void FencedMutex::Leave() {
  // Release: the batch's writes happen before a new leader that sees 0 starts.
  sb_->master_writing.store(0, std::memory_order_release);
  PublishRange(&sb_->master_writing, sizeof(uint64_t));
}

void FencedMutex::Deposed(const char* why) {
  // Nothing of this batch was written: clear the mark so the new leader need not wait.
  sb_->master_writing.store(0, std::memory_order_release);
  PublishRange(&sb_->master_writing, sizeof(uint64_t));
  MCXL_LOG(kError, "ha", "stepping down (term %llu): %s", (unsigned long long)term_, why);
  _exit(kDeposedExitCode);
}

uint64_t FencedMutex::TakeTerm(Superblock* sb, uint64_t wanted, uint64_t prev_pid, bool prev_local,
                               uint64_t max_wait_ns) {
  ObserveRange(&sb->master_term, kCacheLine);
  uint64_t seen = sb->master_term.load(std::memory_order_relaxed), term = 0;
  do {
    // etcd's revision normally; above the pool's if etcd was rebuilt.
    term = wanted > seen ? wanted : seen + 1;
  } while (!sb->master_term.compare_exchange_weak(seen, term, std::memory_order_seq_cst));
  PublishRange(&sb->master_term, sizeof(uint64_t));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t start = MonoNs();
  bool logged = false;
  for (;;) {
    ObserveRange(&sb->master_writing, sizeof(uint64_t));
    uint64_t w = sb->master_writing.load(std::memory_order_acquire);
    if (w == 0 || w == term) break;
    if (prev_local && LocalPidDead(prev_pid)) break;  // died inside a batch: recovery repairs it
    if (!prev_local && MonoNs() - start > max_wait_ns) {
      MCXL_LOG(kWarn, "ha", "the previous master (another host) is still marked inside a write batch after "
               "%llu ms: taking over", (unsigned long long)(max_wait_ns / 1000000));
      break;
    }
    if (!logged) MCXL_LOG(kInfo, "ha", "waiting for the previous master (pid %llu) to leave its write batch",
                          (unsigned long long)prev_pid);
    logged = true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (logged) MCXL_LOG(kInfo, "ha", "the previous master left its write batch after %.1f ms",
                       double(MonoNs() - start) / 1e6);
  return term;
}

}  // namespace mcxl
