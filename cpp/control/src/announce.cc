#include "mooncake_cxl/control/announce.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {
namespace {

uint64_t MachineHash() {
  char machine[256] = {};
  gethostname(machine, sizeof(machine) - 1);
  return KeyHash(machine);
}

AnnounceRecord* RecordOf(const Pool& pool, AnnounceChannelHeader* ch, uint64_t n) {
  return reinterpret_cast<AnnounceRecord*>(ch + 1) + (n & (pool.geometry().announce_slots - 1));
}

// The channel named `name`, naming a free one when none is. Names are never
// cleared, so the probe may stop at the first unnamed channel.
Result<AnnounceChannelHeader*> FindOrName(const Pool& pool, std::string_view name) {
  const uint32_t n = pool.geometry().announce_channels;
  if (n == 0 || name.empty()) {
    MCXL_LOG(kWarn, "announce", "announce channel: %s", n == 0 ? "the pool has no channels" : "empty name");
    return ErrorCode::INVALID_PARAMS;
  }
  const uint64_t h = KeyHash(name) | 1;
  for (uint32_t i = 0; i < n; ++i) {
    AnnounceChannelHeader* ch = pool.announce_channel(uint32_t((h + i) % n));
    ObserveRange(ch, sizeof(uint64_t));
    // Acquire: pairs with the namer's CAS; nothing else is published by it.
    uint64_t cur = ch->name_hash.load(std::memory_order_acquire);
    if (cur == 0) {
      uint64_t expected = 0;
      // acq_rel: one namer wins; a loser re-reads the winner's name.
      if (ch->name_hash.compare_exchange_strong(expected, h, std::memory_order_acq_rel)) {
        PublishRange(ch, sizeof(uint64_t));
        return ch;
      }
      cur = expected;
    }
    if (cur == h) return ch;
  }
  MCXL_LOG(kWarn, "announce", "announce channel '%.*s': all %u channels carry other names", int(name.size()),
           name.data(), n);
  return ErrorCode::NO_AVAILABLE_HANDLE;
}

}  // namespace

Result<std::unique_ptr<AnnounceProducer>> AnnounceProducer::Open(std::shared_ptr<Pool> pool,
                                                                 std::string_view name) {
  auto ch = FindOrName(*pool, name);
  if (!ch) return ch.error();
  AnnounceChannelHeader* c = *ch;
  const uint64_t me = uint64_t(getpid()), machine = MachineHash();
  for (int attempt = 0; attempt < 4; ++attempt) {
    ObserveRange(c, sizeof(*c));
    uint64_t owner = c->owner_pid.load(std::memory_order_acquire);
    if (owner != 0) {
      // A dead owner of this machine gives the channel up; any other keeps it.
      bool dead = owner != me && c->owner_machine.load(std::memory_order_relaxed) == machine &&
                  kill(pid_t(owner), 0) != 0 && errno == ESRCH;
      if (!dead) {
        MCXL_LOG(kWarn, "announce", "announce channel '%.*s' already has a producer (pid %llu)", int(name.size()),
                 name.data(), (unsigned long long)owner);
        return ErrorCode::OBJECT_ALREADY_EXISTS;
      }
    }
    // acq_rel: one claimant wins; the head it continues from is the last
    // owner's (records keep their numbers, readers' cursors stay valid).
    if (c->owner_pid.compare_exchange_strong(owner, me, std::memory_order_acq_rel)) {
      c->owner_machine.store(machine, std::memory_order_relaxed);
      c->epoch.fetch_add(1, std::memory_order_relaxed);
      PublishRange(c, sizeof(uint64_t) * 4);
      return std::unique_ptr<AnnounceProducer>(new AnnounceProducer(std::move(pool), c));
    }
  }
  return ErrorCode::OBJECT_ALREADY_EXISTS;
}

AnnounceProducer::~AnnounceProducer() { Close(); }

void AnnounceProducer::Close() {
  if (!open_) return;
  open_ = false;
  uint64_t me = uint64_t(getpid());
  // Release: our records are published before the channel is free.
  if (ch_->owner_pid.compare_exchange_strong(me, 0, std::memory_order_acq_rel))
    PublishRange(&ch_->owner_pid, sizeof(uint64_t));
}

uint64_t AnnounceProducer::head() const { return ch_->head.load(std::memory_order_relaxed); }

uint64_t AnnounceProducer::Publish(const AnnounceMessage& m) {
  // Relaxed: the producer is head's only writer.
  const uint64_t n = ch_->head.load(std::memory_order_relaxed);
  AnnounceRecord* r = RecordOf(*pool_, ch_, n);
  // Seqlock write: odd, then (release fence) the payload, then even (release).
  r->seq.store(2 * n + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (int i = 0; i < 7; ++i) r->words[i].store(m.words[i], std::memory_order_relaxed);
  PublishRange(r, sizeof(*r));
  r->seq.store(2 * n + 2, std::memory_order_release);
  PublishRange(r, sizeof(uint64_t));
  // seq_cst: the head store and the readers_waiting load below pair with a
  // reader's increment-then-recheck in Wait, so no wake-up is lost.
  ch_->head.store(n + 1, std::memory_order_seq_cst);
  PublishRange(&ch_->head, sizeof(uint64_t));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ObserveRange(&ch_->readers_waiting, sizeof(uint32_t));
  if (ch_->readers_waiting.load(std::memory_order_seq_cst) != 0) FutexWakeAll(LowWord(&ch_->head));
  return n;
}

Result<std::unique_ptr<AnnounceReader>> AnnounceReader::Open(std::shared_ptr<Pool> pool, std::string_view name,
                                                             bool from_start) {
  auto ch = FindOrName(*pool, name);
  if (!ch) return ch.error();
  std::unique_ptr<AnnounceReader> r(new AnnounceReader(std::move(pool), *ch));
  uint64_t head = r->head();
  uint64_t slots = r->pool_->geometry().announce_slots;
  r->cursor_ = !from_start ? head : (head > slots ? head - slots : 0);
  return r;
}

uint64_t AnnounceReader::head() const {
  ObserveRange(&ch_->head, sizeof(uint64_t));
  // Acquire: pairs with Publish's head store; records below it are complete.
  return ch_->head.load(std::memory_order_acquire);
}

uint64_t AnnounceReader::producer_pid() const {
  ObserveRange(&ch_->owner_pid, sizeof(uint64_t));
  // Acquire: pairs with Close's release, so a reader that sees the channel
  // released also sees every record published before it.
  return ch_->owner_pid.load(std::memory_order_acquire);
}

bool AnnounceReader::producer_dead() const {
  ObserveRange(ch_, sizeof(*ch_));
  // Relaxed: a liveness probe; the pid and machine are checked by kill, not trusted.
  uint64_t owner = ch_->owner_pid.load(std::memory_order_relaxed);
  if (owner == 0 || owner > uint64_t(INT32_MAX)) return false;
  if (ch_->owner_machine.load(std::memory_order_relaxed) != MachineHash()) return false;
  return kill(pid_t(owner), 0) != 0 && errno == ESRCH;
}

uint64_t AnnounceReader::epoch() const {
  ObserveRange(ch_, sizeof(*ch_));
  return ch_->epoch.load(std::memory_order_relaxed);
}

AnnounceReader::ReadResult AnnounceReader::Next(AnnounceMessage* m, uint64_t* number) {
  const uint64_t slots = pool_->geometry().announce_slots;
  for (;;) {
    uint64_t head = this->head();
    if (cursor_ >= head) {
      // head only grows; a cursor past it (a head some process rewrote) is
      // pulled back so the reader is not stuck forever.
      if (cursor_ > head) cursor_ = head;
      return ReadResult::kEmpty;
    }
    if (head - cursor_ > slots) {
      *number = head - slots - cursor_;
      cursor_ = head - slots;
      return ReadResult::kLapped;
    }
    AnnounceRecord* r = RecordOf(*pool_, ch_, cursor_);
    ObserveRange(r, sizeof(*r));
    const uint64_t want = 2 * cursor_ + 2;
    // Seqlock read: acquire, payload, acquire fence, re-read.
    uint64_t s1 = r->seq.load(std::memory_order_acquire);
    for (int i = 0; i < 7; ++i) m->words[i] = r->words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    uint64_t s2 = r->seq.load(std::memory_order_relaxed);
    if (s1 == want && s2 == want) {
      *number = cursor_++;
      return ReadResult::kOk;
    }
    // Overwritten while we read (the producer lapped us), or a seq no
    // producer wrote: skip the record, report it lost.
    if (s1 > want || s2 > want || s1 < want) {
      ++cursor_;
      *number = 1;
      return ReadResult::kLapped;
    }
  }
}

bool AnnounceReader::Wait(uint64_t spin_ns, uint64_t timeout_ns) {
  const uint64_t start = MonoNs();
  SpinWait spin;  // the rings' adaptive poll: pause, or yield to a producer on our core
  while (head() <= cursor_) {
    uint64_t now = MonoNs();
    if (now - start >= timeout_ns) return false;
    if (now - start < spin_ns) {
      spin.Relax(now - start);
      continue;
    }
    uint32_t seen = LowWord(&ch_->head)->load(std::memory_order_relaxed);
    // seq_cst: pairs with Publish (head store, then readers_waiting load).
    ch_->readers_waiting.fetch_add(1, std::memory_order_seq_cst);
    PublishRange(&ch_->readers_waiting, sizeof(uint32_t));
    std::atomic_thread_fence(std::memory_order_seq_cst);
    uint64_t slice = GetCoherenceMode() == CoherenceMode::kNonCoherent ? 100000 : 50000000;
    if (head() <= cursor_)
      FutexWait(LowWord(&ch_->head), seen, std::min<uint64_t>(timeout_ns - (now - start), slice));
    ch_->readers_waiting.fetch_sub(1, std::memory_order_seq_cst);
    PublishRange(&ch_->readers_waiting, sizeof(uint32_t));
    spin.Slept();
  }
  spin.Found();
  return true;
}

}  // namespace mcxl
