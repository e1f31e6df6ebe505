// Recovery: a master started on a formatted pool without --format rebuilds
// its state from the pool alone. Contract: every COMPLETE entry whose object
// header checks out is kept and its extent reserved in the allocator; a key
// with two COMPLETE entries (an upsert caught mid-flight) keeps the newest;
// unfinished puts are revoked with the same CAS their client would use to
// publish (so exactly one side wins), and their extents stay reserved until
// the owner's process is gone (a client of this machine) or, for a remote
// owner, --put_start_release_timeout_sec passes; client slots of the previous
// incarnation are cleared, except that a slot whose process may be alive and
// holds views is retired with its pin table, and the extents those views show
// are kept (master_pins.cc).
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <algorithm>
#include <unordered_map>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {

void MasterImpl::Recover() {
  RecoverAnnounceChannels();  // reads the client table as the last master left it
  // Pids of the previous incarnation's clients, to free their unfinished
  // extents at once when they are dead.
  std::vector<uint64_t> old_pid(clients_.size(), 0);
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    ClientSlot* cs = pool_->client_slot(i);
    // Only a client of this machine can be known dead by its pid.
    if (cs->generation.load(std::memory_order_relaxed) != 0 &&
        cs->machine_hash.load(std::memory_order_relaxed) == KeyHash(machine_))
      old_pid[i] = cs->pid.load(std::memory_order_relaxed);
    // Every client re-attaches; one whose process may be alive and holds
    // views keeps its slot and pins (retired until it re-attaches).
    RecoverPinTable(i);
  }
  PublishRange(pool_->client_slot(0), clients_.size() * sizeof(ClientSlot));

  // What the checked header copy said (never re-read from the pool).
  struct Found {
    uint64_t slot, offset, extent, generation, group;
    uint32_t key_len;
  };
  std::vector<Found> complete, unfinished;
  // Generations grow by one per put: one this large was written by someone else.
  constexpr uint64_t kMaxSaneGeneration = 1ull << 55;
  uint64_t capacity = index_->capacity();
  for (uint64_t slot = 0; slot < capacity; ++slot) {
    IndexEntry& e = index_->entry(slot);
    index_->RepairVersion(slot);
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    bool sane_gen = GenOf(sg) < kMaxSaneGeneration;
    if (sane_gen) next_generation_ = std::max(next_generation_, GenOf(sg) + 1);
    EntryState st = StateOf(sg);
    if (st == EntryState::kEmpty || st == EntryState::kTombstone) continue;
    uint64_t off = e.object_offset.load(std::memory_order_relaxed);
    ObjectHeader h;
    bool ok = sane_gen && CheckedObjectHeader(*pool_, off, &h) &&
              h.key_hash == e.key_hash.load(std::memory_order_relaxed) &&
              h.value_size == e.value_size.load(std::memory_order_relaxed) && h.generation == GenOf(sg);
    // A live client of the previous incarnation may publish an unfinished
    // put this very moment: revoke with the same CAS it uses, so exactly one
    // of us wins, and keep the put if it won.
    if (st == EntryState::kWriting && ok && !index_->Abort(slot, GenOf(sg)))
      st = StateOf(e.state_gen.load(std::memory_order_acquire));
    Found f{slot, off, h.extent_size, GenOf(sg), h.group_hash, h.key_len};
    if (Readable(st) && ok) {
      complete.push_back(f);
    } else if ((st == EntryState::kWriting || st == EntryState::kAborted) && ok) {
      unfinished.push_back(f);
    } else {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu (state %d) has no valid object header; dropped",
               (unsigned long long)slot, int(st));
      index_->Tombstone(slot);
      ++stats_.dropped_on_recovery;
    }
  }
  // Reserve in address order (the allocator's fast path for recovery).
  auto by_offset = [](const Found& a, const Found& b) { return a.offset < b.offset; };
  uint64_t max_probe = 0;  // recomputed from what is kept: the shared word may have been overwritten
  std::sort(complete.begin(), complete.end(), by_offset);
  std::unordered_map<uint64_t, std::vector<uint64_t>> by_hash;
  for (const Found& f : complete) {
    auto ext = alloc_->Reserve(f.offset, f.extent);
    if (!ext) {
      MCXL_LOG(kWarn, "master", "recovery: entry %llu overlaps another object; dropped",
               (unsigned long long)f.slot);
      index_->Tombstone(f.slot);
      ++stats_.dropped_on_recovery;
      continue;
    }
    entry_meta_[f.slot] = EntryMeta{ext->handle, f.key_len, true, false, false};
    AddToGroup(f.slot, f.group);
    ++live_entries_;
    max_probe = std::max(max_probe, (f.slot - index_->HomeSlot(index_->entry(f.slot).key_hash.load(
                                                  std::memory_order_relaxed))) & (capacity - 1));
    CountComplete(f.slot);
    by_hash[index_->entry(f.slot).key_hash.load(std::memory_order_relaxed)].push_back(f.slot);
  }
  index_->SetMaxProbe(max_probe);
  ReservePinnedExtents();  // objects unlinked while viewed keep their extents
  // An upsert caught mid-flight leaves two COMPLETE entries of one key: keep
  // the newest.
  for (auto& [hash, slots] : by_hash) {
    if (slots.size() < 2) {
      uint32_t fl = index_->entry(slots[0]).flags.load(std::memory_order_relaxed);
      if (fl & kFlagSuperseded) index_->SetFlags(slots[0], fl & ~kFlagSuperseded);
      continue;
    }
    for (uint64_t s : slots) {
      if (!Readable(StateOf(index_->entry(s).state_gen.load(std::memory_order_relaxed))))
        continue;  // unlinked as an older value of a key handled just before
      ClearSupersededIfSettled(std::string(KeyOf(s)), hash);
    }
  }
  // Unfinished puts: revoke. Their extents are reserved (a live client of the
  // old incarnation might still write) and released once its local process
  // is gone, or after the release timeout for a remote owner.
  uint64_t release_at = MonoNs() + config_.put_start_release_timeout_sec * kNsPerSec;
  for (const Found& f : unfinished) {
    IndexEntry& e = index_->entry(f.slot);
    uint32_t owner = e.owner_slot.load(std::memory_order_relaxed);
    bool dead = owner < old_pid.size() && old_pid[owner] != 0 && LocalPidDead(old_pid[owner]);
    auto ext = alloc_->Reserve(f.offset, f.extent);
    index_->Tombstone(f.slot);
    ++stats_.revoked_puts;
    if (!ext) continue;  // overlapped a kept object: it was never ours to free
    if (dead) (void)alloc_->Free(ext->handle);
    else deferred_.push_back({ext->handle, release_at, owner < old_pid.size() ? old_pid[owner] : 0});
  }
  stats_.recovered_objects = stats_.complete_keys;
  MCXL_LOG(kInfo, "master", "recovery: kept %llu objects, revoked %zu unfinished puts, dropped %llu",
           (unsigned long long)stats_.complete_keys, unfinished.size(),
           (unsigned long long)stats_.dropped_on_recovery);
}

}  // namespace mcxl
