// TierManager: the SSD tier under the pool, as the master drives it. It
// owns the segment files (tier::DiskTier), the tier thread, the queues of
// demotions and promotions, the disk location of every object with a
// record, and the tombstones; it changes the pool only by asking the master
// (TierHost). The master calls it through the hooks below.
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
//     appends it WITHOUT the lock (the extent is kept while it reads:
//     busy_demote_) and then, under it, converts it if it is still the same
//     object. Until then the round counts its bytes as on their way out and
//     a put waiting for room gets OBJECT_REPLICA_BUSY (the client retries).
//     Write-through (--enable_offload without --offload_on_evict) queues a
//     copy after each completed put; eviction then only converts.
//   * Pre-demotion (--offload_ahead_ratio R, with --offload_on_evict; 0 =
//     off): while the pool's bytes without a clean copy exceed R of its
//     capacity, the tier thread (DemoteAhead, when no demotion is queued)
//     samples the index as eviction does, and copies the coldest objects
//     without a record (hard pins never, soft pins last and only when
//     eviction may take them) in ~4 MiB AppendBatch writes, WITHOUT
//     evicting them: the same busy_demote_ protocol and generation check as
//     a demotion, so an object removed or overwritten meanwhile gets a
//     tombstone, never a clean copy. Eviction then only converts.
//   * Eviction ahead of the watermark (the ring server's idle moments,
//     master_eviction.cc) demotes as an inline round does; bytes queued for
//     demotion (evict_pending_bytes()) count as leaving, so neither it nor a
//     put above the watermark runs a round for them again.
//   * Promotion: kPromote from a reader (every disk read when
//     --promotion_on_hit; counted, queued at the threshold) or a stage
//     request; the tier thread has the master allocate an extent, reads the
//     record into it WITHOUT the lock, then has it linked (kOnDisk ->
//     kComplete, same generation) if the entry did not change meanwhile. The
//     record stays as a clean copy: a later eviction only converts.
//   * Removal: the master's Unlink calls ForgetDiskCopy, which drops the
//     slot's record with a tombstone (queued; the tier thread writes it), so
//     a rebuild does not resurrect the key. Durable before acknowledged:
//     every tombstone has a sequence number; the tier thread writes the
//     queued ones in groups (one pwrite each, RemoveBatch) first thing in
//     every round and between its other steps, then publishes the highest
//     written in Superblock::tier_tombs_durable. A remove (batch,
//     remove_all, remove_by_regex) whose key has a tombstone pending gets its
//     seq as a ticket in the reply and the client returns once the pool word
//     reaches it (Client::WaitTombstones; the master thread never waits on
//     the disk). A put or upsert whose key has an older value with a record
//     (or a pending tombstone) is told to settle (PutNeedsSettle): after its
//     CAS the client sends kSettle, the master unlinks the older values now
//     and answers with their ticket. Pool-only keys get no ticket and pay
//     nothing. While a newer put of a key is WRITING, its older values are
//     not demoted (the settle flag was decided at PutStart).
//   * Capacity: above --offload_high_watermark_ratio of the capacity in
//     force (--offload_capacity_bytes, or less when the filesystem has less
//     room: DiskTier::RefreshSpace, every 200 ms) the least recently used
//     kOnDisk objects are dropped (entry and record); an append that still
//     fails marks the object "no disk" and eviction drops it as without a
//     tier, and the tier drops only what keeps 5% of room for live records.
//     Writes meeting ENOSPC make the tier "degraded" (gauge, log line on
//     each change); failed tombstones and compactions back off to 2 s.
//   * Groups (ReplicateConfig.group_ids) move together: eviction demotes
//     every member, the tier drops a group whole or not at all, and a
//     promotion (threshold crossed, or a stage request) queues the group's
//     other disk-resident members too (at most kGroupPromoteMax).
//   * Restart: Recover keeps kOnDisk entries whose record the tier still
//     holds (same key and generation); after --format every live record gets
//     a kOnDisk entry again and generations start above MaxGeneration().
//
// Locking: the master's one lock (TierHost::mu()) protects every member
// below but disk_, the thread and its wake flags (wake_mu_), and what the
// constructor sets (config_, test_write_delay_ms_). Every method REQUIRES
// it held except Open, PublishConfig, Stop and the destructor; the tier
// thread takes it for short steps. disk_ (its own locks) is never called
// under it after Recover, so its relocation callback may take it; only the
// tier thread calls disk_ after Recover.
//
// The files by sub-concern: tier_manager.cc (open, thread, statistics),
// tier_demote.cc (eviction's demotions), tier_ahead.cc (pre-demotion),
// tier_promote.cc, tier_tombstones.cc (removal, settling), tier_capacity.cc
// (the tier's LRU drops, groups across the tiers), tier_recovery.cc
// (restart, --format rebuild, compaction's relocations).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/rpc_protocol.h"
#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/pool/layout.h"
#include "mooncake_cxl/tier/disk_tier.h"
#include "master_internal.h"
#include "tier_host.h"

namespace mcxl {

class PromWriter;

class TierManager {
 public:
  // ---- without the lock ----
  // Checks the tier flags of `config` and opens the segment files under
  // --root_fs_dir (before the master adopts its pool).
  // `owner` (the pool's uuid) is recorded in the directory's lock. The
  // files get the pool's mode and group (0600, or 0660 for --pool_group).
  static Result<std::unique_ptr<TierManager>> Open(const MasterConfig& config, TierHost* host,
                                                   const std::string& owner);
  // Writes the tier's part of the superblock (root dir, flags; zeros when
  // `tier` is null) for clients to read at attach.
  static void PublishConfig(const TierManager* tier, const MasterConfig& config, Superblock* sb);
  ~TierManager();  // Stop()
  void Stop();     // ends the tier thread (idempotent)

  // ---- under the lock ----
  // Recovery (fresh: after --format): entries and records agree; rebuilds
  // kOnDisk entries. Then Start runs the tier thread.
  void Recover(bool fresh);
  void Start();
  // The pool was replaced: every record of the old one is forgotten (its
  // disk records stay, orphans until a rebuild), counters start over.
  void ForgetPool();

  // Eviction's hook: frees the pool bytes of COMPLETE `slot` by turning it
  // kOnDisk when its record is on disk, queues its demotion when it is not
  // (0 freed, *round_waits set: the round is blocked transiently), else
  // unlinks it. Returns objects freed (as TierHost::UnlinkWithOlder).
  uint64_t EvictOrDemote(uint64_t slot, uint64_t* bytes, bool* round_waits);
  // Index pressure (eviction wants slots, not bytes): drops kOnDisk `slot`
  // with its group, entries and records, by the rules of the tier's own
  // LRU (DropWithGroup). Returns objects unlinked.
  uint64_t DropForIndex(uint64_t slot, uint64_t now) { return DropWithGroup(slot, now, nullptr); }
  // Extent bytes of objects queued for demotion by eviction: leaving soon.
  uint64_t evict_pending_bytes() const { return evict_pending_bytes_; }
  // Eviction of a group one of whose members the tier could not take (its
  // append failed): the whole group is dropped, not split across the tiers.
  bool GroupDropsWhole(const std::vector<uint64_t>& members) const;
  // The tier thread is copying from this extent (a demotion batch).
  bool ExtentBusy(uint64_t handle) const { return busy_demote_.count(handle) != 0; }
  // Unlink's hooks: the record of an unlinked entry goes (a tombstone,
  // later), before the entry is tombstoned (it reads state and key); then,
  // true when the tier thread frees the entry's extent itself (busy).
  void ForgetDiskCopy(uint64_t slot, uint64_t generation);
  bool TakeOverFree(uint64_t handle);
  // A put completed (write-through copies it) / allocated its extent.
  void OnPutComplete(uint64_t slot);
  void OnAllocated();
  // PutStart of generation `gen`: the client must settle after its CAS.
  bool PutNeedsSettle(std::string_view key, uint64_t hash, uint64_t gen, bool upsert) const;
  // Seq of key's newest tombstone not yet written (0: none): a remove, put
  // or upsert of the key waits for it too.
  uint64_t PendingTomb(std::string_view key) const;
  // Tombstones queued so far; TombTicketSince: the ticket for a request that
  // saw tombs_queued() == `before` when it began (0 when it queued nothing).
  uint64_t tombs_queued() const { return tomb_queued_; }
  uint64_t TombTicketSince(uint64_t before) const { return tomb_queued_ != before ? tomb_queued_ : 0; }
  // kPromote of a checked client and key: OK (counted, queued, or in the
  // pool already) or OBJECT_NOT_FOUND.
  ErrorCode Promote(const PromoteRequest& req);
  static constexpr size_t kGroupPromoteMax = 256;

  // The tier's fields of MasterStats, and its /metrics lines (disk reads
  // and bad records the clients counted are the master's).
  void FillStats(MasterStats* s) const;
  void WriteMetrics(PromWriter* w, uint64_t disk_hits, uint64_t disk_bad) const;

 private:
  struct DemoteJob {
    uint64_t slot, state_gen;
    bool evict;
  };
  struct DemoteItem {
    DemoteJob job;
    std::string key;
    const char* src;
    uint64_t len;
    uint64_t handle;
  };
  struct PromoteJob {
    uint64_t slot, state_gen;
    uint32_t attempts = 0;  // tries that found no room
  };
  struct TierRemoval {
    std::string key;
    uint64_t generation;
    uint64_t seq = 0;  // its ticket (QueueTombstone): removals_ is in seq order
  };
  // MasterStats' counters the tier keeps (same names).
  struct Counters {
    uint64_t demotions = 0, demotion_failures = 0, promotions = 0, promotion_failures = 0;
    uint64_t tier_writes = 0, tier_ahead_writes = 0, demotions_clean = 0, tier_stale_copies = 0;
    uint64_t tier_evictions = 0, offload_skipped = 0, tier_rebuilt = 0, group_promotions = 0;
    uint64_t tier_checksum_failures = 0, disk_hits_reported = 0;
    uint64_t tomb_retries = 0;  // tombstone writes that failed (each retried, with backoff)
  };

  TierManager(const MasterConfig& config, TierHost* host, std::unique_ptr<tier::DiskTier> disk);
  void Loop();
  void Wake();
  uint64_t QueueLength() const;  // jobs waiting for the tier thread (tier_queue)

  // ---- demotion (tier_demote.cc) ----
  void QueueDemote(uint64_t slot, bool evict);
  // TierHost::ConvertToDisk and the tier's records of it.
  bool Convert(uint64_t slot, const tier::RecordLocation& loc, uint64_t* bytes);
  void ResolvePending(uint64_t slot);
  bool DemoteBatch();  // up to ~4 MiB of queued demotions, one tier write, one lock pass each side
  // Under the lock: `job.slot` (COMPLETE, CheckedLive, no record yet) joins
  // `batch`; its extent is kept for the tier thread (busy_demote_).
  void AddToDemoteBatch(const DemoteJob& job, std::vector<DemoteItem>* batch, uint64_t* batch_bytes);
  // Without the lock: one AppendBatch; then under it each copy is kept only
  // if its object did not change meanwhile (else tombstoned), evict jobs convert.
  void WriteDemoteBatch(std::vector<DemoteItem>* batch, bool ahead);
  // disk_loc_ changes of pool (COMPLETE) objects keep pool_clean_bytes_.
  void NoteClean(uint64_t value_len, bool add);

  // ---- pre-demotion (tier_ahead.cc) ----
  // With no demotion queued, up to ~4 MiB of clean copies of the coldest
  // objects without one, written like a DemoteBatch (evict = false).
  // Bounded under the lock per call.
  bool DemoteAhead();
  uint64_t PoolDirtyBytes() const;  // pool bytes not covered by a clean copy (estimate)
  bool AheadWanted() const;         // pre-demotion on and the pool's dirty bytes above its threshold

  // ---- promotion (tier_promote.cc) ----
  // Queues `slot` for promotion with its group's other kOnDisk members (bounded).
  void QueuePromoteWithGroup(uint64_t slot, uint64_t state_gen);
  bool PromoteOne();

  // ---- tombstones (tier_tombstones.cc) ----
  void QueueTombstone(std::string key, uint64_t generation);
  bool FlushTombstones();  // tier thread, without the lock (takes it briefly)
  // An upsert of `key`: does an older value have (or is it getting) a record?
  bool OlderHasRecord(std::string_view key, uint64_t hash, uint64_t generation) const;

  // ---- capacity (tier_capacity.cc) ----
  // Over its watermark the tier drops its least recently used objects; then
  // tombstones and compaction.
  bool Housekeeping();
  // After a Housekeeping pass (under the lock): the degraded flag and its log lines.
  void UpdateDegraded(bool tomb_failing, bool compact_failing);
  // Drops `slot` with its whole group, or nothing when a member is
  // protected (lease, hard pin, view, unfinished). Returns objects
  // unlinked; adds their value bytes to *bytes.
  uint64_t DropWithGroup(uint64_t slot, uint64_t now, uint64_t* bytes);

  // ---- recovery (tier_recovery.cc) ----
  // Compaction moved (or, to.segment_id 0, dropped) the record of `key`.
  void OnRelocated(std::string_view key, const tier::RecordLocation& from, const tier::RecordLocation& to);

  const MasterConfig config_;
  TierHost& host_;
  const std::unique_ptr<tier::DiskTier> disk_;
  uint64_t test_write_delay_ms_ = 0;  // MCXL_TEST_TIER_WRITE_DELAY_MS: tests widen the write window

  Counters counters_;
  tier::Stats disk_stats_{};  // the tier thread's latest snapshot
  // Per index slot with a record in the tier (a clean copy of a pool object,
  // or the value of a kOnDisk entry): where it is.
  std::unordered_map<uint64_t, tier::RecordLocation> disk_loc_;
  uint64_t disk_objects_ = 0;  // kOnDisk entries
  size_t lru_bucket_ = 0;      // where the tier's LRU sample starts next (Housekeeping)
  std::vector<DemoteJob> demote_q_;
  std::unordered_map<uint64_t, bool> demote_queued_;  // slot -> evict
  std::vector<PromoteJob> promote_q_;
  std::unordered_map<uint64_t, uint64_t> promote_queued_;  // slot -> state_gen
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> promote_count_;  // slot -> (state_gen, disk reads)
  std::unordered_map<uint64_t, uint64_t> no_disk_;  // slot -> state_gen whose append failed: eviction drops it
  // Extent bytes of objects eviction queued for demotion, until their job
  // is done (slot -> bytes): freed soon, so a put above the watermark does
  // not run another round for them. A heuristic, like pool_clean_bytes_: it
  // decides when a round runs, never what it frees.
  std::unordered_map<uint64_t, uint64_t> evict_pending_;
  uint64_t evict_pending_bytes_ = 0;
  // The extents of the demotion batch being written: handle -> unlinked
  // meanwhile (the tier thread frees it when the batch is done).
  std::unordered_map<uint64_t, bool> busy_demote_;
  bool full_ = false;  // an append found no room: the tier drops its LRU first
  uint64_t full_log_mono_ = 0;

  // Tombstones: the last ticket handed out; key -> seq of its newest
  // tombstone not yet written (an older record of the key must not come
  // back behind an acknowledged operation); the queue the thread writes.
  uint64_t tomb_queued_ = 0;
  std::unordered_map<std::string, uint64_t> tomb_pending_;
  std::vector<TierRemoval> removals_;
  uint64_t tomb_fail_log_mono_ = 0;
  // A full filesystem: failed tombstone writes and compactions are retried
  // after a backoff (50 ms doubling to 2 s), not every round; the tier is
  // "degraded" while writes meet ENOSPC (logged on each change, a gauge).
  uint64_t tomb_retry_mono_ = 0, tomb_backoff_ns_ = 0;
  uint64_t compact_retry_mono_ = 0, compact_backoff_ns_ = 0;
  uint64_t space_mono_ = 0;   // the last RefreshSpace
  uint64_t drop_log_mono_ = 0;  // the last "dropped N objects" line (one a second)
  uint64_t enospc_seen_ = 0;  // disk_stats_.enospc at the last Housekeeping
  bool degraded_ = false;

  // Pre-demotion: value bytes of COMPLETE objects with a record (a
  // heuristic for how much ahead work is left: drift only changes how much
  // is copied, never what a reader sees); its sampled window (eviction's
  // order; soft-pinned members sort last), where its scan got, and whether
  // a put has woken the tier thread for it.
  uint64_t pool_clean_bytes_ = 0;
  std::vector<SampledSlot> pre_window_;
  size_t pre_next_ = SIZE_MAX;  // next member to copy; SIZE_MAX while scanning
  uint64_t pre_start_ = 0, pre_scanned_ = 0, pre_complete_ = 0, pre_sampled_mono_ = 0;
  uint64_t pre_retry_mono_ = 0;  // a whole window had nothing to copy: not before then
  uint64_t last_put_mono_ = 0;   // the latest put that allocated (pre-demotion waits for a pause)
  bool pre_kicked_ = false;

  std::thread thread_;
  std::mutex wake_mu_;  // stop_ and wake_
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;
};

}  // namespace mcxl
