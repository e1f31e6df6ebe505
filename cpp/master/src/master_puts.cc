// Puts as the master sees them. Contract: PutStart allocates an extent,
// writes the ObjectHeader and key, inserts a WRITING entry and remembers it
// as pending; the client copies and CASes the entry COMPLETE itself. Tick
// (CheckPending) notices completions and, for upserts, unlinks the older
// value of the key (ClearSupersededIfSettled: one snapshot of the states per
// decision). Until then the key's newest entry is its value for every other
// decision too: eviction and removal unlink an entry only together with the
// older ones, oldest first (UnlinkWithOlder). Puts whose client gave up
// (abandoned put ids) or that outlived --put_start_discard_timeout_sec are
// revoked with the client's own CAS; the extent of one whose writer may still
// run is quarantined (Unlink). A put told to settle (the SSD tier holds an
// older record of its key, tier_manager.h) sends kSettle after its CAS:
// HandleSettle unlinks the older values at once and answers with the
// ticket of their tombstones.
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <algorithm>
#include <unordered_set>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {

PutStartItem MasterImpl::PutStartOne(const PutStartRequest& req, size_t i) {
  PutStartItem item;
  const std::string& key = req.keys[i];
  uint64_t size = req.sizes[i];
  if (key.empty() || key.size() > kMaxKeyLength) {
    MCXL_LOG(kWarn, "master", "put refused: key length %zu is outside 1..%u", key.size(), kMaxKeyLength);
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  if (size == 0) {
    MCXL_LOG(kWarn, "master", "put of '%s' refused: empty value", key.c_str());
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  uint64_t hash = KeyHash(key);
  std::vector<uint64_t> live;
  FindLive(key, hash, &live);
  // A sample (one put in 16) of what a reader's miss would walk: the walk
  // is what the shadow saves the master.
  if ((++lookup_samples_ & 15) == 0) put_lookup_probes_.Add(index_->MissProbeLength(hash));
  if (!live.empty() && !req.upsert) {
    item.status = ErrorCode::OBJECT_ALREADY_EXISTS;
    return item;
  }
  if ((req.config.flags & kFlagSoftPin) && req.config.soft_pin_ttl_ms > config_.max_kv_soft_pin_ttl_ms) {
    MCXL_LOG(kWarn, "master", "put of '%s' refused: soft_pin_ttl_ms %llu is above --max_kv_soft_pin_ttl=%llu",
             key.c_str(), (unsigned long long)req.config.soft_pin_ttl_ms,
             (unsigned long long)config_.max_kv_soft_pin_ttl_ms);
    item.status = ErrorCode::INVALID_PARAMS;
    return item;
  }
  uint64_t extent_bytes = ExtentBytes(key.size(), size);
  // A DRAM segment (master_segments.cc): the pool keeps a stub only.
  Extent seg;
  uint32_t seg_owner = kNoSlot;
  // A group stays in the pool: eviction takes a group whole, from one place.
  if ((req.placement & kPlaceSegment) && clients_[req.client.slot].segment && extent_bytes >= size &&
      req.groups[i].empty())
    seg_owner = PlaceInSegment(req, size, extent_bytes, &seg);
  if (seg_owner != kNoSlot) extent_bytes = ExtentBytes(key.size(), sizeof(SegmentStub));
  if ((extent_bytes < size && seg_owner == kNoSlot) || extent_bytes > alloc_->capacity()) {
    MCXL_LOG(kWarn, "master", "put of '%s' refused: %llu bytes can never fit a pool of %llu",
             key.c_str(), (unsigned long long)size, (unsigned long long)alloc_->capacity());
    item.status = ErrorCode::NO_AVAILABLE_HANDLE;
    return item;
  }
  auto ext = AllocateForPut(extent_bytes, key);
  if (!ext) {
    if (seg_owner != kNoSlot) (void)clients_[seg_owner].segment->Free(seg.handle);
    item.status = ext.error();
    return item;
  }
  uint64_t gen = next_generation_++;
  uint64_t now = NowNs();
  ObjectHeaderFields f;
  f.key_hash = hash;
  f.generation = gen;
  f.value_size = size;
  f.extent_size = ext->size;
  f.put_time_ns = now;
  f.group_hash = req.groups[i].empty() ? 0 : KeyHash(req.groups[i]);
  f.flags = (req.config.flags & (kFlagHardPin | kFlagSoftPin)) | (seg_owner != kNoSlot ? kFlagSegmentStub : 0);
  f.soft_pin_ttl_ms = !(f.flags & kFlagSoftPin)     ? 0
                      : req.config.soft_pin_ttl_ms ? req.config.soft_pin_ttl_ms
                                                   : config_.default_kv_soft_pin_ttl_ms;
  WriteObjectHeader(*pool_, ext->offset, f, key, hash);  // hash = KeyHash(key): not recomputed
  if (seg_owner != kNoSlot) WriteSegmentStub(ext->offset, key.size(), seg_owner, seg);
  ObjectIndex::InsertArgs args{hash, ext->offset, size, gen, now, f.flags, req.client.slot};
  auto slot = index_->Insert(args);
  // Every slot of the key's probe window is in use: make one free there.
  if (!slot && EvictInWindow(hash) > 0) slot = index_->Insert(args);
  if (!slot) {
    (void)alloc_->Free(ext->handle);
    if (seg_owner != kNoSlot) (void)clients_[seg_owner].segment->Free(seg.handle);
    bool transient = round_blocked_transiently_;
    MCXL_LOG(kWarn, "master", "put of '%s' refused: the %llu index slots of its probe window hold %s objects",
             key.c_str(), (unsigned long long)ObjectIndex::kMaxProbeSlots,
             transient ? "only leased, viewed or unfinished" : "only hard-pinned");
    item.status = transient ? ErrorCode::OBJECT_REPLICA_BUSY : ErrorCode::NO_AVAILABLE_HANDLE;
    return item;
  }
  insert_probes_.Add(index_->Distance(*slot, hash) + 1);
  // Recorded before anything looks the key up again: FindLive checks every
  // entry against these records (CheckedLive), the new one included.
  entry_meta_[*slot] = EntryMeta{ext->handle, uint32_t(key.size()), true, false, false};
  if (seg_owner != kNoSlot) RecordSegmentPlacement(*slot, {seg_owner, clients_[seg_owner].generation, seg.handle});
  if (req.upsert) {
    // Every older entry of the key, COMPLETE or still WRITING (a concurrent
    // upsert), is marked: a reader that meets one keeps probing and takes the
    // newest generation, so once this upsert returns no reader sees an older
    // value, whichever of the concurrent upserts completes last. (Looked up
    // again: making room may have evicted some.)
    FindLive(key, hash, &live);
    for (uint64_t s : live) {
      if (s == *slot) continue;
      uint32_t fl = index_->entry(s).flags.load(std::memory_order_relaxed);
      if (!(fl & kFlagSuperseded)) index_->SetFlags(s, fl | kFlagSuperseded);
    }
  }
  // The client settles after its CAS when the tier holds an older record of
  // the key (HandleSettle).
  if (tier_) item.settle = tier_->PutNeedsSettle(key, hash, gen, req.upsert);
  AddToGroup(*slot, f.group_hash);
  ++live_entries_;
  pending_.push_back({*slot, gen, req.client.slot, req.put_id, MonoNs(), req.upsert});
  item.entry_slot = *slot;
  item.generation = gen;
  item.value_offset = index_->ValueOffset(ext->offset, key.size());
  if (seg_owner != kNoSlot) {
    item.value_offset = seg.offset;
    item.segment_slot = seg_owner;
    item.segment_generation = clients_[seg_owner].generation;
  }
  return item;
}

std::string MasterImpl::HandlePutStart(Decoder* d) {
  // Per thread and reused: Decode assigns into its elements, so the keys'
  // strings keep their capacity and a small put allocates nothing for them.
  thread_local PutStartRequest req;
  thread_local PutStartReply reply;  // its items keep their capacity too
  reply.status = ErrorCode::OK;
  reply.items.clear();
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed PutStart request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (req.keys.size() > kMaxRequestKeys || req.abandoned.size() > kMaxAbandonedIds) {
    // Bounds the time under mu_; the client never sends more (it splits).
    MCXL_LOG(kWarn, "master", "PutStart of %zu keys with %zu abandoned put ids refused: at most %u and %u",
             req.keys.size(), req.abandoned.size(), kMaxRequestKeys, kMaxAbandonedIds);
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (!ClientValid(req.client)) {
    reply.status = ErrorCode::ILLEGAL_CLIENT;  // the client re-attaches and retries
  } else {
    ForgetAbandoned(req.client.slot, req.abandoned);
    const auto& gave_up = clients_[req.client.slot].abandoned;
    if (std::find(gave_up.begin(), gave_up.end(), req.put_id) != gave_up.end()) {
      // A PutStart its client gave up on, arriving late: do nothing.
      MCXL_LOG(kInfo, "master", "late PutStart %llu of client slot %u ignored: the client abandoned it",
               (unsigned long long)req.put_id, req.client.slot);
      reply.status = ErrorCode::RPC_TIMEOUT;
    } else {
      reply.items.reserve(req.keys.size());
      for (size_t i = 0; i < req.keys.size(); ++i) {
        ++stats_.put_requests;
        reply.items.push_back(PutStartOne(req, i));
        ErrorCode st = reply.items.back().status;
        if (st != ErrorCode::OK && st != ErrorCode::OBJECT_ALREADY_EXISTS) ++stats_.put_failures;
      }
    }
  }
  Encoder e;
  e.mutable_data().reserve(8 + 29 * reply.items.size());  // its exact size: one allocation
  Encode(reply, &e);
  // Keep only a small request's capacity: a big batch (up to kMaxRequestKeys
  // keys) must not stay allocated per thread.
  if (req.keys.size() > 64) req = PutStartRequest();
  if (reply.items.size() > 64) reply = PutStartReply();
  return std::move(e.mutable_data());  // e ends here: no copy
}

void MasterImpl::ClearSupersededIfSettled(std::string_view key, uint64_t hash) {
  std::vector<uint64_t> live;
  FindLive(key, hash, &live);
  // One snapshot of the states: a client may publish WRITING->COMPLETE at
  // any moment, and an entry seen WRITING here is not ours to judge (its own
  // completion settles it later). Deciding on a second look would unlink a
  // just-published newer value as if it were old.
  std::vector<uint64_t> states(live.size());
  uint64_t newest_gen = 0, newest = UINT64_MAX;
  bool pending_upsert = false;
  for (size_t i = 0; i < live.size(); ++i) {
    // Acquire: pairs with the client's COMPLETE CAS. (FindLive checked them.)
    states[i] = index_->entry(live[i]).state_gen.load(std::memory_order_acquire);
    if (StateOf(states[i]) == EntryState::kWriting) pending_upsert = true;
    else if (GenOf(states[i]) > newest_gen) newest_gen = GenOf(states[i]), newest = live[i];
  }
  for (size_t i = 0; i < live.size(); ++i) {
    uint64_t s = live[i];
    if (!Readable(StateOf(states[i]))) continue;
    if (s != newest) {  // an older value of an upserted key
      Unlink(s, true, 0);
      continue;
    }
    uint32_t fl = index_->entry(s).flags.load(std::memory_order_relaxed);
    if (!pending_upsert && (fl & kFlagSuperseded)) index_->SetFlags(s, fl & ~kFlagSuperseded);
  }
}

bool MasterImpl::OtherWriting(uint64_t slot, bool newer) const {
  const IndexEntry& e = index_->entry(slot);
  uint64_t gen = GenOf(e.state_gen.load(std::memory_order_acquire));
  if (AloneUnderItsHash(slot)) return false;
  std::vector<uint64_t> live;
  FindLive(KeyOf(slot), e.key_hash.load(std::memory_order_relaxed), &live);
  for (uint64_t s : live) {
    uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    if (s != slot && StateOf(sg) == EntryState::kWriting && (newer ? GenOf(sg) > gen : GenOf(sg) < gen))
      return true;
  }
  return false;
}

bool MasterImpl::OlderUnfinished(uint64_t slot) const { return OtherWriting(slot, false); }

uint64_t MasterImpl::UnlinkOne(uint64_t slot, uint64_t* bytes) {
  Extent ext;  // the size our allocator handed out, not the header's claim
  if (bytes != nullptr && alloc_->Lookup(entry_meta_[slot].extent, &ext)) *bytes += ext.size;
  Unlink(slot, true, 0);
  return 1;
}

bool MasterImpl::AloneUnderItsHash(uint64_t slot) const {
  // FindLive returns a subset of the shadow's slots of the hash: when that
  // is `slot` alone, the key has no other entry (no header read needed).
  // The hash the master filed, not the pool entry's: a rewritten key_hash
  // makes FindLive look elsewhere, so that case takes the long way.
  return index_->ShadowAlone(slot) &&
         index_->entry(slot).key_hash.load(std::memory_order_relaxed) == index_->ShadowHash(slot);
}

uint64_t MasterImpl::UnlinkWithOlder(uint64_t slot, uint64_t* bytes) {
  const IndexEntry& e = index_->entry(slot);
  uint64_t sg = e.state_gen.load(std::memory_order_acquire);
  if (!Readable(StateOf(sg))) return 0;
  if (AloneUnderItsHash(slot)) return UnlinkOne(slot, bytes);  // no older value to take along: no key read
  std::string key(KeyOf(slot));  // a copy: the header goes with the extent
  std::vector<uint64_t> live;
  FindLive(key, e.key_hash.load(std::memory_order_relaxed), &live);
  // One look per entry (see ClearSupersededIfSettled): what was COMPLETE and
  // older here goes; a WRITING one is the caller's to judge (OlderUnfinished).
  std::vector<std::pair<uint64_t, uint64_t>> doomed;  // (generation, slot)
  for (uint64_t s : live) {
    uint64_t osg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    if (s != slot && Readable(StateOf(osg)) && GenOf(osg) < GenOf(sg))
      doomed.emplace_back(GenOf(osg), s);
  }
  std::sort(doomed.begin(), doomed.end());
  doomed.emplace_back(GenOf(sg), slot);  // the newest last
  for (const auto& d : doomed) UnlinkOne(d.second, bytes);
  return doomed.size();
}

EntryState MasterImpl::PendingState(const PendingPut& p) const {
  uint64_t sg = index_->entry(p.entry_slot).state_gen.load(std::memory_order_acquire);
  EntryState st = StateOf(sg);
  if (st == EntryState::kOnDisk) st = EntryState::kComplete;  // completed, then demoted before Tick saw it
  bool ours = GenOf(sg) == p.generation && (st == EntryState::kWriting || st == EntryState::kComplete ||
                                            st == EntryState::kAborted || st == EntryState::kInSegment);
  return ours ? st : EntryState::kEmpty;
}

void MasterImpl::CountComplete(uint64_t entry_slot) {
  EntryMeta& meta = entry_meta_[entry_slot];
  if (!meta.counted) ++stats_.complete_keys;
  meta.counted = true;
}

void MasterImpl::FinishPending(const PendingPut& p, EntryState state) {
  if (state == EntryState::kEmpty) return;  // already unlinked by a remove
  if (state == EntryState::kComplete || state == EntryState::kInSegment) {
    CountComplete(p.entry_slot);
    // Write-through copies it (a segment's bytes are not the master's to read).
    if (tier_ && state == EntryState::kComplete) tier_->OnPutComplete(p.entry_slot);
    if (p.upsert) {
      std::string key(KeyOf(p.entry_slot));
      ClearSupersededIfSettled(key, KeyHash(key));
    }
    return;
  }
  // ABORTED by its client: reclaim now (the client stopped writing first).
  std::string key(KeyOf(p.entry_slot));
  Unlink(p.entry_slot, true, 0);
  if (p.upsert) ClearSupersededIfSettled(key, KeyHash(key));
}

void MasterImpl::RevokePending(const PendingPut& p, bool owner_dead) {
  std::string key(KeyOf(p.entry_slot));
  if (!index_->Abort(p.entry_slot, p.generation)) {
    // The client published it meanwhile (a normal object now), or the entry
    // is no longer this put at all.
    FinishPending(p, PendingState(p));
    return;
  }
  ++stats_.revoked_puts;
  // A live writer may resume and finish the chunk it was copying: its extent
  // is quarantined while its process runs (on this machine: until the pid is
  // gone; a remote one: --put_start_release_timeout_sec).
  const ClientInfo& owner = clients_[p.owner];
  uint64_t pid = owner.attached && owner.local ? owner.pid : 0;
  MCXL_LOG(kInfo, "master", "revoked unfinished put of '%s' (client slot %u %s)%s", key.c_str(), p.owner,
           owner_dead ? "exited" : "unresponsive or too slow",
           owner_dead ? ""
           : pid != 0 ? "; its extent stays reserved until the writer's process exits"
                      : "; its extent stays reserved for --put_start_release_timeout_sec");
  Unlink(p.entry_slot, owner_dead, p.start_mono_ns + config_.put_start_release_timeout_sec * kNsPerSec,
         owner_dead ? 0 : pid);
  if (p.upsert) ClearSupersededIfSettled(key, KeyHash(key));
}

void MasterImpl::ForgetAbandoned(uint32_t slot, const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  // Hash sets: linear in the ids (at most kMaxAbandonedIds) and the pending puts.
  std::unordered_set<uint64_t> given(ids.begin(), ids.end());
  auto& list = clients_[slot].abandoned;
  std::unordered_set<uint64_t> known(list.begin(), list.end());
  for (uint64_t id : ids)
    if (known.insert(id).second) list.push_back(id);
  if (list.size() > 256) list.erase(list.begin(), list.end() - 256);
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingPut p = pending_[i];
    if (p.owner == slot && given.count(p.put_id) != 0) {
      // The client will never write it: revoke and free at once.
      if (PendingState(p) == EntryState::kWriting) RevokePending(p, true);
      else FinishPending(p, PendingState(p));
      continue;
    }
    pending_[keep++] = p;
  }
  pending_.resize(keep);
}

void MasterImpl::CheckPending() {
  // Completion and the discard timeout only; dead clients are found by
  // CheckClients, which revokes their puts with the slot.
  uint64_t now = MonoNs();
  uint64_t discard_ns = config_.put_start_discard_timeout_sec * kNsPerSec;
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingPut p = pending_[i];
    EntryState st = PendingState(p);
    if (st != EntryState::kWriting) {
      FinishPending(p, st);
      continue;
    }
    if (now - p.start_mono_ns > discard_ns) {
      RevokePending(p, false);
      continue;
    }
    pending_[keep++] = p;
  }
  pending_.resize(keep);
  ReleaseQuarantined(now);
}

std::string MasterImpl::HandleSettle(Decoder* d) {
  SettleRequest req;
  TicketReply reply;
  if (!Decode(d, &req) || req.items.size() > kMaxRequestKeys) {
    MCXL_LOG(kWarn, "master", "malformed Settle request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (!ClientValid(req.client)) {
    reply.status = ErrorCode::ILLEGAL_CLIENT;
  } else {
    for (const auto& [key, gen] : req.items) {
      if (key.empty() || key.size() > kMaxKeyLength) {
        MCXL_LOG(kWarn, "master", "Settle of client slot %u: a key of %zu bytes (1..%zu allowed) skipped",
                 req.client.slot, key.size(), size_t(kMaxKeyLength));
        reply.status = ErrorCode::INVALID_PARAMS;
        continue;
      }
      // What Tick does when it notices the completion, now: the older
      // values go (their records get tombstones) once this one is published.
      uint64_t hash = KeyHash(key);
      std::vector<uint64_t> live;
      FindLive(key, hash, &live);
      bool published = false;
      for (uint64_t s : live) {
        uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
        if (GenOf(sg) == gen && Readable(StateOf(sg))) published = true;
      }
      if (published) ClearSupersededIfSettled(key, hash);
      if (tier_) reply.tomb_ticket = std::max(reply.tomb_ticket, tier_->PendingTomb(key));
    }
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

}  // namespace mcxl
