// The SSD tier under the pool, as the master drives it (issue 13).
//
// Contract:
//   * One index for both tiers. An object whose value left the pool keeps its
//     index entry, slot and generation; its state is kOnDisk and its extent
//     shrinks to a stub (ObjectHeader + key + DiskStub naming the record in
//     the segment files, disk_tier.h). Readers find it one-sidedly and read
//     the record themselves (ReadRecord) or ask the master to stage it
//     (kPromote with stage=1).
//   * Demotion: eviction (EvictOrDemote) turns an object with a record on
//     disk kOnDisk at once; one without is queued for the tier thread, which
//     appends it WITHOUT mu_ (the extent is kept while it reads: busy_demote_)
//     and then, under mu_, converts it if it is still the same object. Until
//     then the round counts its bytes as on their way out and a put waiting
//     for room gets OBJECT_REPLICA_BUSY (the client retries). Write-through
//     (--enable_offload without --offload_on_evict) queues a copy after each
//     completed put; eviction then only converts.
//   * Pre-demotion (--offload_ahead_ratio R, with --offload_on_evict; 0 =
//     off): while the pool's bytes without a clean copy exceed R of its
//     capacity, the tier thread (DemoteAhead, when no demotion is queued)
//     samples the index as eviction does, and copies the coldest objects
//     without a record (hard pins never, soft pins last and only when
//     eviction may take them) in ~4 MiB AppendBatch writes, WITHOUT
//     evicting them: the same busy_demote_ protocol and generation check as
//     a demotion, so an object removed or overwritten meanwhile gets a
//     tombstone, never a clean copy. Eviction then only converts.
//   * Eviction ahead of the watermark (EvictAhead, the ring server's idle
//     moments, master_eviction.cc) demotes as an inline round does; bytes
//     queued for demotion (evict_pending_bytes_) count as leaving, so
//     neither it nor a put above the watermark runs a round for them again.
//   * Promotion: kPromote from a reader (every disk read when
//     --promotion_on_hit; the master counts and queues at the threshold) or
//     a stage request; the tier thread allocates an extent, reads the record
//     into it WITHOUT mu_, then links it (kOnDisk -> kComplete, same
//     generation, under the seqlock) if the entry did not change meanwhile.
//     The record stays as a clean copy: a later eviction only converts.
//   * Removal: Unlink drops the slot's record with a tombstone (queued; the
//     tier thread writes it), so a rebuild does not resurrect the key.
//     Durable before acknowledged: every tombstone has a sequence number;
//     the tier thread writes the queued ones in groups (one pwrite each,
//     RemoveBatch) first thing in every round and between its other steps,
//     then publishes the highest written in Superblock::tier_tombs_durable.
//     A remove (batch, remove_all, remove_by_regex) whose key has a
//     tombstone pending gets its seq as a ticket in the reply and the client
//     returns once the pool word reaches it (Client::WaitTombstones; the
//     master thread never waits on the disk). A put or upsert whose key has
//     an older value with a record (or a pending tombstone) is told to
//     settle: after its CAS the client sends kSettle, the master unlinks the
//     older values now and answers with their ticket. Pool-only keys get
//     no ticket and pay nothing. While a newer put of a key is WRITING, its
//     older values are not demoted (the settle flag was decided at PutStart).
//   * Capacity: above --offload_high_watermark_ratio of
//     --offload_capacity_bytes the least recently used kOnDisk objects are
//     dropped (entry and record); an append that still fails marks the
//     object "no disk" and eviction drops it as without a tier.
//   * Groups (ReplicateConfig.group_ids) move together: eviction demotes
//     every member (EvictWithGroup), the tier drops a group whole or not at
//     all, and a promotion (threshold crossed, or a stage request) queues
//     the group's other disk-resident members too (at most kGroupPromoteMax).
//   * Restart: recovery keeps kOnDisk entries whose record the tier still
//     holds (same key and generation); after --format every live record gets
//     a kOnDisk entry again and generations start above MaxGeneration().
//   * Lock order: tier_ (its own locks) is never called under mu_, so its
//     relocation callback may take mu_. Only the tier thread calls tier_
//     after Open.
//
// Atomics follow the three rules stated in master_impl.h.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "master_impl.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {

MasterImpl::~MasterImpl() { StopTier(); }

Status MasterImpl::OpenTier() {
  if (!config_.enable_offload) return ErrorCode::OK;
  if (config_.root_fs_dir.empty()) {
    MCXL_LOG(kError, "master", "--enable_offload needs --root_fs_dir (the directory of the SSD tier)");
    return ErrorCode::INVALID_PARAMS;
  }
  if (config_.root_fs_dir.size() >= sizeof(Superblock::tier_root)) {
    MCXL_LOG(kError, "master", "--root_fs_dir is longer than %zu bytes", sizeof(Superblock::tier_root) - 1);
    return ErrorCode::INVALID_PARAMS;
  }
  if (config_.offload_high_watermark_ratio <= 0 || config_.offload_high_watermark_ratio > 1) {
    MCXL_LOG(kError, "master", "--offload_high_watermark_ratio must be in (0, 1]");
    return ErrorCode::INVALID_PARAMS;
  }
  if (!(config_.offload_ahead_ratio >= 0 && config_.offload_ahead_ratio < 1)) {
    MCXL_LOG(kError, "master", "--offload_ahead_ratio must be in [0, 1) (0 = off)");
    return ErrorCode::INVALID_PARAMS;
  }
  if (config_.offload_ahead_ratio > 0 && !config_.offload_on_evict)
    MCXL_LOG(kInfo, "master", "--offload_ahead_ratio has no effect without --offload_on_evict (write-through "
             "copies every object already)");
  else if (config_.offload_ahead_ratio >= config_.eviction_high_watermark_ratio)
    MCXL_LOG(kWarn, "master", "--offload_ahead_ratio=%.2f is not below --eviction_high_watermark_ratio=%.2f: "
             "eviction will find few clean copies", config_.offload_ahead_ratio,
             config_.eviction_high_watermark_ratio);
  tier::Options o;
  o.root_dir = config_.root_fs_dir;
  o.capacity_bytes = config_.offload_capacity_bytes;
  // Several segments even in a small tier: only sealed segments are
  // compacted, so a tier of one segment could never reclaim its dead records
  // (once full, every append failed). Large tiers keep the default size.
  o.segment_bytes = std::clamp<uint64_t>(config_.offload_capacity_bytes / 8, 1ull << 20, o.segment_bytes);
  auto t = tier::DiskTier::Open(o);
  if (!t) {
    MCXL_LOG(kError, "master", "SSD tier at %s cannot be opened (%s)", config_.root_fs_dir.c_str(),
             ErrorCodeName(t.error()));
    return t.error();
  }
  tier_ = std::move(t.value());
  // Tests only: a pause before each demotion write (the window in which an
  // object may change under its copy), at most 1 s.
  if (const char* d = getenv("MCXL_TEST_TIER_WRITE_DELAY_MS")) test_write_delay_ms_ = std::min(1000ul, strtoul(d, nullptr, 10));
  tier_->SetRelocationCallback(
      [this](std::string_view key, const tier::RecordLocation& from, const tier::RecordLocation& to) {
        // Compaction moved a record (tier thread, without mu_; see Lock order).
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<uint64_t> live;
        FindLive(key, KeyHash(key), &live);
        for (uint64_t s : live) {
          auto it = disk_loc_.find(s);
          if (it == disk_loc_.end() || it->second.segment_id != from.segment_id ||
              it->second.offset != from.offset || it->second.generation != from.generation)
            continue;
          uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
          if (to.segment_id == 0) {  // the record failed its checksum and was dropped
            ++stats_.tier_checksum_failures;
            if (StateOf(sg) == EntryState::kOnDisk) {
              MCXL_LOG(kError, "tier", "record of '%.*s' failed its checksum in compaction: the object is dropped",
                       int(key.size()), key.data());
              Unlink(s, true, 0);
            } else {
              NoteClean(it->second.value_len, false);
              disk_loc_.erase(it);  // a pool object: only its clean copy is gone
            }
            continue;
          }
          it->second = to;
          if (StateOf(sg) != EntryState::kOnDisk) continue;
          Extent ext;
          if (!alloc_->Lookup(entry_meta_[s].extent, &ext)) continue;
          index_->BeginRewrite(s);  // readers holding the old location retry
          WriteStub(ext.offset, entry_meta_[s].key_len, to);
          index_->EndRewrite(s);
        }
      });
  tier_stats_ = tier_->stats();
  MCXL_LOG(kInfo, "master", "SSD tier at %s: %llu records, %llu of %llu bytes used; %s, promotion on hit %s "
           "(threshold %llu)", config_.root_fs_dir.c_str(), (unsigned long long)tier_stats_.objects,
           (unsigned long long)tier_stats_.used_bytes, (unsigned long long)config_.offload_capacity_bytes,
           !config_.offload_on_evict ? "write-through after each put"
           : config_.offload_ahead_ratio > 0 ? "offload on eviction, clean copies ahead of it"
                                              : "offload on eviction",
           config_.promotion_on_hit ? "on" : "off", (unsigned long long)config_.promotion_admission_threshold);
  return ErrorCode::OK;
}

void MasterImpl::PublishTier() {
  Superblock* sb = pool_->superblock();
  memset(sb->tier_root, 0, sizeof(sb->tier_root));
  uint64_t cfg = 0;
  if (tier_) {
    memcpy(sb->tier_root, config_.root_fs_dir.data(), config_.root_fs_dir.size());
    cfg = kTierEnabled | (config_.promotion_on_hit ? kTierPromotionOnHit : 0) |
          (std::min<uint64_t>(config_.promotion_admission_threshold, 0xffffffffu) << 32);
  }
  // Relaxed + publish: read by clients at attach, after the incarnation
  // bump that follows (release) in AdoptPool.
  sb->tier_config.store(cfg, std::memory_order_relaxed);
  PublishRange(&sb->tier_config, sizeof(uint64_t) + sizeof(sb->tier_root));
}

void MasterImpl::WakeTier() {
  {
    std::lock_guard<std::mutex> l(tier_wake_mu_);
    tier_wake_ = true;
  }
  tier_cv_.notify_one();
}

void MasterImpl::StopTier() {
  if (!tier_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(tier_wake_mu_);
    tier_stop_ = true;
  }
  tier_cv_.notify_one();
  tier_thread_.join();
}

void MasterImpl::WriteStub(uint64_t stub_offset, uint64_t key_len, const tier::RecordLocation& loc) {
  auto* st = pool_->At<DiskStub>(stub_offset + ObjectHeaderBytes(key_len));
  st->magic = kDiskStubMagic;
  st->segment_id = loc.segment_id;
  st->crc32c = loc.crc32c;
  st->record_offset = loc.offset;
  st->value_len = loc.value_len;
  st->generation = loc.generation;
  st->key_len = uint32_t(key_len);
  st->reserved = 0;
  st->disk_reads.store(0, std::memory_order_relaxed);  // statistic
  PublishRange(st, sizeof(DiskStub));
}

void MasterImpl::QueueDemote(uint64_t slot, bool evict) {
  auto it = demote_queued_.find(slot);
  if (it != demote_queued_.end()) {
    it->second = it->second || evict;
    return;
  }
  uint64_t sg = index_->entry(slot).state_gen.load(std::memory_order_acquire);
  demote_queued_[slot] = evict;
  demote_q_.push_back({slot, sg, evict});
  WakeTier();
}

uint64_t MasterImpl::EvictOrDemote(uint64_t slot, uint64_t* bytes) {
  if (!tier_ || evict_drop_) return UnlinkWithOlder(slot, bytes);
  const IndexEntry& e = index_->entry(slot);
  uint64_t sg = e.state_gen.load(std::memory_order_acquire);
  if (StateOf(sg) != EntryState::kComplete) return 0;
  // An unsettled upsert leaves older values: those go as without a tier
  // (the newest stays readable, from the tier).
  std::vector<uint64_t> live;
  FindLive(KeyOf(slot), e.key_hash.load(std::memory_order_relaxed), &live);
  for (uint64_t s : live)
    if (s != slot && Readable(StateOf(index_->entry(s).state_gen.load(std::memory_order_acquire))) &&
        GenOf(index_->entry(s).state_gen.load(std::memory_order_relaxed)) < GenOf(sg))
      return UnlinkWithOlder(slot, bytes);
  auto it = disk_loc_.find(slot);
  if (it != disk_loc_.end()) {
    if (!ConvertToDisk(slot, it->second, bytes)) return 0;
    ++stats_.demotions_clean;  // its copy was there: nothing written on the put path
    return 1;
  }
  auto nd = no_disk_.find(slot);
  if (nd != no_disk_.end() && nd->second == sg) return UnlinkWithOlder(slot, bytes);
  if (NewerWriting(slot)) {  // an upsert in flight decided without a record of this value: later
    round_blocked_transiently_ = true;
    return 0;
  }
  if (config_.offload_force_evict && demote_queued_.count(slot) == 0 &&
      demote_q_.size() >= config_.offloading_queue_limit) {
    ++stats_.offload_skipped;  // the disk is behind: evicted as without a tier
    return UnlinkWithOlder(slot, bytes);
  }
  // On its way to the disk: its bytes count for this round, so that a round
  // queues about what it needs, not every candidate it sees.
  Extent ext;
  if (alloc_->Lookup(entry_meta_[slot].extent, &ext)) {
    if (bytes != nullptr) *bytes += ext.size;
    if (evict_pending_.emplace(slot, ext.size).second) evict_pending_bytes_ += ext.size;
  }
  QueueDemote(slot, true);
  round_blocked_transiently_ = true;
  return 0;
}

bool MasterImpl::ConvertToDisk(uint64_t slot, const tier::RecordLocation& loc, uint64_t* bytes) {
  IndexEntry& e = index_->entry(slot);
  uint64_t sg = e.state_gen.load(std::memory_order_acquire);
  if (StateOf(sg) != EntryState::kComplete || !CheckedLive(slot)) return false;
  if (loc.generation != GenOf(sg)) return false;
  EntryMeta& m = entry_meta_[slot];
  Extent ext;
  if (!alloc_->Lookup(m.extent, &ext) || m.extent == busy_handle_ || busy_demote_.count(m.extent))
    return false;
  if (index_->LeaseUntil(slot) > NowNs()) return false;  // a reader just took it: keep it (clean copy stays)
  const ObjectHeader* h = HeaderOf(slot);
  ObjectHeaderFields f;
  f.key_hash = e.key_hash.load(std::memory_order_relaxed);
  f.generation = GenOf(sg);
  f.value_size = e.value_size.load(std::memory_order_relaxed);
  uint64_t stub_bytes = ExtentBytes(m.key_len, sizeof(DiskStub));
  f.put_time_ns = h->put_time_ns;  // values only (see HeaderOf)
  f.group_hash = h->group_hash;
  f.soft_pin_ttl_ms = h->soft_pin_ttl_ms;
  f.flags = (h->flags & (kFlagHardPin | kFlagSoftPin)) | kFlagDiskStub;
  std::string key(KeyOf(slot));
  // The stub gets its own small extent: stubs left inside the freed
  // extents would cut the pool into holes just too small for the next
  // object of the same size. (Small extents pack together: TLSF good fit.)
  // Only when none is free does the object's own extent shrink to it.
  auto stub = alloc_->Allocate(stub_bytes);
  uint64_t stub_offset = stub ? stub->offset : ext.offset;
  f.extent_size = stub ? stub->size : std::min(stub_bytes, ext.size);
  // Odd version first, then the pins (the Dekker pair of ScanPins with
  // PinValue's pin store + version re-check): a view taken meanwhile wins.
  index_->BeginRewrite(slot);
  if (IsPinned(GenOf(sg))) {
    index_->EndRewrite(slot);
    if (stub) (void)alloc_->Free(stub->handle);
    return false;
  }
  WriteObjectHeader(*pool_, stub_offset, f, key);
  WriteStub(stub_offset, m.key_len, loc);
  e.object_offset.store(stub_offset, std::memory_order_relaxed);
  e.state_gen.store(PackStateGen(GenOf(sg), EntryState::kOnDisk), std::memory_order_relaxed);
  index_->EndRewrite(slot);
  uint64_t kept = 0;
  if (stub) {  // after the version bump: readers of the old bytes retry
    (void)alloc_->Free(m.extent);
    m.extent = stub->handle;
    kept = stub->size;
  } else {
    (void)alloc_->Shrink(m.extent, stub_bytes);
    Extent after;
    kept = alloc_->Lookup(m.extent, &after) ? after.size : stub_bytes;
  }
  if (bytes != nullptr) *bytes += ext.size > kept ? ext.size - kept : 0;
  NoteClean(loc.value_len, false);  // no longer a pool object
  ResolvePending(slot);
  ++disk_objects_;
  ++stats_.demotions;
  return true;
}

void MasterImpl::ResolvePending(uint64_t slot) {
  auto it = evict_pending_.find(slot);
  if (it == evict_pending_.end()) return;
  evict_pending_bytes_ -= std::min(evict_pending_bytes_, it->second);
  evict_pending_.erase(it);
}

void MasterImpl::ForgetDiskCopy(uint64_t slot, uint64_t generation) {
  ResolvePending(slot);  // unlinked: its bytes are free now
  uint64_t sg = index_->entry(slot).state_gen.load(std::memory_order_relaxed);
  if (StateOf(sg) == EntryState::kOnDisk && disk_objects_ > 0) --disk_objects_;
  promote_count_.erase(slot);
  no_disk_.erase(slot);
  auto it = disk_loc_.find(slot);
  if (it == disk_loc_.end()) {
    // Being appended right now (a demotion batch): its record lands before
    // the tier thread's next tombstone flush, which then hides it.
    if (entry_meta_[slot].live && busy_demote_.count(entry_meta_[slot].extent))
      QueueTombstone(std::string(KeyOf(slot)), generation);
    return;
  }
  if (StateOf(sg) != EntryState::kOnDisk) NoteClean(it->second.value_len, false);
  disk_loc_.erase(it);
  QueueTombstone(std::string(KeyOf(slot)), generation);
}

void MasterImpl::QueueTombstone(std::string key, uint64_t generation) {
  uint64_t seq = ++tomb_queued_;
  tomb_pending_[key] = seq;
  tier_removals_.push_back({std::move(key), generation, seq});
  WakeTier();
}

uint64_t MasterImpl::PendingTomb(std::string_view key) const {
  if (tomb_pending_.empty()) return 0;
  auto it = tomb_pending_.find(std::string(key));
  return it == tomb_pending_.end() ? 0 : it->second;
}

bool MasterImpl::FlushTombstones() {
  std::vector<TierRemoval> batch;
  uint64_t upto = 0;  // every tombstone queued so far is in `batch` or written before
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tier_removals_.empty()) return false;
    batch.swap(tier_removals_);
    upto = tomb_queued_;
  }
  // Test hook (tests/test_tier_tombstones.py): a slow tier, so that a reply
  // sent before its tombstone is written would lose the race for sure.
  static const uint64_t delay_ms = [] {
    const char* v = getenv("MCXL_TIER_TEST_TOMB_DELAY_MS");
    return v != nullptr ? strtoull(v, nullptr, 10) : 0ull;
  }();
  if (delay_ms != 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  std::vector<std::pair<std::string_view, uint64_t>> items;
  items.reserve(batch.size());
  for (const TierRemoval& r : batch) items.emplace_back(r.key, r.generation);
  std::vector<Status> st = tier_->RemoveBatch(items);  // group commit: one pwrite per ~4 MiB
  std::lock_guard<std::mutex> lock(mu_);
  // Durable up to just before the first failure; failures are retried next
  // round (in front: older tickets first).
  std::vector<TierRemoval> again;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (st[i].ok() || st[i].error() == ErrorCode::INVALID_PARAMS) continue;
    if (batch[i].seq != 0) upto = std::min(upto, batch[i].seq - 1);
    uint64_t now = MonoNs();
    if (now - tomb_fail_log_mono_ > kNsPerSec) {
      tomb_fail_log_mono_ = now;
      MCXL_LOG(kWarn, "tier", "tombstone of '%s' not written (%s); retried (its remove waits)", batch[i].key.c_str(),
               ErrorCodeName(st[i].error()));
    }
    again.push_back(batch[i]);
  }
  for (const TierRemoval& r : batch) {
    auto p = tomb_pending_.find(r.key);
    if (p != tomb_pending_.end() && p->second <= upto) tomb_pending_.erase(p);
  }
  if (!again.empty()) tier_removals_.insert(tier_removals_.begin(), again.begin(), again.end());
  Superblock* sb = pool_->superblock();
  if (upto > sb->tier_tombs_durable.load(std::memory_order_relaxed)) {
    // Release: a client that reads it (acquire) and returns orders its later
    // operations after the writes above (which a SIGKILL does not undo).
    sb->tier_tombs_durable.store(upto, std::memory_order_release);
    PublishRange(&sb->tier_tombs_durable, sizeof(uint64_t));
  }
  return again.size() < batch.size();
}

bool MasterImpl::OlderHasRecord(std::string_view key, uint64_t hash, uint64_t generation) const {
  std::vector<uint64_t> live;
  FindLive(key, hash, &live);
  for (uint64_t s : live) {
    uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    if (GenOf(sg) >= generation) continue;
    if (disk_loc_.count(s) || demote_queued_.count(s) || busy_demote_.count(entry_meta_[s].extent)) return true;
  }
  return false;
}

bool MasterImpl::NewerWriting(uint64_t slot) const { return OtherWriting(slot, true); }

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
      if (tier_) reply.tomb_ticket = std::max(reply.tomb_ticket, PendingTomb(key));
    }
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

std::string MasterImpl::HandlePromote(Decoder* d) {
  PromoteRequest req;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed Promote request rejected");
    return StatusReply(ErrorCode::INVALID_PARAMS);
  }
  if (!ClientValid(req.client)) return StatusReply(ErrorCode::ILLEGAL_CLIENT);
  if (!tier_) return StatusReply(ErrorCode::NOT_SUPPORTED);
  if (req.key.empty() || req.key.size() > kMaxKeyLength) return StatusReply(ErrorCode::INVALID_PARAMS);
  std::vector<uint64_t> live;
  FindLive(req.key, KeyHash(req.key), &live);
  for (uint64_t s : live) {
    uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
    if (GenOf(sg) != req.generation) continue;
    if (StateOf(sg) != EntryState::kOnDisk) return StatusReply(ErrorCode::OK);  // already in the pool
    if (!req.stage) {
      // A disk read: counted toward admission.
      ++stats_.disk_hits_reported;
      if (!config_.promotion_on_hit) return StatusReply(ErrorCode::OK);
      auto& c = promote_count_[s];
      if (c.first != sg) c = {sg, 0};
      if (++c.second < config_.promotion_admission_threshold) return StatusReply(ErrorCode::OK);
    }
    QueuePromoteWithGroup(s, sg);
    return StatusReply(ErrorCode::OK);
  }
  return StatusReply(ErrorCode::OBJECT_NOT_FOUND);
}

void MasterImpl::NoteClean(uint64_t value_len, bool add) {
  if (add) pool_clean_bytes_ += value_len;
  else pool_clean_bytes_ -= std::min(pool_clean_bytes_, value_len);
}

uint64_t MasterImpl::PoolDirtyBytes() const {
  uint64_t used = alloc_->used_bytes();
  return used - std::min(used, pool_clean_bytes_);
}

bool MasterImpl::AheadWanted() const {
  if (!tier_ || !config_.offload_on_evict || config_.offload_ahead_ratio <= 0 || pool_lost_) return false;
  return PoolDirtyBytes() > uint64_t(config_.offload_ahead_ratio * double(alloc_->capacity()));
}

void MasterImpl::AddToDemoteBatch(const DemoteJob& job, std::vector<DemoteItem>* batch, uint64_t* batch_bytes) {
  const IndexEntry& e = index_->entry(job.slot);
  const EntryMeta& m = entry_meta_[job.slot];
  Extent ext;
  if (!alloc_->Lookup(m.extent, &ext) || busy_demote_.count(m.extent) || m.extent == busy_handle_) return;
  uint64_t len = e.value_size.load(std::memory_order_relaxed);  // CheckedLive: fits the extent
  batch->push_back({job, std::string(KeyOf(job.slot)), pool_->base() + ext.offset + ObjectHeaderBytes(m.key_len),
                    len, m.extent});
  busy_demote_[m.extent] = false;
  *batch_bytes += len;
}

void MasterImpl::QueuePromoteWithGroup(uint64_t slot, uint64_t state_gen) {
  auto queue = [this](uint64_t s, uint64_t sg) {
    if (promote_queued_.count(s) != 0) return;
    promote_queued_[s] = sg;
    promote_q_.push_back({s, sg});
  };
  queue(slot, state_gen);
  // Its group (K and V, TP shards: put with one group id) comes back with
  // it, as eviction takes them out together: the members still on disk,
  // at most kGroupPromoteMax of them (a huge group must not flood the queue).
  auto gi = group_of_.find(slot);
  if (gi != group_of_.end()) {
    auto it = groups_.find(gi->second);
    size_t n = 0;
    if (it != groups_.end())
      for (uint64_t m : it->second) {
        if (m == slot || !entry_meta_[m].live || disk_loc_.count(m) == 0) continue;
        uint64_t msg = index_->entry(m).state_gen.load(std::memory_order_acquire);
        if (StateOf(msg) != EntryState::kOnDisk) continue;
        if (++n > kGroupPromoteMax) break;
        queue(m, msg);
        ++stats_.group_promotions;
      }
  }
  WakeTier();
}

void MasterImpl::DropGroupOf(uint64_t slot) {
  std::vector<uint64_t> members = GroupMembers(slot);
  if (members.size() < 2) return;
  uint64_t n = 0;
  for (uint64_t m : members)
    if (entry_meta_[m].live && Readable(StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire))))
      n += UnlinkWithOlder(m, nullptr);
  stats_.evicted_keys += n;
}

bool MasterImpl::GroupDropsWhole(const std::vector<uint64_t>& members) const {
  if (!tier_) return false;
  for (uint64_t m : members) {
    if (!entry_meta_[m].live) continue;
    uint64_t sg = index_->entry(m).state_gen.load(std::memory_order_acquire);
    if (StateOf(sg) != EntryState::kComplete) continue;
    auto nd = no_disk_.find(m);
    if (nd != no_disk_.end() && nd->second == sg) return true;
  }
  return false;
}

uint64_t MasterImpl::DropFromTierWithGroup(uint64_t slot, uint64_t now, uint64_t* bytes) {
  std::vector<uint64_t> members = GroupMembers(slot);
  // Together or not at all (as EvictWithGroup): a member a reader holds,
  // hard-pinned or unfinished keeps the whole group.
  for (uint64_t m : members) {
    if (!entry_meta_[m].live) continue;
    const IndexEntry& e = index_->entry(m);
    EntryState st = StateOf(e.state_gen.load(std::memory_order_acquire));
    if (!Readable(st)) return 0;
    if ((e.flags.load(std::memory_order_relaxed) & kFlagHardPin) || index_->LeaseUntil(m) > now) return 0;
    if (st == EntryState::kComplete && IsPinned(GenOf(e.state_gen.load(std::memory_order_relaxed)))) return 0;
  }
  uint64_t n = 0;
  for (uint64_t m : members) {
    if (!entry_meta_[m].live || !Readable(StateOf(index_->entry(m).state_gen.load(std::memory_order_acquire))))
      continue;
    if (bytes != nullptr) *bytes += index_->entry(m).value_size.load(std::memory_order_relaxed);
    n += UnlinkWithOlder(m, nullptr);  // its record goes with it (ForgetDiskCopy)
  }
  return n;
}

bool MasterImpl::DemoteBatch() {
  // Taken together: up to kBatchBytes of queued jobs under one mu_, one
  // AppendBatch (one pwrite per ~4 MiB), one mu_ pass converting them.
  constexpr uint64_t kBatchBytes = 4ull << 20;
  constexpr size_t kBatchJobs = 512;
  std::vector<DemoteItem> batch;
  uint64_t batch_bytes = 0;
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (demote_q_.empty() || pool_lost_) return false;
    size_t taken = 0;
    for (; taken < demote_q_.size() && batch_bytes < kBatchBytes && batch.size() < kBatchJobs; ++taken) {
      DemoteJob job = demote_q_[taken];
      auto q = demote_queued_.find(job.slot);
      if (q != demote_queued_.end()) {
        job.evict = job.evict || q->second;
        demote_queued_.erase(q);
      }
      const IndexEntry& e = index_->entry(job.slot);
      if (e.state_gen.load(std::memory_order_acquire) != job.state_gen ||
          StateOf(job.state_gen) != EntryState::kComplete || !entry_meta_[job.slot].live || !CheckedLive(job.slot)) {
        if (e.state_gen.load(std::memory_order_acquire) == job.state_gen) ResolvePending(job.slot);
        continue;  // gone or changed since it was queued
      }
      auto have = disk_loc_.find(job.slot);
      if (have != disk_loc_.end()) {  // copied already (write-through, ahead, or promoted)
        if (job.evict) {
          uint64_t b = 0;
          (void)ConvertToDisk(job.slot, have->second, &b);
        }
        ResolvePending(job.slot);
        continue;
      }
      if (NewerWriting(job.slot)) continue;  // an upsert decided its settle without this record
      if (tier_full_ && job.evict) {  // no room even after dropping the tier's LRU: evict as without a tier
        no_disk_[job.slot] = job.state_gen;
        ResolvePending(job.slot);
        DropGroupOf(job.slot);  // its group was evicted with it: not split across the tiers
        continue;
      }
      size_t had = batch.size();
      AddToDemoteBatch(job, &batch, &batch_bytes);
      if (batch.size() == had) ResolvePending(job.slot);  // its extent is busy elsewhere: eviction queues it again
    }
    demote_q_.erase(demote_q_.begin(), demote_q_.begin() + taken);
    more = true;  // jobs were taken: the loop comes back for the rest
  }
  if (batch.empty()) return more;
  WriteDemoteBatch(&batch, false);
  return true;
}

bool MasterImpl::DemoteAhead() {
  // Per call under mu_: at most kScanSlots index slots scanned, one window
  // of candidates walked, kBatchBytes / kBatchJobs taken; the write is
  // WriteDemoteBatch's (without mu_). The extents of a batch stay allocated
  // until it is written, even when their objects go meanwhile: at most
  // 1/32 of a small pool.
  constexpr size_t kBatchJobs = 512;
  constexpr uint64_t kScanSlots = 65536;
  constexpr uint64_t kWindow = 4096;          // COMPLETE entries per sample, as eviction's
  constexpr uint64_t kSoftLast = 1ull << 63;  // soft-pinned members sort after all others
  std::vector<DemoteItem> batch;
  uint64_t batch_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!AheadWanted() || tier_full_) {
      pre_kicked_ = false;  // the next put past the threshold wakes us again
      return false;
    }
    uint64_t mono = MonoNs();
    // Eviction's demotions first; after an empty sample or a failed write,
    // not before pre_retry_mono_ (TierLoop polls: pre_kicked_ stays set).
    if (!demote_q_.empty() || mono < pre_retry_mono_) return false;
    // Background work: while puts arrive (one in the last kQuietNs) the
    // copies wait for a pause, which leaves the CPU (a copy costs a memcpy
    // and a crc of every byte) to the puts, unless they fall behind: dirty
    // bytes past halfway from the threshold to the watermark.
    constexpr uint64_t kQuietNs = 1000000;
    const uint64_t threshold = uint64_t(config_.offload_ahead_ratio * double(alloc_->capacity()));
    uint64_t high = uint64_t(config_.eviction_high_watermark_ratio * double(alloc_->capacity()));
    uint64_t urgent = threshold + (high > threshold ? (high - threshold) / 2 : 0);
    if (mono - last_put_mono_ < kQuietNs && PoolDirtyBytes() < urgent) {
      pre_retry_mono_ = last_put_mono_ + kQuietNs;
      return false;
    }
    uint64_t cap = index_->capacity();
    uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
    uint64_t now = NowNs();
    // A sorted window is used until spent or older than a lease (<= 1 s):
    // objects put since are newer than all of it; ones read since are
    // skipped below (their last access moved).
    if (pre_next_ != SIZE_MAX &&
        (pre_next_ >= pre_window_.size() || mono - pre_sampled_mono_ > std::min<uint64_t>(ttl, kNsPerSec))) {
      pre_window_.clear();
      pre_next_ = SIZE_MAX;
      pre_scanned_ = pre_complete_ = 0;
    }
    if (pre_next_ == SIZE_MAX) {
      if (pre_scanned_ == 0) {  // a new sample, from a random point (as EvictRound)
        pre_start_ = RandomSlot();
        pre_window_.clear();
      }
      for (uint64_t n = 0; n < kScanSlots && pre_scanned_ < cap && pre_complete_ < kWindow; ++n) {
        uint64_t slot = (pre_start_ + pre_scanned_++) & (cap - 1);
        uint64_t sg = index_->entry(slot).state_gen.load(std::memory_order_acquire);
        // The object header is checked (CheckedLive) only when a candidate
        // is taken below: here, the master's own record is enough.
        if (StateOf(sg) != EntryState::kComplete || !entry_meta_[slot].live) continue;
        ++pre_complete_;
        if (disk_loc_.count(slot) != 0) continue;  // clean already
        // Eviction's rules: hard pins never leave the pool; soft pins only
        // in its second pass, when allowed.
        if (index_->entry(slot).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
        bool soft = SoftPinActive(slot, now);
        if (soft && !config_.allow_evict_soft_pinned_objects) continue;
        pre_window_.push_back({(soft ? kSoftLast : 0) | LastAccessNs(slot, ttl), slot, sg});
      }
      if (pre_scanned_ < cap && pre_complete_ < kWindow) return true;  // more on the next call
      std::sort(pre_window_.begin(), pre_window_.end());
      pre_next_ = 0;
      pre_sampled_mono_ = mono;
    }
    uint64_t dirty = PoolDirtyBytes();
    const uint64_t kBatchBytes = std::clamp<uint64_t>(alloc_->capacity() / 32, 256ull << 10, 4ull << 20);
    while (pre_next_ < pre_window_.size() && batch_bytes < kBatchBytes && batch.size() < kBatchJobs &&
           dirty > threshold + batch_bytes) {
      const AheadCandidate c = pre_window_[pre_next_++];
      uint64_t s = c.slot;
      // Still the object sampled, still without a record or a demotion in
      // flight, not read since (then it is not among the coldest), and not
      // an upsert with an older value of its key still there (eviction
      // drops those; an older generation would not even append).
      if (s >= cap || index_->entry(s).state_gen.load(std::memory_order_acquire) != c.state_gen ||
          !entry_meta_[s].live || !CheckedLive(s))
        continue;
      if (disk_loc_.count(s) != 0 || demote_queued_.count(s) != 0 || no_disk_.count(s) != 0) continue;
      if (LastAccessNs(s, ttl) != (c.last_access & ~kSoftLast)) continue;
      if (index_->entry(s).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
      std::vector<uint64_t> live;
      FindLive(KeyOf(s), index_->entry(s).key_hash.load(std::memory_order_relaxed), &live);
      bool alone = true;
      for (uint64_t o : live)
        if (o != s && Readable(StateOf(index_->entry(o).state_gen.load(std::memory_order_acquire)))) alone = false;
      if (!alone || NewerWriting(s)) continue;  // (an upsert being written decides its settle without a record)
      AddToDemoteBatch({s, c.state_gen, false}, &batch, &batch_bytes);
    }
    if (batch.empty() && pre_next_ >= pre_window_.size()) {
      // A spent window with nothing to copy: the next sample may find some,
      // unless this one covered the whole index (then wait a little: the
      // dirty bytes are unfinished puts, pinned or just read objects).
      if (pre_scanned_ >= cap) pre_retry_mono_ = mono + 5 * 1000000ull;
      return pre_scanned_ < cap;
    }
  }
  if (batch.empty()) return true;
  WriteDemoteBatch(&batch, true);
  return true;
}

void MasterImpl::WriteDemoteBatch(std::vector<DemoteItem>* batch_in, bool ahead) {
  std::vector<DemoteItem>& batch = *batch_in;
  // The bytes are stable: the objects are COMPLETE and their extents are kept for us.
  std::vector<tier::DiskTier::BatchItem> items;
  items.reserve(batch.size());
  for (const DemoteItem& it : batch) items.push_back({it.key, it.src, it.len, GenOf(it.job.state_gen)});
  if (test_write_delay_ms_ != 0) std::this_thread::sleep_for(std::chrono::milliseconds(test_write_delay_ms_));
  auto locs = tier_->AppendBatch(items);
  tier::Stats ts = tier_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  tier_stats_ = ts;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DemoteItem& it = batch[i];
    const DemoteJob& job = it.job;
    auto bd = busy_demote_.find(it.handle);
    bool freed = bd != busy_demote_.end() && bd->second;
    if (bd != busy_demote_.end()) busy_demote_.erase(bd);
    if (freed) {  // unlinked while we read: the free Unlink left to us
      if (IsPinned(GenOf(job.state_gen))) pinned_.push_back({it.handle, GenOf(job.state_gen)});
      else (void)alloc_->Free(it.handle);
    }
    bool same = index_->entry(job.slot).state_gen.load(std::memory_order_acquire) == job.state_gen &&
                entry_meta_[job.slot].live && entry_meta_[job.slot].extent == it.handle;
    if (!ahead && same) ResolvePending(job.slot);  // converted below, or marked no_disk_
    const auto& loc = locs[i];
    if (!loc) {
      ++stats_.demotion_failures;
      // A copy ahead of eviction that failed: eviction tries again itself
      // (and drops the object when that fails too); meanwhile no more ahead.
      if (ahead) {
        pre_retry_mono_ = MonoNs() + 100 * 1000000ull;
      } else {
        if (same) no_disk_[job.slot] = job.state_gen;
        if (same && job.evict) DropGroupOf(job.slot);  // as above
      }
      uint64_t now = MonoNs();
      if (now - tier_full_log_mono_ > kNsPerSec) {
        tier_full_log_mono_ = now;
        MCXL_LOG(kWarn, "tier", "append of '%s' (%llu bytes) to the SSD tier failed (%s); %s", it.key.c_str(),
                 (unsigned long long)it.len, ErrorCodeName(loc.error()),
                 ahead ? "eviction will try again" : "eviction drops it");
      }
      if (loc.error() == ErrorCode::NO_AVAILABLE_HANDLE) tier_full_ = true;
      continue;
    }
    ++stats_.tier_writes;
    if (ahead) ++stats_.tier_ahead_writes;
    if (!same) {  // removed or replaced meanwhile: the record must not come back
      ++stats_.tier_stale_copies;
      QueueTombstone(it.key, GenOf(job.state_gen));
      continue;
    }
    disk_loc_[job.slot] = *loc;
    NoteClean(loc->value_len, true);  // a COMPLETE object (same): a clean copy now
    if (job.evict) {
      uint64_t b = 0;
      (void)ConvertToDisk(job.slot, *loc, &b);
    }
  }
}

bool MasterImpl::PromoteOne() {
  PromoteJob job{};
  std::string key;
  tier::RecordLocation loc{};
  Extent ext{};
  uint64_t value_size = 0;
  uint32_t key_len = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (promote_q_.empty() || pool_lost_) return false;
    job = promote_q_.front();
    promote_q_.erase(promote_q_.begin());
    promote_queued_.erase(job.slot);
    IndexEntry& e = index_->entry(job.slot);
    auto it = disk_loc_.find(job.slot);
    if (e.state_gen.load(std::memory_order_acquire) != job.state_gen || it == disk_loc_.end() ||
        !entry_meta_[job.slot].live || !CheckedLive(job.slot))
      return true;
    loc = it->second;
    key.assign(KeyOf(job.slot));
    key_len = entry_meta_[job.slot].key_len;
    value_size = e.value_size.load(std::memory_order_relaxed);
    uint64_t need = ExtentBytes(key_len, value_size);
    uint64_t cap = alloc_->capacity();
    uint64_t high = uint64_t(config_.eviction_high_watermark_ratio * double(cap));
    // Room under the watermark first (eviction converts objects that have a
    // record at once; others are queued and this promotion waits for a later read).
    if (alloc_->used_bytes() + need > high)
      (void)EvictRound(alloc_->used_bytes() + need - high, 0, "promotion");
    auto a = alloc_->used_bytes() + need <= high ? alloc_->Allocate(need) : Result<Extent>(ErrorCode::NO_AVAILABLE_HANDLE);
    if (!a) {
      // Demotions queued by the round above free room shortly: try again
      // (a stage request waits for it) for about 20 s of tier-loop rounds.
      if (++job.attempts < 400) {
        promote_queued_[job.slot] = job.state_gen;
        promote_q_.push_back(job);
      } else {
        ++stats_.promotion_failures;
      }
      return false;
    }
    ext = *a;
    const ObjectHeader* h = HeaderOf(job.slot);
    ObjectHeaderFields f;
    f.key_hash = e.key_hash.load(std::memory_order_relaxed);
    f.generation = GenOf(job.state_gen);
    f.value_size = value_size;
    f.extent_size = ext.size;
    f.put_time_ns = h->put_time_ns;
    f.group_hash = h->group_hash;
    f.soft_pin_ttl_ms = h->soft_pin_ttl_ms;
    f.flags = h->flags & (kFlagHardPin | kFlagSoftPin);
    WriteObjectHeader(*pool_, ext.offset, f, key);
  }
  // The new extent is ours alone until linked.
  Status st = tier::ReadRecord(config_.root_fs_dir, loc, key, pool_->base() + ext.offset + ObjectHeaderBytes(key_len),
                               value_size);
  std::lock_guard<std::mutex> lock(mu_);
  IndexEntry& e = index_->entry(job.slot);
  auto it = disk_loc_.find(job.slot);
  bool same = e.state_gen.load(std::memory_order_acquire) == job.state_gen && it != disk_loc_.end() &&
              it->second.segment_id == loc.segment_id && it->second.offset == loc.offset &&
              entry_meta_[job.slot].live;
  if (!st.ok() || !same) {
    (void)alloc_->Free(ext.handle);
    ++stats_.promotion_failures;
    if (!st.ok() && same) {
      // The record is unreadable (checksum, or gone): the object is lost;
      // its entry goes (a miss from now on, never wrong bytes).
      ++stats_.tier_checksum_failures;
      MCXL_LOG(kError, "tier", "record of '%s' cannot be read back (%s): the object is dropped", key.c_str(),
               ErrorCodeName(st.error()));
      Unlink(job.slot, true, 0);
    }
    return true;
  }
  PublishRange(pool_->base() + ext.offset, ext.size);
  EntryMeta& m = entry_meta_[job.slot];
  uint64_t stub = m.extent;
  index_->BeginRewrite(job.slot);
  e.object_offset.store(ext.offset, std::memory_order_relaxed);
  e.put_time_ns.store(NowNs(), std::memory_order_relaxed);  // fresh in the pool's LRU
  e.state_gen.store(PackStateGen(GenOf(job.state_gen), EntryState::kComplete), std::memory_order_relaxed);
  index_->EndRewrite(job.slot);
  m.extent = ext.handle;
  (void)alloc_->Free(stub);  // after the version bump: stub readers retry
  if (disk_objects_ > 0) --disk_objects_;
  NoteClean(loc.value_len, true);  // a pool object again, its record a clean copy
  promote_count_.erase(job.slot);
  ++stats_.promotions;
  return true;
}

bool MasterImpl::TierHousekeeping() {
  bool over = false;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t cap = config_.offload_capacity_bytes;
    uint64_t high = uint64_t(config_.offload_high_watermark_ratio * double(cap));
    over = tier_stats_.live_bytes > high || tier_full_;
    if (over) {
      // Drop the tier's least recently used objects down to 90% of the
      // watermark (entries and records): sampled like the pool's eviction.
      uint64_t low = uint64_t(0.9 * double(high));
      target = tier_stats_.live_bytes > low ? tier_stats_.live_bytes - low : 0;
      if (tier_full_) target = std::max<uint64_t>(target, cap / 20);
      uint64_t ttl = config_.default_kv_lease_ttl_ms * 1000000ull;
      uint64_t now = NowNs();
      std::vector<std::pair<uint64_t, uint64_t>> cand;  // (last access, slot)
      // Bounded under mu_: at most kTierLruVisits entries per turn (skipped
      // pinned/leased ones count too), from a bucket that rotates between turns.
      constexpr size_t kTierLruVisits = 16384;
      const size_t nb = disk_loc_.bucket_count();
      size_t visited = 0, k = 0;
      for (; k < nb && visited < kTierLruVisits && cand.size() < 4096; ++k) {
        size_t b = (tier_lru_bucket_ + k) % nb;
        for (auto it = disk_loc_.begin(b); it != disk_loc_.end(b); ++it) {
          ++visited;
          uint64_t s = it->first;
          uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
          if (StateOf(sg) != EntryState::kOnDisk) continue;
          if (index_->entry(s).flags.load(std::memory_order_relaxed) & kFlagHardPin) continue;
          if (index_->LeaseUntil(s) > now) continue;
          cand.emplace_back(LastAccessNs(s, ttl), s);
        }
      }
      tier_lru_bucket_ = nb == 0 ? 0 : (tier_lru_bucket_ + k) % nb;
      std::sort(cand.begin(), cand.end());
      uint64_t dropped = 0, n = 0;
      for (const auto& c : cand) {
        if (dropped >= target) break;
        // Taken already with a group member dropped before it?
        if (!entry_meta_[c.second].live ||
            StateOf(index_->entry(c.second).state_gen.load(std::memory_order_acquire)) != EntryState::kOnDisk)
          continue;
        n += DropFromTierWithGroup(c.second, now, &dropped);  // with its group; records go too
      }
      stats_.tier_evictions += n;
      if (n > 0)
        MCXL_LOG(kInfo, "tier", "SSD tier over its watermark (%llu of %llu bytes live): dropped %llu objects",
                 (unsigned long long)tier_stats_.live_bytes, (unsigned long long)cap, (unsigned long long)n);
      tier_full_ = false;
    }
  }
  bool wrote = FlushTombstones();
  tier::Stats ts = tier_->stats();
  bool compacted = false;
  if (ts.used_bytes > 0 && double(ts.used_bytes - std::min(ts.used_bytes, ts.live_bytes)) > 0.5 * double(ts.used_bytes)) {
    uint64_t before = ts.compactions;
    // 64 MiB a turn in 4 MiB steps, tombstones written in between: a remove
    // waits for at most one step's copy, not the whole turn.
    for (int step = 0; step < 16 && ts.compactions == before; ++step) {
      if (!tier_->Compact(4ull << 20).ok()) break;
      ts = tier_->stats();
      wrote |= FlushTombstones();
    }
    ts = tier_->stats();
    compacted = ts.compactions != before;
  }
  std::lock_guard<std::mutex> lock(mu_);
  tier_stats_ = ts;
  return wrote || compacted;
}

void MasterImpl::TierLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(tier_wake_mu_);
      // With pre-demotion on, polled more often: a retry it set (DemoteAhead)
      // does not wait for a put to wake it.
      auto wait = std::chrono::milliseconds(config_.offload_ahead_ratio > 0 ? 2 : 50);
      tier_cv_.wait_for(l, wait, [this] { return tier_stop_ || tier_wake_; });
      if (tier_stop_) return;
      tier_wake_ = false;
    }
    for (int round = 0; round < 1000000; ++round) {
      bool more = false;
      // Tombstones first and between the steps: removes wait for them.
      more |= FlushTombstones();
      more |= DemoteBatch();
      more |= FlushTombstones();
      more |= PromoteOne();
      more |= TierHousekeeping();
      more |= DemoteAhead();  // last: it yields to eviction's demotions
      {
        std::lock_guard<std::mutex> l(tier_wake_mu_);
        if (tier_stop_) return;
      }
      if (!more) break;
    }
  }
}

void MasterImpl::RecoverTier(bool fresh) {
  if (!tier_) return;
  std::unordered_map<std::string, tier::RecordLocation> live;
  tier_->ForEachLive([&live](std::string_view key, const tier::RecordLocation& loc) { live[std::string(key)] = loc; });
  next_generation_ = std::max(next_generation_, tier_->MaxGeneration() + 1);
  // Tickets continue above the last incarnation's (0 in a formatted pool).
  tomb_queued_ = pool_->superblock()->tier_tombs_durable.load(std::memory_order_relaxed);
  uint64_t kept = 0, dropped = 0, rebuilt = 0, orphans = 0;
  if (!fresh) {
    for (uint64_t s = 0; s < index_->capacity(); ++s) {
      if (!entry_meta_[s].live) continue;
      uint64_t sg = index_->entry(s).state_gen.load(std::memory_order_acquire);
      if (!Readable(StateOf(sg))) continue;
      std::string key(KeyOf(s));
      auto it = live.find(key);
      if (it != live.end() && it->second.generation == GenOf(sg)) {
        disk_loc_[s] = it->second;
        if (StateOf(sg) == EntryState::kOnDisk) {
          Extent ext;
          if (alloc_->Lookup(entry_meta_[s].extent, &ext)) {
            index_->BeginRewrite(s);  // the stub says what the tier says
            WriteStub(ext.offset, entry_meta_[s].key_len, it->second);
            index_->EndRewrite(s);
          }
          ++disk_objects_;
          ++kept;
        } else {
          NoteClean(it->second.value_len, true);  // a pool object with a clean copy
        }
        live.erase(it);
      } else if (StateOf(sg) == EntryState::kOnDisk) {
        MCXL_LOG(kWarn, "tier", "recovery: '%s' is on disk in the index but its record is gone; dropped", key.c_str());
        Unlink(s, true, 0);
        ++dropped;
      }
    }
    // Records no entry names (a demotion caught by a crash, a removal whose
    // tombstone was not written): tombstoned, so a rebuild never brings them back.
    for (const auto& [k, loc] : live) {
      QueueTombstone(k, loc.generation);
      ++orphans;
    }
  } else {
    uint64_t now = NowNs();
    for (const auto& [key, loc] : live) {
      if (key.empty() || key.size() > kMaxKeyLength || loc.value_len == 0) continue;
      uint64_t need = ExtentBytes(key.size(), sizeof(DiskStub));
      if (live_entries_ + 1 > IndexLimit()) {
        ++dropped;
        continue;
      }
      auto a = alloc_->Allocate(need);
      if (!a) {
        ++dropped;
        continue;
      }
      uint64_t hash = KeyHash(key);
      ObjectHeaderFields f;
      f.key_hash = hash;
      f.generation = loc.generation;
      f.value_size = loc.value_len;
      f.extent_size = a->size;
      f.put_time_ns = now;
      f.flags = kFlagDiskStub;
      WriteObjectHeader(*pool_, a->offset, f, key);
      WriteStub(a->offset, key.size(), loc);
      auto slot = index_->Insert({hash, a->offset, loc.value_len, loc.generation, now, 0, kNoSlot});
      if (!slot) {
        (void)alloc_->Free(a->handle);
        ++dropped;
        continue;
      }
      index_->BeginRewrite(*slot);
      index_->entry(*slot).state_gen.store(PackStateGen(loc.generation, EntryState::kOnDisk),
                                           std::memory_order_relaxed);
      index_->EndRewrite(*slot);
      entry_meta_[*slot] = EntryMeta{a->handle, uint32_t(key.size()), true, false, false};
      ++live_entries_;
      CountComplete(*slot);
      disk_loc_[*slot] = loc;
      ++disk_objects_;
      ++rebuilt;
    }
    stats_.tier_rebuilt = rebuilt;
  }
  tier_stats_ = tier_->stats();
  MCXL_LOG(kInfo, "tier", "SSD tier %s: %llu objects on disk%s, %llu dropped, %llu orphan records to tombstone",
           fresh ? "rebuilt into a formatted pool" : "recovered", (unsigned long long)(fresh ? rebuilt : kept),
           fresh ? " (index entries made from the segment files)" : "", (unsigned long long)dropped,
           (unsigned long long)orphans);
}

}  // namespace mcxl
