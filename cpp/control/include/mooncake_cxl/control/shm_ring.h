// ShmRing: one single-producer/single-consumer ring of the CXL RPC in the
// pool (docs/architecture.md §5), and the futex waits around it.
//
// Contract: records are whole frames (FrameHeader + payload, the TCP RPC's
// format). Push never blocks: false when the ring lacks room. Pop returns
// kEmpty, kOk with the frame, or kCorrupt when the bytes at the tail are not a
// record the producer could have written (a sequence number other than the
// expected one, a length that does not fit): the consumer then answers with
// an error and calls Reset-like SkipAll. Nothing read from the ring is
// trusted beyond its bounds.
//
// Record: [u64 seq][u32 len][u32 ~len][len bytes, padded to 8]. A record
// never wraps: when it does not fit before the end, the producer writes a
// wrap marker (len = kWrap) if 16 bytes remain, and starts again at 0.
//
// Waiting is spin-then-sleep: WaitForData polls for `spin_ns`, then sleeps on
// a futex (the low 32 bits of head) with the consumer_waiting flag set, so a
// producer wakes it only when it actually sleeps. While polling, SpinWait
// decides between a pause (lowest latency when the other side has a core of
// its own) and sched_yield (needed when both sides share one core).
//
// Attachments: a slot's rings outlive the client that used them (the master
// resets them and hands the slot to the next client). Ring request ids carry
// a tag of the attachment (RingRequestId): the master serves only requests
// tagged with the slot's current generation, and a client takes (Peek, then
// Consume) only replies with its own id, so a reclaimed client that resumes
// can neither be served in nor steal replies from its successor's rings.
// And the attachment inside a ring call holds the request ring's `caller`
// word (ClaimCaller before its slot check, ReleaseCaller after its reply):
// a slot whose rings an earlier attachment still holds is not handed to
// another client (the master retires it), so a process stopped mid-push
// cannot resume into a successor's ring.
//
// Thread safety: one producer thread and one consumer thread per ring
// (callers serialise their own side).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mooncake_cxl/pool/layout.h"

namespace mcxl {

// Polling policy of a ring wait (both sides). Pausing gives the lowest
// latency when the peer has a core of its own; when both share one core the
// peer only runs once we yield. So: a yield that returned at once (nobody
// else wanted our core) and after which nothing had come makes the
// pause-only window double (to kMaxPauseNs); a yield that took longer than
// kContendedNs (another task ran here) after which the data was there says
// the peer shares our core: the window drops to zero, we yield at once.
// A yield that took longer than kThirdPartyNs gave a whole time slice to a
// task that is not the peer (a peer that answers runs for µs, then waits
// again): a yield hands such a task the core for milliseconds at every
// poll, so a SpinWait made with stop_yielding_when_hogged (a client's reply
// wait: its spin is 30 µs) only pauses for the next kNoYieldWaits waits,
// then the caller's futex sleep, whose wake-up runs it ahead of such a task.
// (The ring server keeps yielding: its window can be long, and a client on
// its core must get the core.)
// Measured (2 cores, fixed 2 µs pause): a ring round trip took
// 1.3 µs with client and master on different cores, 9.6 µs on one core;
// a batch of 64 puts with two CPU-bound processes beside the master and the
// client took ~4 ms (one time slice a round trip) while waits yielded.
// Not thread-safe: one per waiting thread (callers serialise).
class SpinWait {
 public:
  static constexpr uint64_t kMaxPauseNs = 20000;
  static constexpr uint64_t kContendedNs = 2000;  // an idle sched_yield: 0.5-1 µs
  static constexpr uint64_t kThirdPartyNs = 200000;
  static constexpr uint32_t kNoYieldWaits = 256;  // then a yield may find the core free again
  explicit SpinWait(bool stop_yielding_when_hogged = false) : stop_when_hogged_(stop_yielding_when_hogged) {}
  // One poll step after a poll that found nothing, `waited` ns into the wait.
  void Relax(uint64_t waited);
  // How long the last sched_yield took (Relax's; a seam for tests).
  void NoteYield(uint64_t took_ns);
  // The poll after the last step found data.
  void Found() {
    if (last_ == Step::kLongYield) pause_ns_ = 0;
    last_ = Step::kNone;
    if (no_yield_waits_ > 0) --no_yield_waits_;
  }
  // A futex sleep came between: the next Found() says nothing about cores.
  void Slept() { last_ = Step::kNone; }
  uint64_t pause_ns() const { return pause_ns_; }
  bool yields() const { return no_yield_waits_ == 0; }

 private:
  enum class Step { kNone, kPause, kFastYield, kLongYield };
  uint64_t pause_ns_ = 2000;
  uint32_t no_yield_waits_ = 0;
  bool stop_when_hogged_;
  Step last_ = Step::kNone;
};

class ShmRing {
 public:
  ShmRing() = default;
  // tail_cache: the producer's copy of the consumer's tail (see Push), for a
  // producer that builds a ShmRing per call; by default the object's own.
  ShmRing(RingHeader* header, uint64_t ring_bytes, uint64_t* tail_cache = nullptr)
      : h_(header), data_(reinterpret_cast<char*>(header + 1)), cap_(ring_bytes - sizeof(RingHeader)),
        tail_cache_(tail_cache) {}

  bool valid() const { return h_ != nullptr; }
  // The largest frame a ring can carry (bigger ones go over TCP).
  uint64_t max_frame() const { return cap_ / 2 - 16; }

  // ---- producer ----
  bool Push(const std::string& frame);
  // The same for a frame given as its header and payload (no joined copy).
  bool Push(const void* front, size_t front_bytes, std::string_view body);
  // Wakes the consumer if it sleeps (call after Push).
  void WakeConsumer();

  // ---- consumer ----
  enum class PopResult { kEmpty, kOk, kCorrupt };
  PopResult Pop(std::string* frame);
  // Pop in two steps: Peek copies the record at the tail without consuming
  // it (Peek writes nothing); Consume(at) then releases it. A consumer that
  // finds a record that is not its own leaves it in place.
  struct Position {
    uint64_t tail = 0, seq = 0;  // just past the record
  };
  PopResult Peek(std::string* frame, Position* at) const;
  void Consume(const Position& at);
  bool HasData() const;
  // Waits until data is present or `timeout_ns` passes; true if data.
  bool WaitForData(uint64_t spin_ns, uint64_t timeout_ns);
  bool WaitForData(uint64_t spin_ns, uint64_t timeout_ns, SpinWait* spin);
  // Discards everything produced so far (after kCorrupt).
  void SkipAll();

  // ---- the request ring's caller word (see above) ----
  // Claims the word for attachment `gen` (non-zero; generations only grow).
  // A word held by an older generation is taken over: the master handed the
  // slot on only after it saw the word free, so that holder claimed it late
  // and finds its slot gone at its check (it touches nothing). False when a
  // newer generation holds it: we are stale. The caller re-checks its slot
  // after a claim (seq_cst order: claim, then check).
  bool ClaimCaller(uint64_t gen);
  void ReleaseCaller(uint64_t gen);
  static uint64_t CallerOf(RingHeader* h);

  // Both sides' counters to zero: only while neither side uses the ring.
  static void Reset(RingHeader* h);

 private:
  uint64_t& cached_tail() { return tail_cache_ ? *tail_cache_ : own_tail_; }

  RingHeader* h_ = nullptr;
  char* data_ = nullptr;
  uint64_t cap_ = 0;
  uint64_t* tail_cache_ = nullptr;  // external copy, else own_tail_
  uint64_t own_tail_ = 0;
};

// The tag of an attachment: unique among the generations of one master
// incarnation (their low halves differ; the high half, the incarnation, is
// folded in so that tags of two incarnations rarely meet).
inline uint32_t RingTag(uint64_t slot_generation) {
  return uint32_t(slot_generation) ^ (uint32_t(slot_generation >> 32) * 0x9E3779B1u);
}
// Request id of a client's n-th ring request under `slot_generation`.
inline uint64_t RingRequestId(uint64_t slot_generation, uint64_t n) {
  return (uint64_t(RingTag(slot_generation)) << 32) | uint32_t(n);
}
inline bool RingRequestOf(uint64_t request_id, uint64_t slot_generation) {
  return uint32_t(request_id >> 32) == RingTag(slot_generation);
}

// futex(2) on a 32-bit word in a MAP_SHARED mapping (works across processes).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns);
void FutexWakeAll(std::atomic<uint32_t>* word);
// The low 32 bits of a 64-bit counter, as a futex word (little endian).
inline std::atomic<uint32_t>* LowWord(std::atomic<uint64_t>* v) {
  return reinterpret_cast<std::atomic<uint32_t>*>(v);
}

}  // namespace mcxl
