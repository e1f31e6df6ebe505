// Removal and frees. Contract: only the master unlinks an entry (Unlink:
// tombstone under the seqlock, then free). An extent is freed at once, or
// deferred: quarantined while a revoked put's writer may still run (until
// its local process is gone, or until a time for a remote writer), or
// while a client's pin table names the object (a live BufferHandle). An
// unforced remove of a leased object is OBJECT_HAS_LEASE; a pinned one is
// unlinked (the key is gone at once) and its extent outlives the last view,
// as Mooncake's remove succeeds while its (private-copy) handles live.
// remove_all / remove_by_regex touch only the caller's tenant's keys
// (tenant.h); the pattern is matched against the key without the prefix.
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <re2/re2.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/common/tenant.h"

namespace mcxl {

bool MasterImpl::ScanPins(const std::function<bool(uint64_t generation)>& visit) const {
  // seq_cst fence: the tombstone (or lease check) before it and the pin loads
  // after it form a Dekker pair with the client's pin store, fence, version
  // re-check: either we see its pin or it sees our version change.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t per = pool_->geometry().pins_per_client;  // ours: a shared word could stretch the scan
  // Only the slots MarkPinTable named: idle client slots cost nothing.
  for (uint32_t w = 0; w < pin_tables_.size(); ++w) {
    for (uint64_t bits = pin_tables_[w]; bits != 0; bits &= bits - 1) {
      uint32_t c = w * 64 + uint32_t(__builtin_ctzll(bits));
      if (c >= clients_.size()) break;
      if (!PinTableLive(c)) {
        UnmarkPinTable(c);
        continue;
      }
      ClientSlot* cs = pool_->client_slot(c);
      ObserveRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
      if (cs->pins_in_use.load(std::memory_order_relaxed) == 0) continue;
      uint64_t hwm = std::min<uint64_t>(cs->pin_high_water.load(std::memory_order_relaxed), per);
      PinRecord* t = pool_->pin_table(c);
      ObserveRange(t, hwm * sizeof(PinRecord));
      for (uint64_t i = 0; i < hwm; ++i)
        if (t[i].object_offset.load(std::memory_order_relaxed) != 0 &&
            visit(t[i].generation.load(std::memory_order_relaxed)))
          return true;
    }
  }
  return false;
}

bool MasterImpl::IsPinned(uint64_t generation) const {
  return ScanPins([generation](uint64_t g) { return g == generation; });
}

void MasterImpl::ReleaseUnpinned() {
  size_t keep = 0;
  for (const PinnedFree& p : pinned_) {
    if (IsPinned(p.generation)) pinned_[keep++] = p;
    else (void)alloc_->Free(p.handle);
  }
  pinned_.resize(keep);
}

void MasterImpl::Unlink(uint64_t entry_slot, bool free_now, uint64_t release_mono_ns, uint64_t quarantine_pid) {
  uint64_t gen = GenOf(index_->entry(entry_slot).state_gen.load(std::memory_order_relaxed));
  if (tier_) tier_->ForgetDiskCopy(entry_slot, gen);  // before the tombstone: it reads the state and key
  index_->Tombstone(entry_slot);
  if (!in_segment_.empty()) FreeSegmentExtent(entry_slot);  // its value's bytes: after the tombstone's bump
  --live_entries_;
  RemoveFromGroup(entry_slot);
  EntryMeta& meta = entry_meta_[entry_slot];
  if (meta.counted) --stats_.complete_keys;
  meta.counted = false;
  meta.live = false;  // the handle moves to a free list below; no later use of it via the slot
  if (tier_ && tier_->TakeOverFree(meta.extent)) return;  // in a demotion batch being written: freed after it
  if (free_now && IsPinned(gen)) {
    pinned_.push_back({meta.extent, gen});
  } else if (free_now) {
    Status s = alloc_->Free(meta.extent);
    if (!s.ok())
      MCXL_LOG(kError, "master", "extent of entry %llu was already free", (unsigned long long)entry_slot);
  } else {
    deferred_.push_back({meta.extent, release_mono_ns, quarantine_pid});
  }
}

void MasterImpl::ReleaseQuarantined(uint64_t now_mono) {
  // Pid checks read /proc: at most every kClientCheckIntervalNs, once per pid.
  bool check_pids = now_mono - last_quarantine_check_mono_ > kClientCheckIntervalNs;
  if (check_pids) last_quarantine_check_mono_ = now_mono;
  std::vector<std::pair<uint64_t, bool>> dead;  // pid -> gone, this pass
  auto gone = [&](uint64_t pid) {
    for (const auto& [p, d] : dead)
      if (p == pid) return d;
    dead.emplace_back(pid, LocalPidDead(pid));
    return dead.back().second;
  };
  size_t keep = 0;
  for (size_t i = 0; i < deferred_.size(); ++i) {
    const DeferredFree& d = deferred_[i];
    bool release = d.owner_pid == 0 ? now_mono >= d.release_mono_ns : check_pids && gone(d.owner_pid);
    if (release) (void)alloc_->Free(d.handle);
    else deferred_[keep++] = d;
  }
  deferred_.resize(keep);
}

ErrorCode MasterImpl::RemoveKey(std::string_view key, bool force) {
  if (key.empty() || key.size() > kMaxKeyLength) return ErrorCode::INVALID_PARAMS;
  std::vector<uint64_t> live;
  FindLive(key, KeyHash(key), &live);
  uint64_t now = NowNs();
  // One look per entry (see ClearSupersededIfSettled): only what was
  // COMPLETE here is checked and removed. The newest is the key's value (an
  // unsettled upsert leaves older ones): its lease and pins decide, and
  // UnlinkWithOlder removes the older ones first.
  uint64_t newest = UINT64_MAX, newest_gen = 0;
  for (uint64_t s : live) {
    uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    if (Readable(StateOf(sg)) && (newest == UINT64_MAX || GenOf(sg) > newest_gen))
      newest = s, newest_gen = GenOf(sg);
  }
  if (newest == UINT64_MAX) return live.empty() ? ErrorCode::OBJECT_NOT_FOUND : ErrorCode::REPLICA_IS_NOT_READY;
  // A view (pin) does not refuse: Unlink keeps the extent until it is gone.
  if (!force && index_->LeaseUntil(newest) > now) return ErrorCode::OBJECT_HAS_LEASE;
  (void)newest_gen;
  (void)UnlinkWithOlder(newest, nullptr);
  return ErrorCode::OK;
}

std::string MasterImpl::HandleRemove(Decoder* d, bool batch) {
  RemoveRequest req;
  RemoveReply reply;
  if (!Decode(d, &req) || (!batch && req.keys.size() != 1)) {
    MCXL_LOG(kWarn, "master", "malformed Remove request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (req.keys.size() > kMaxRequestKeys) {
    // Bounds the time under mu_; the client splits larger batches itself.
    MCXL_LOG(kWarn, "master", "BatchRemove of %zu keys refused: at most %u per request", req.keys.size(),
             kMaxRequestKeys);
    reply.status = ErrorCode::INVALID_PARAMS;
  } else {
    for (const auto& k : req.keys) {
      ++stats_.remove_requests;
      ErrorCode r = RemoveKey(k, req.force);
      if (r != ErrorCode::OK) ++stats_.remove_failures;
      reply.results.push_back(ToInt(r));
      // Its tombstone (or an earlier one of the key) not yet written: the
      // client waits for it. 0 for pool-only keys: no wait.
      if (tier_) reply.tomb_ticket = std::max(reply.tomb_ticket, tier_->PendingTomb(k));
    }
    if (!batch) reply.status = ErrorCode(reply.results[0]);
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

namespace {
std::string CountReplyBytes(ErrorCode status, uint64_t count, uint64_t tomb_ticket = 0) {
  Encoder e;
  Encode(CountReply{status, count, tomb_ticket}, &e);
  return e.data();
}
}  // namespace

std::string MasterImpl::HandleRemoveMatching(std::string_view payload, bool all) {
  Decoder d(payload);
  RemoveByRegexRequest req;
  if (!Decode(&d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed RemoveByRegex/RemoveAll request rejected");
    return CountReplyBytes(ErrorCode::INVALID_PARAMS, 0);
  }
  // RE2: linear time in the key, no recursion, bounded memory, whatever the
  // pattern. Latin-1 so that it matches bytes, as std::regex over char does
  // (the reference's regex_search). RE2 has no backreferences or lookaround:
  // such a pattern is refused (INVALID_PARAMS), never run slowly.
  std::string tenant;  // the caller's, from its Attach (Admit checked the ref)
  uint64_t cap = 0, epoch = 0;
  {
    std::lock_guard<FencedMutex> lock(mu_);
    cap = index_->capacity(), epoch = pool_epoch_;  // fixed until a replaced device is adopted
    if (req.client.slot < clients_.size() && clients_[req.client.slot].attached &&
        clients_[req.client.slot].generation == req.client.generation)
      tenant = clients_[req.client.slot].tenant;
  }
  if (tenant.empty()) return CountReplyBytes(ErrorCode::ILLEGAL_CLIENT, 0);  // reclaimed meanwhile: re-attach
  std::unique_ptr<RE2> re;
  if (!all) {
    if (req.pattern.size() > kMaxPatternBytes) {
      MCXL_LOG(kWarn, "master", "remove_by_regex: pattern of %zu bytes refused (limit %zu)", req.pattern.size(),
               kMaxPatternBytes);
      return CountReplyBytes(ErrorCode::INVALID_PARAMS, 0);
    }
    RE2::Options o;
    o.set_encoding(RE2::Options::EncodingLatin1);
    o.set_log_errors(false);
    o.set_max_mem(16 << 20);
    re = std::make_unique<RE2>(re2::StringPiece(req.pattern.data(), req.pattern.size()), o);
    if (!re->ok()) {
      MCXL_LOG(kWarn, "master", "remove_by_regex: pattern '%.200s' refused: %s (RE2 syntax: no backreferences "
               "or lookaround)", req.pattern.c_str(), re->error().c_str());
      return CountReplyBytes(ErrorCode::INVALID_PARAMS, 0);
    }
  }
  // In slices: mu_ is held for at most a budget of slots, key bytes matched
  // and unlinks, then released so that other requests run. Entries put
  // meanwhile behind the scan are not removed (as if put after the request);
  // each entry is judged on one look at its state, under one hold.
  uint64_t count = 0, ticket = 0;
  for (uint64_t s = 0; s < cap;) {
    {
      std::lock_guard<FencedMutex> lock(mu_);
      if (pool_epoch_ != epoch) break;  // the device was replaced: nothing of the caller's is left
      const uint64_t tombs_before = tier_ ? tier_->tombs_queued() : 0;
      uint64_t now = NowNs();
      for (uint64_t budget = 0; s < cap && budget < kScanSliceSlots; ++s) {
        ++budget;
        const IndexEntry& e = index_->entry(s);
        uint64_t sg = e.state_gen.load(std::memory_order_acquire);
        if (!Readable(StateOf(sg))) continue;
        if (!CheckedLive(s)) continue;  // corrupt: Tick reclaims it
        if (!req.force && index_->LeaseUntil(s) > now) continue;  // a view does not refuse (RemoveKey)
        std::string_view key_tenant, k;
        SplitStoredKey(KeyOf(s), &key_tenant, &k);
        if (key_tenant != tenant) continue;
        if (!all) {
          budget += k.size() / 256;
          if (!RE2::PartialMatch(re2::StringPiece(k.data(), k.size()), *re)) continue;
        }
        if (tier_) ticket = std::max(ticket, tier_->PendingTomb(KeyOf(s)));  // an earlier tombstone of the key
        (void)UnlinkWithOlder(s, nullptr);  // with the older values of its key
        budget += 8;  // the pin check of Unlink reads every client's pin table
        ++count;
      }
      if (tier_) ticket = std::max(ticket, tier_->TombTicketSince(tombs_before));  // this slice's tombstones
    }
    if (s < cap) SlicePause();
  }
  return CountReplyBytes(ErrorCode::OK, count, ticket);
}

}  // namespace mcxl
