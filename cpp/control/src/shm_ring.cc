#include "mooncake_cxl/control/shm_ring.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {
namespace {
constexpr uint32_t kWrap = 0xFFFFFFFFu;
constexpr uint64_t kRecordHeader = 16;

uint64_t RecordBytes(uint64_t len) { return kRecordHeader + (len + 7) / 8 * 8; }
}  // namespace

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{time_t(timeout_ns / 1000000000ull), long(timeout_ns % 1000000000ull)};
  // Shared (not PRIVATE) futex: the word lives in a MAP_SHARED mapping.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void ShmRing::Reset(RingHeader* h) {
  // Relaxed + publish: only called while neither side uses the ring (the
  // master, under its lock, before the slot is handed out or after it is
  // reclaimed); the slot's release-stored generation orders these stores.
  // Observed first: the previous attachment's host wrote half of each line.
  ObserveRange(h, sizeof(*h));
  h->head.store(0, std::memory_order_relaxed);
  h->next_seq.store(0, std::memory_order_relaxed);
  h->caller.store(0, std::memory_order_relaxed);
  h->tail.store(0, std::memory_order_relaxed);
  h->expected_seq.store(0, std::memory_order_relaxed);
  h->consumer_waiting.store(0, std::memory_order_relaxed);
  PublishRange(h, sizeof(*h));
}

bool ShmRing::Push(const std::string& frame) { return Push(nullptr, 0, frame); }

bool ShmRing::Push(const void* front, size_t front_bytes, std::string_view body) {
  // The record holds front then body: callers pass a frame header and its
  // payload without first joining them into one string.
  uint64_t size = front_bytes + body.size();
  uint64_t rec = RecordBytes(size);
  if (size > max_frame()) return false;
  // Relaxed: only this (producer) thread writes head and next_seq.
  uint64_t head = h_->head.load(std::memory_order_relaxed);
  uint64_t pos = head % cap_, to_end = cap_ - pos;
  uint64_t need = rec + (to_end < rec ? to_end : 0);
  // The tail is read only when the copy we acquired earlier says there is
  // no room: each read is a miss on the line the consumer writes per record.
  // A copy is never ahead of the real tail (it only grows) unless the ring
  // was reset since (then it is ahead of head): re-read.
  uint64_t& tail = cached_tail();
  if (tail > head || head + need - tail > cap_) {
    // Acquire: the consumer finished reading the bytes it released.
    ObserveRange(&h_->tail, sizeof(uint64_t));
    tail = h_->tail.load(std::memory_order_acquire);
    if (head + need - tail > cap_) return false;  // full (or a tail past head: corrupt)
  }
  uint64_t seq = h_->next_seq.load(std::memory_order_relaxed);
  if (to_end < rec) {
    if (to_end >= kRecordHeader) {
      uint32_t wrap[2] = {kWrap, ~kWrap};
      memcpy(data_ + pos, &seq, 8);
      memcpy(data_ + pos + 8, wrap, 8);
      PublishRange(data_ + pos, kRecordHeader);
    }
    head += to_end;
    pos = 0;
  }
  uint32_t len = uint32_t(size), check = ~len;
  memcpy(data_ + pos, &seq, 8);
  memcpy(data_ + pos + 8, &len, 4);
  memcpy(data_ + pos + 12, &check, 4);
  if (front_bytes != 0) memcpy(data_ + pos + kRecordHeader, front, front_bytes);
  memcpy(data_ + pos + kRecordHeader + front_bytes, body.data(), body.size());
  PublishRange(data_ + pos, rec);
  h_->next_seq.store(seq + 1, std::memory_order_relaxed);
  // Release: the record's bytes are visible before the head that covers them.
  h_->head.store(head + rec, std::memory_order_release);
  PublishRange(&h_->head, 2 * sizeof(uint64_t));
  return true;
}

void ShmRing::WakeConsumer() {
  // seq_cst fence: pairs with the consumer's flag-then-recheck in
  // WaitForData, so one of us sees the other (no lost wake-up).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ObserveRange(&h_->consumer_waiting, sizeof(uint32_t));
  if (h_->consumer_waiting.load(std::memory_order_relaxed) != 0) FutexWakeAll(LowWord(&h_->head));
}

bool ShmRing::HasData() const {
  ObserveRange(&h_->head, sizeof(uint64_t));
  // Acquire: pairs with Push's release; the record is readable once seen.
  return h_->head.load(std::memory_order_acquire) != h_->tail.load(std::memory_order_relaxed);
}

ShmRing::PopResult ShmRing::Pop(std::string* frame) {
  Position at;
  PopResult r = Peek(frame, &at);
  if (r == PopResult::kOk) Consume(at);
  return r;
}

ShmRing::PopResult ShmRing::Peek(std::string* frame, Position* at) const {
  uint64_t tail = h_->tail.load(std::memory_order_relaxed);  // ours
  ObserveRange(&h_->head, sizeof(uint64_t));
  uint64_t head = h_->head.load(std::memory_order_acquire);  // pairs with Push
  for (;;) {
    if (head == tail) return PopResult::kEmpty;
    if (head - tail > cap_) return PopResult::kCorrupt;  // counters impossible for this ring
    uint64_t pos = tail % cap_, to_end = cap_ - pos;
    if (to_end < kRecordHeader) {  // the producer skipped this tail end
      tail += to_end;
      continue;
    }
    ObserveRange(data_ + pos, kRecordHeader);
    uint64_t seq;
    uint32_t len, check;
    memcpy(&seq, data_ + pos, 8);
    memcpy(&len, data_ + pos + 8, 4);
    memcpy(&check, data_ + pos + 12, 4);
    uint64_t expected = h_->expected_seq.load(std::memory_order_relaxed);
    if (seq != expected || check != ~len) return PopResult::kCorrupt;
    if (len == kWrap) {
      tail += to_end;
      continue;
    }
    uint64_t rec = RecordBytes(len);
    if (rec > to_end || rec > head - tail) return PopResult::kCorrupt;
    ObserveRangeUnless(SimMutation::kDropRingInvalidate, data_ + pos + kRecordHeader, len);
    frame->assign(data_ + pos + kRecordHeader, len);
    *at = Position{tail + rec, expected + 1};
    return PopResult::kOk;
  }
}

void ShmRing::Consume(const Position& at) {
  h_->expected_seq.store(at.seq, std::memory_order_relaxed);
  // Release: our reads of the record are done before the producer reuses it.
  h_->tail.store(at.tail, std::memory_order_release);
  PublishRange(&h_->tail, 2 * sizeof(uint64_t));
}

void ShmRing::SkipAll() {
  ObserveRange(&h_->head, 2 * sizeof(uint64_t));
  uint64_t head = h_->head.load(std::memory_order_acquire);
  // Resynchronise on the producer's next record.
  h_->expected_seq.store(h_->next_seq.load(std::memory_order_relaxed), std::memory_order_relaxed);
  h_->tail.store(head, std::memory_order_release);
  PublishRange(&h_->tail, 2 * sizeof(uint64_t));
}

bool ShmRing::ClaimCaller(uint64_t gen) {
  // seq_cst: the claim and the caller's slot check after it form a Dekker
  // pair with the master's generation store and CallerOf: either the master
  // sees the claim (and keeps the rings from a successor) or we see the slot
  // gone.
  ObserveRange(&h_->caller, sizeof(uint64_t));
  uint64_t seen = h_->caller.load(std::memory_order_relaxed);
  do {
    // Generations only grow: a newer holder is our successor; leave it be.
    if (seen > gen) return false;
  } while (!h_->caller.compare_exchange_weak(seen, gen, std::memory_order_seq_cst, std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_seq_cst);  // orders the caller's (acquire) slot check
  PublishRange(&h_->caller, sizeof(uint64_t));
  return true;
}

void ShmRing::ReleaseCaller(uint64_t gen) {
  // Release: our ring accesses are done before the word says so. A CAS, not
  // a store: a successor that took the word over keeps it.
  uint64_t mine = gen;
  h_->caller.compare_exchange_strong(mine, 0, std::memory_order_release, std::memory_order_relaxed);
  PublishRange(&h_->caller, sizeof(uint64_t));
}

uint64_t ShmRing::CallerOf(RingHeader* h) {
  ObserveRange(&h->caller, sizeof(uint64_t));
  // seq_cst: the master's half of the Dekker pair in ClaimCaller.
  return h->caller.load(std::memory_order_seq_cst);
}

void SpinWait::Relax(uint64_t waited) {
  if (last_ == Step::kFastYield)  // yielding bought nothing: our core is ours
    pause_ns_ = std::min<uint64_t>(kMaxPauseNs, pause_ns_ == 0 ? 1000 : pause_ns_ * 2);
  if (waited < pause_ns_ || no_yield_waits_ > 0) {
    _mm_pause();
    last_ = Step::kPause;
    return;
  }
  uint64_t t0 = MonoNs();
  sched_yield();
  NoteYield(MonoNs() - t0);
}

void SpinWait::NoteYield(uint64_t took_ns) {
  if (stop_when_hogged_ && took_ns > kThirdPartyNs) {  // not the peer: stop yielding (header)
    no_yield_waits_ = kNoYieldWaits;
    last_ = Step::kPause;
    return;
  }
  last_ = took_ns > kContendedNs ? Step::kLongYield : Step::kFastYield;
}

bool ShmRing::WaitForData(uint64_t spin_ns, uint64_t timeout_ns) {
  SpinWait spin;
  return WaitForData(spin_ns, timeout_ns, &spin);
}

bool ShmRing::WaitForData(uint64_t spin_ns, uint64_t timeout_ns, SpinWait* spin) {
  if (HasData()) {  // already there: no clock read
    spin->Found();
    return true;
  }
  uint64_t start = MonoNs();
  while (!HasData()) {
    uint64_t now = MonoNs();
    if (now - start >= timeout_ns) return false;
    if (now - start < spin_ns) {
      // Pause or yield between polls (SpinWait): a producer that shares our
      // core (2-core machines) must get to run.
      spin->Relax(now - start);
      continue;
    }
    // Sleep: announce it, re-check (a Push may have raced the flag), wait.
    uint32_t seen = LowWord(&h_->head)->load(std::memory_order_relaxed);
    h_->consumer_waiting.store(1, std::memory_order_relaxed);
    PublishRange(&h_->consumer_waiting, sizeof(uint32_t));
    // seq_cst fence: pairs with WakeConsumer's (flag store before head re-check).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // A futex wake does not cross hosts: on a non-coherent (multi-host) pool
    // the producer may be elsewhere, so sleep in short slices and re-poll.
    uint64_t slice = GetCoherenceMode() == CoherenceMode::kNonCoherent ? 100000 : 50000000;
    if (!HasData()) FutexWait(LowWord(&h_->head), seen, std::min<uint64_t>(timeout_ns - (now - start), slice));
    h_->consumer_waiting.store(0, std::memory_order_relaxed);  // a hint: a spare wake costs nothing
    PublishRange(&h_->consumer_waiting, sizeof(uint32_t));  // not left dirty in this host's cache
    spin->Slept();
  }
  spin->Found();
  return true;
}

}  // namespace mcxl
