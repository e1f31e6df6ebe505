// FencedMutex: the master's one lock (mu_). Without HA it is a plain mutex.
// With --enable_ha every acquisition is the start of a structural write
// batch and is fenced:
//
//   leader, lock():   master_writing = term; seq_cst fence;
//                     term still the pool's and the lease not lapsed? else exit
//   leader, unlock(): master_writing = 0 (release)
//   new leader:       master_term = new term (CAS, only up); seq_cst fence;
//                     wait until master_writing is 0 (or its writer is gone)
//                     before the first structural write (TakeTerm)
//
// A Dekker pair on two superblock words: either the old leader sees the new
// term (and exits before writing) or the new leader sees it inside a batch
// and waits for the batch's end. So a paused old leader that resumes
// finishes at most the batch it was in, before the new leader's recovery,
// and never writes again. Both words cross hosts: in non-coherent mode they
// are flushed and observed (publish.h), and the pair needs store->load
// ordering across hosts (architecture.md section 7).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "mooncake_cxl/pool/layout.h"

namespace mcxl {

class FencedMutex {
 public:
  void lock() {
    mu_.lock();
    if (term_ != 0) Enter();
  }
  void unlock() {
    if (term_ != 0) Leave();
    mu_.unlock();
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    if (term_ != 0) Enter();
    return true;
  }
  std::mutex& raw() { return mu_; }

  // Arms the fence (before any other thread takes the lock): `sb` is the
  // pool's superblock, `term` ours, `lease_deadline` the MonoNs() before
  // which our lease is surely valid.
  void Arm(Superblock* sb, uint64_t term, const std::atomic<uint64_t>* lease_deadline) {
    sb_ = sb, lease_deadline_ = lease_deadline, term_ = term;
  }
  uint64_t term() const { return term_; }

  // The new leader's half: raises master_term to at least `wanted` (above
  // the pool's), then waits for a batch of the previous leader to end, or
  // for that leader (`prev_pid` on this machine when `prev_local`) to be
  // gone, or `max_wait_ns` for one on another host. The term taken.
  static uint64_t TakeTerm(Superblock* sb, uint64_t wanted, uint64_t prev_pid, bool prev_local,
                           uint64_t max_wait_ns);

 private:
  void Enter();
  void Leave();
  [[noreturn]] void Deposed(const char* why);

  std::mutex mu_;
  Superblock* sb_ = nullptr;
  const std::atomic<uint64_t>* lease_deadline_ = nullptr;
  uint64_t term_ = 0;  // 0: no HA (set once by Arm, before the servers start)
};

}  // namespace mcxl
