#include "mooncake_cxl/control/announce.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

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

// Channel `ch` if it carries name_hash, else OBJECT_NOT_FOUND.
Result<AnnounceChannelHeader*> Named(const Pool& pool, uint32_t ch, uint64_t name_hash) {
  if (ch >= pool.geometry().announce_channels || name_hash == 0) {
    MCXL_LOG(kWarn, "announce", "announce channel %u (of %u) with name hash %llx: no such channel", ch,
             pool.geometry().announce_channels, (unsigned long long)name_hash);
    return ErrorCode::INVALID_PARAMS;
  }
  AnnounceChannelHeader* c = pool.announce_channel(ch);
  ObserveRange(c, sizeof(uint64_t));
  // Acquire: pairs with the master's release store of the name, after its
  // wipe of the records.
  if (c->name_hash.load(std::memory_order_acquire) != name_hash) {
    MCXL_LOG(kWarn, "announce", "announce channel %u no longer carries the name it was opened by", ch);
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  return c;
}

}  // namespace

uint64_t AnnounceNameHash(std::string_view scoped_name) { return KeyHash(scoped_name) | 1; }

void NameAnnounceChannel(const Pool& pool, uint32_t ch, uint64_t name_hash) {
  AnnounceChannelHeader* c = pool.announce_channel(ch);
  const uint32_t slots = pool.geometry().announce_slots;
  // The old name goes first, so its readers stop (Next re-checks the name
  // after each copy) rather than return a wiped record: the release fence
  // makes this store visible to a reader that saw any wiped word and then
  // (acquire fence) loads the name.
  c->name_hash.store(0, std::memory_order_seq_cst);
  PublishRange(c, sizeof(uint64_t));
  std::atomic_thread_fence(std::memory_order_release);
  // Relaxed: published by the name's release store below; nobody opens a
  // channel before it carries the name they were given.
  for (uint32_t i = 0; i < slots; ++i) {
    AnnounceRecord* r = RecordOf(pool, c, i);
    r->seq.store(0, std::memory_order_relaxed);
    for (auto& w : r->words) w.store(0, std::memory_order_relaxed);
  }
  c->owner_pid.store(0, std::memory_order_relaxed);
  c->head.store(0, std::memory_order_relaxed);
  for (auto& h : c->holders) h.store(0, std::memory_order_relaxed);
  PublishRange(c, AnnounceChannelBytes(slots));
  // Release: the wiped records and head are visible before the name (on
  // other hosts through the PublishRange above and below: readers there
  // ObserveRange before they load it; docs/architecture.md section 7, item 9).
  c->name_hash.store(name_hash, std::memory_order_release);
  PublishRange(c, sizeof(uint64_t));
  FutexWakeAll(LowWord(&c->head));  // the old name's sleeping readers find it lost
}

void FreeAnnounceChannel(const Pool& pool, uint32_t ch) {
  AnnounceChannelHeader* c = pool.announce_channel(ch);
  // Release: a reader that sees 0 stops (kLost); the records stay until a
  // new name wipes them, and nobody opens a free channel.
  c->name_hash.store(0, std::memory_order_release);
  c->owner_pid.store(0, std::memory_order_relaxed);
  for (auto& h : c->holders) h.store(0, std::memory_order_relaxed);
  PublishRange(c, sizeof(*c));
  // A sleeping reader wakes and finds the channel lost.
  FutexWakeAll(LowWord(&c->head));
}

void SetAnnounceHolder(const Pool& pool, uint32_t ch, uint32_t slot, bool held) {
  std::atomic<uint64_t>& w = pool.announce_channel(ch)->holders[(slot / 64) % kAnnounceHolderWords];
  const uint64_t bit = 1ull << (slot % 64);
  // Relaxed: the master's own record, read back only by a restarted master.
  w.store(held ? w.load(std::memory_order_relaxed) | bit : w.load(std::memory_order_relaxed) & ~bit,
          std::memory_order_relaxed);
  PublishRange(&w, sizeof(uint64_t));
}

uint64_t AnnounceOwner(const Pool& pool, uint32_t ch, uint64_t* machine_hash) {
  AnnounceChannelHeader* c = pool.announce_channel(ch);
  ObserveRange(c, sizeof(uint64_t) * 4);
  // Relaxed: a liveness probe; the caller checks the pid, never trusts it.
  *machine_hash = c->owner_machine.load(std::memory_order_relaxed);
  return c->owner_pid.load(std::memory_order_relaxed);
}

Result<std::unique_ptr<AnnounceProducer>> AnnounceProducer::Open(std::shared_ptr<Pool> pool, uint32_t ch,
                                                                 uint64_t name_hash, std::function<void()> on_close) {
  auto named = Named(*pool, ch, name_hash);
  if (!named) {
    if (on_close) on_close();
    return named.error();
  }
  AnnounceChannelHeader* c = *named;
  const uint64_t me = uint64_t(getpid()), machine = MachineHash();
  for (int attempt = 0; attempt < 4; ++attempt) {
    ObserveRange(c, sizeof(*c));
    uint64_t owner = c->owner_pid.load(std::memory_order_acquire);
    if (owner != 0) {
      // A dead owner of this machine gives the channel up; any other keeps it.
      bool dead = owner != me && c->owner_machine.load(std::memory_order_relaxed) == machine &&
                  kill(pid_t(owner), 0) != 0 && errno == ESRCH;
      if (!dead) {
        MCXL_LOG(kWarn, "announce", "announce channel %u already has a producer (pid %llu)", ch,
                 (unsigned long long)owner);
        if (on_close) on_close();
        return ErrorCode::OBJECT_ALREADY_EXISTS;
      }
    }
    // acq_rel: one claimant wins; the head it continues from is the last
    // owner's (records keep their numbers, readers' cursors stay valid).
    if (c->owner_pid.compare_exchange_strong(owner, me, std::memory_order_acq_rel)) {
      c->owner_machine.store(machine, std::memory_order_relaxed);
      c->epoch.fetch_add(1, std::memory_order_relaxed);
      PublishRange(c, sizeof(uint64_t) * 4);
      std::unique_ptr<AnnounceProducer> p(new AnnounceProducer(std::move(pool), c, name_hash));
      p->pid_ = me;
      p->on_close_ = std::move(on_close);
      return p;
    }
  }
  if (on_close) on_close();
  return ErrorCode::OBJECT_ALREADY_EXISTS;
}

AnnounceProducer::~AnnounceProducer() { Close(); }

void AnnounceProducer::Close() {
  if (!open_) return;
  open_ = false;
  uint64_t me = pid_;
  // Release: our records are published before the channel is free.
  if (ch_->owner_pid.compare_exchange_strong(me, 0, std::memory_order_acq_rel))
    PublishRange(&ch_->owner_pid, sizeof(uint64_t));
  if (on_close_) std::exchange(on_close_, nullptr)();
}

uint64_t AnnounceProducer::head() const { return ch_->head.load(std::memory_order_relaxed); }

Result<uint64_t> AnnounceProducer::Publish(const AnnounceMessage& m) {
  ObserveRange(ch_, sizeof(uint64_t) * 2);
  // Relaxed: a check that the channel is still ours (the claim line is
  // written only at claims and frees); the master frees a channel only once
  // its owner closed or exited, or its slot is gone with its host's process.
  if (!open_ || ch_->name_hash.load(std::memory_order_relaxed) != name_hash_ ||
      ch_->owner_pid.load(std::memory_order_relaxed) != pid_) {
    MCXL_LOG(kWarn, "announce", "publish: the channel is no longer this producer's (closed, taken over or freed)");
    return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  }
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

Result<std::unique_ptr<AnnounceReader>> AnnounceReader::Open(std::shared_ptr<Pool> pool, uint32_t ch,
                                                             uint64_t name_hash, bool from_start,
                                                             std::function<void()> on_close) {
  auto named = Named(*pool, ch, name_hash);
  if (!named) {
    if (on_close) on_close();
    return named.error();
  }
  std::unique_ptr<AnnounceReader> r(new AnnounceReader(std::move(pool), *named, name_hash));
  r->on_close_ = std::move(on_close);
  uint64_t head = r->head();
  uint64_t slots = r->pool_->geometry().announce_slots;
  r->cursor_ = !from_start ? head : (head > slots ? head - slots : 0);
  return r;
}

AnnounceReader::~AnnounceReader() { Close(); }

void AnnounceReader::Close() {
  if (!open_) return;
  open_ = false;
  if (on_close_) std::exchange(on_close_, nullptr)();
}

bool AnnounceReader::named() const {
  ObserveRange(ch_, sizeof(uint64_t));
  // Acquire: a record read before this load was written under the name
  // this load returns or a later one (the master names after a wipe, with
  // a release store; a producer publishes only after seeing the name).
  return open_ && ch_->name_hash.load(std::memory_order_acquire) == name_hash_;
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
      // head only grows; a cursor past it (a head some process rewrote, or
      // a renamed channel's) is pulled back so the reader is not stuck.
      if (cursor_ > head) cursor_ = head;
      return named() ? ReadResult::kEmpty : ReadResult::kLost;
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
    // The name again, after the copy: a record of a later name is never
    // returned as this one's.
    if (!named()) return ReadResult::kLost;
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
    if (!named()) return true;  // Next says kLost
    uint64_t now = MonoNs();
    if (now - start >= timeout_ns) return false;
    if (now - start < spin_ns) {
      spin.Relax(now - start);
      continue;
    }
    uint32_t seen = LowWord(&ch_->head)->load(std::memory_order_relaxed);
    // A non-coherent pool: readers on many hosts would share the counter
    // (a fetch_add is atomic on one host only) and a futex wake does not
    // cross hosts, so they poll in 100 us slices and never write the channel.
    const bool noncoherent = GetCoherenceMode() == CoherenceMode::kNonCoherent;
    if (!noncoherent) {
      // seq_cst: pairs with Publish (head store, then readers_waiting load).
      ch_->readers_waiting.fetch_add(1, std::memory_order_seq_cst);
      PublishRange(&ch_->readers_waiting, sizeof(uint32_t));
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    uint64_t slice = noncoherent ? 100000 : 50000000;
    if (head() <= cursor_)
      FutexWait(LowWord(&ch_->head), seen, std::min<uint64_t>(timeout_ns - (now - start), slice));
    if (!noncoherent) {
      ch_->readers_waiting.fetch_sub(1, std::memory_order_seq_cst);
      PublishRange(&ch_->readers_waiting, sizeof(uint32_t));
    }
    spin.Slept();
  }
  spin.Found();
  return true;
}

}  // namespace mcxl
