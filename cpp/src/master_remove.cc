// Removal and frees. Contract: only the master unlinks an entry (Unlink:
// tombstone under the seqlock, then free). An extent is freed at once, or
// deferred: until a time (a revoked put whose writer may still run), or
// while a client's pin table names the object (a live BufferHandle). An
// unforced remove of a leased or pinned object is OBJECT_HAS_LEASE.
//
// Atomics follow the three rules stated in master.h.
#include "mooncake_cxl/master.h"

#include <algorithm>
#include <regex>

#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/key_hash.h"
#include "mooncake_cxl/log.h"
#include "mooncake_cxl/object_header.h"
#include "mooncake_cxl/publish.h"
#include "mooncake_cxl/shm_ring.h"
#include "master_internal.h"

namespace mcxl {

bool Master::IsPinned(uint64_t generation) const {
  // seq_cst fence: the tombstone (or lease check) before it and the pin loads
  // after it form a Dekker pair with the client's pin store, fence, version
  // re-check: either we see its pin or it sees our version change.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t per = pool_->superblock()->pins_per_client;
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    if (!PinTableLive(c)) continue;
    ClientSlot* cs = pool_->client_slot(c);
    ObserveRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
    if (cs->pins_in_use.load(std::memory_order_relaxed) == 0) continue;
    uint64_t hwm = std::min<uint64_t>(cs->pin_high_water.load(std::memory_order_relaxed), per);
    PinRecord* t = pool_->pin_table(c);
    ObserveRange(t, hwm * sizeof(PinRecord));
    for (uint64_t i = 0; i < hwm; ++i)
      if (t[i].object_offset.load(std::memory_order_relaxed) != 0 &&
          t[i].generation.load(std::memory_order_relaxed) == generation)
        return true;
  }
  return false;
}

void Master::ReleaseUnpinned() {
  size_t keep = 0;
  for (const PinnedFree& p : pinned_) {
    if (IsPinned(p.generation)) pinned_[keep++] = p;
    else (void)alloc_->Free(p.handle);
  }
  pinned_.resize(keep);
}

void Master::Unlink(uint64_t entry_slot, bool free_now, uint64_t release_mono_ns) {
  uint64_t gen = GenOf(index_->entry(entry_slot).state_gen.load(std::memory_order_relaxed));
  index_->Tombstone(entry_slot);
  --live_entries_;
  RemoveFromGroup(entry_slot);
  EntryMeta& meta = entry_meta_[entry_slot];
  if (meta.counted) --stats_.complete_keys;
  meta.counted = false;
  if (free_now && IsPinned(gen)) {
    pinned_.push_back({meta.extent, gen});
  } else if (free_now) {
    Status s = alloc_->Free(meta.extent);
    if (!s.ok())
      MCXL_LOG(kError, "master", "extent of entry %llu was already free", (unsigned long long)entry_slot);
  } else {
    deferred_.push_back({meta.extent, release_mono_ns});
  }
}

ErrorCode Master::RemoveKey(std::string_view key, bool force) {
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
    if (StateOf(sg) == EntryState::kComplete && (newest == UINT64_MAX || GenOf(sg) > newest_gen))
      newest = s, newest_gen = GenOf(sg);
  }
  if (newest == UINT64_MAX) return live.empty() ? ErrorCode::OBJECT_NOT_FOUND : ErrorCode::REPLICA_IS_NOT_READY;
  if (!force && (index_->LeaseUntil(newest) > now || IsPinned(newest_gen)))
    return ErrorCode::OBJECT_HAS_LEASE;
  (void)UnlinkWithOlder(newest, nullptr);
  return ErrorCode::OK;
}

std::string Master::HandleRemove(Decoder* d, bool batch) {
  RemoveRequest req;
  RemoveReply reply;
  if (!Decode(d, &req) || (!batch && req.keys.size() != 1)) {
    MCXL_LOG(kWarn, "master", "malformed Remove request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else {
    for (const auto& k : req.keys) {
      ++stats_.remove_requests;
      ErrorCode r = RemoveKey(k, req.force);
      if (r != ErrorCode::OK) ++stats_.remove_failures;
      reply.results.push_back(ToInt(r));
    }
    if (!batch) reply.status = ErrorCode(reply.results[0]);
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

std::string Master::HandleRemoveMatching(Decoder* d, bool all) {
  RemoveByRegexRequest req;
  CountReply reply;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed RemoveByRegex/RemoveAll request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
    Encoder e;
    Encode(reply, &e);
    return e.data();
  }
  std::regex re;
  if (!all) {
    try {
      re = std::regex(req.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& ex) {
      MCXL_LOG(kWarn, "master", "remove_by_regex: invalid pattern '%s': %s", req.pattern.c_str(), ex.what());
      reply.status = ErrorCode::INVALID_PARAMS;
      Encoder e;
      Encode(reply, &e);
      return e.data();
    }
  }
  uint64_t now = NowNs();
  for (uint64_t s = 0; s < index_->capacity(); ++s) {
    const IndexEntry& e = index_->entry(s);
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    if (StateOf(sg) != EntryState::kComplete) continue;
    if (!req.force && (index_->LeaseUntil(s) > now || IsPinned(GenOf(sg)))) continue;
    if (!all) {
      std::string_view k = KeyOf(s);
      if (!std::regex_search(k.begin(), k.end(), re)) continue;
    }
    (void)UnlinkWithOlder(s, nullptr);  // with the older values of its key
    ++reply.count;
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

}  // namespace mcxl
