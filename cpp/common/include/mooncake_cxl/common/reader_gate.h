// ReaderGate: a close that waits for the short calls in flight, without a
// lock per call.
//
// Contract: a call Enter()s (false once closed: refuse the call), does its
// work and Exit()s; CloseAndWait() shuts the gate and returns once every
// call that entered has exited, after which no Enter() succeeds. Meant for
// calls of microseconds (single-key reads): the closer yields while it
// waits. One counter shared by every thread of the process (host-local):
// an uncontended Enter/Exit is two locked adds, where a pthread rwlock
// costs two locked operations plus its calls and bookkeeping.
//
// Thread safety: every member may be called from any thread; CloseAndWait
// from several at once is fine (each waits).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace mcxl {

class ReaderGate {
 public:
  bool Enter() {
    // seq_cst on both sides (Dekker): the increment is ordered before the
    // closed_ load here, and CloseAndWait's closed_ store before its
    // readers_ load, so either this call sees closed_ or the closer sees
    // this call counted. Host-local.
    readers_.fetch_add(1, std::memory_order_seq_cst);
    if (closed_.load(std::memory_order_seq_cst)) {
      Exit();
      return false;
    }
    return true;
  }
  // Release: the call's accesses happen before the closer's acquire load
  // that sees the count drop.
  void Exit() { readers_.fetch_sub(1, std::memory_order_release); }
  void CloseAndWait() {
    closed_.store(true, std::memory_order_seq_cst);  // seq_cst: as Enter
    // Acquire: pairs with Exit's release (the calls' work is done).
    while (readers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }
  // Acquire: pairs with CloseAndWait's store; a hint for callers that log
  // a refusal (Enter decides).
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint64_t> readers_{0};
  std::atomic<bool> closed_{false};
};

// Enters `gate` for a scope; ok() says whether it did.
class GateScope {
 public:
  explicit GateScope(ReaderGate& gate) : gate_(gate), ok_(gate.Enter()) {}
  ~GateScope() {
    if (ok_) gate_.Exit();
  }
  GateScope(const GateScope&) = delete;
  GateScope& operator=(const GateScope&) = delete;
  bool ok() const { return ok_; }

 private:
  ReaderGate& gate_;
  bool ok_;
};

}  // namespace mcxl
