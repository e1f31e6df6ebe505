// MasterImpl: the master (master.h) as the master library implements it;
// only the master's sources include this header. Its parts by concern:
//   master.cc            Create/Open, pool adoption and replacement, Handle,
//                        ServeRing, Dispatch, Tick, stats, checked lookups
//   master_puts.cc       PutStart, pending puts, upsert settling, abandonment
//   master_remove.cc     removal, deferred and pin-deferred frees
//   master_clients.cc    attach/detach/heartbeat, liveness, reclaim
//   master_pins.cc       pin tables that outlive their attachment
//   master_recovery.cc   restart on a formatted pool
//   master_eviction.cc   sampled approximate LRU, eviction ahead of the watermark
//   master_disk_entries.cc  the SSD tier's hooks and the entry writes it asks for
//   master_http.cc       the monitoring pages
// The SSD tier's own logic is TierManager's (tier_manager.h, tier_*.cc).
//
// Object life as the master sees it (docs/architecture.md, "Object life"):
//   PutStart: allocate extent, write ObjectHeader + key, insert WRITING entry,
//             remember it as pending. The client copies the value and CASes the
//             entry COMPLETE itself; Tick notices and accounts for it.
//   Remove:   tombstone (seqlock), then free the extent, or, while a client's
//             pin table names the object (a live BufferHandle), keep the
//             extent until the pin is gone. An unforced remove of a leased
//             object is OBJECT_HAS_LEASE; a pinned one is unlinked at once
//             (its extent waits for the last view).
//   Tenants:  keys are stored in their tenant's namespace (tenant.h); the
//             master knows each client's tenant from Attach and confines
//             remove_all / remove_by_regex to it.
//   Pending puts whose client died or that outlived
//   --put_start_discard_timeout_sec are revoked; their extent is freed at once
//   when the client is known dead, else quarantined: a stalled but live
//   client may still be writing into it. A client of this machine keeps it
//   until its process is gone (checked in Tick); a remote one until
//   --put_start_release_timeout_sec has passed.
//
//   Upsert:   until Tick settles it, the newest COMPLETE entry of a key is
//             its value for every decision: eviction and removal unlink an
//             entry only with the older ones, oldest first (UnlinkWithOlder).
//   Views:    pins of a process that may be alive outlive its attachment
//             (reclaim, close(), restart): the slot is retired with its pin
//             table until the process re-attaches, drops its views or dies
//             (master_pins.cc).
//
// Recovery (a master started on a formatted pool without --format): every
// COMPLETE entry whose header checks out is kept and its extent reserved;
// unfinished puts are revoked; client slots are cleared (clients re-attach),
// except slots retired with live views, whose viewed extents stay reserved.
//
// The pool is memory every client can write: the master never dereferences
// an offset or length it reads from an entry or header. Where an object lies
// (its extent) and how long its key is come from the master's own records
// (EntryMeta + the allocator); CheckedLive compares the entry and header with
// them before any use, and an entry that disagrees is corrupt: logged,
// counted (mooncake_cxl_corrupt_entries_total), skipped, and reclaimed by the
// next Tick (tombstoned; only the extent the master's own handle names is
// freed). A shrunk pool device stops the master (see Tick).
//
// As the tier's host (TierHost, tier_host.h) the master does every
// structural write the tier asks for (master_disk_entries.cc); the tier's
// policy, queues and disk records are TierManager's (tier_manager.h).
//
// Atomics in master*.cc and tier_*.cc follow three rules, so each load and store there
// needs no comment of its own:
//  * Entry fields other than state_gen and the lease word, superblock and
//    client-slot lines of the master's: only the master writes them, under
//    mu_, so its own loads are relaxed (program order) and its stores go
//    through ObjectIndex's seqlock or a release store + PublishRange.
//  * state_gen: a client may CAS WRITING->COMPLETE/ABORTED at any time. Loads
//    that decide on that are acquire (they pair with the client's release
//    CAS and make its value bytes visible); the master's own transitions of a
//    WRITING entry go through the same CAS (ObjectIndex::Abort), so exactly
//    one side wins. A decision uses one load per entry, never two.
//  * Client-written lines (heartbeat, pins, hit counters) and lease words are
//    hints compared with the clock or summed for statistics: relaxed, after
//    ObserveRange.
//
// Thread safety: one lock, mu_, protects all of the master's state and the
// SSD tier's (TierManager's, which takes it through TierHost::mu()). Every
// public entry point takes it (the TCP loop, its long-request worker, the
// ring server, the HTTP thread and the tier thread call in). Work under mu_
// is short: scans of the whole index (remove_by_regex, remove_all, /metrics,
// /get_all_keys) take it per slice of kScanSliceSlots slots, so other
// requests interleave; each entry is judged on one look under one hold. The
// tier's disk I/O never runs under it. Not under mu_: the atomics below
// (attached_bits_, slot_count_, pool_view_, evict_ahead_wanted_,
// last_replace_check_mono_) and what replace_mu_ guards.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/control/rpc_protocol.h"
#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/master/warm_scan.h"
#include "mooncake_cxl/pool/extent_allocator.h"
#include "mooncake_cxl/pool/object_index.h"
#include "mooncake_cxl/pool/pool.h"
#include "mooncake_cxl/pool/populate.h"
#include "master_internal.h"
#include "tier_host.h"
#include "tier_manager.h"

namespace mcxl {

class MasterImpl final : public Master, private TierHost {
 public:
  explicit MasterImpl(const MasterConfig& config) : config_(config) {}
  ~MasterImpl() override;
  Status Open(std::unique_ptr<Pool> premapped = nullptr, std::unique_ptr<WarmScan> warm = nullptr);  // Create's

  // ---- Master (master.h) ----
  std::string Handle(uint16_t type, std::string_view payload, uint32_t* conn_slot) override;
  void OnDisconnect(uint32_t slot) override;
  void ServeRing(uint32_t slot) override;
  // Slots 64*word .. 64*word+63 as a bit set (bit i = slot 64*word+i attached).
  // Acquire: pairs with the release in SetAttached; the rings were reset.
  // REQUIRES: word < (kMaxClientSlots + 63) / 64.
  uint64_t AttachedWord(uint32_t word) const override { return attached_bits_[word].load(std::memory_order_acquire); }
  uint32_t client_slot_count() const override { return slot_count_.load(std::memory_order_acquire); }
  // Every kClientCheckIntervalNs it also checks the pool device's size.
  uint64_t Tick() override;
  // Eviction ahead of the watermark (EvictAhead). Wanted: a relaxed hint
  // (the next put sets it again when still needed).
  bool IdleWorkWanted() const override { return evict_ahead_wanted_.load(std::memory_order_relaxed); }
  void IdleWork(uint64_t budget_ns, const std::function<bool()>& interrupted) override {
    EvictAhead(budget_ns, interrupted);
  }
  MasterStats stats() const override;
  std::string MetricsText() override;
  std::string SummaryLine() override;
  std::pair<int, std::string> QueryKey(std::string_view key, std::string_view tenant) const override;
  std::string AllKeys(uint64_t limit, bool* truncated, std::string_view tenant) const override;
  std::string AllSegments() const override;
  const Pool& pool() const override { return *pool_view_.load(std::memory_order_acquire); }
  const MasterConfig& config() const override { return config_; }

 private:
  struct PendingPut {
    uint64_t entry_slot, generation;
    uint32_t owner;
    uint64_t put_id;  // the owner's PutStart that made it
    uint64_t start_mono_ns;
    bool upsert;
  };
  // The extent of a revoked put whose writer may still run: freed once
  // `owner_pid` (a process of this machine) is gone, or, when the owner's
  // pid cannot be checked here (0), at release_mono_ns.
  struct DeferredFree {
    uint64_t handle;
    uint64_t release_mono_ns;
    uint64_t owner_pid = 0;
  };
  // An unlinked object whose extent a BufferHandle still pins.
  struct PinnedFree {
    uint64_t handle;
    uint64_t generation;
  };
  // A slot whose attachment ended while its process may still hold views
  // (layout.h, kSlotRetired): its pin table stays honoured.
  struct RetiredPins {
    bool active = false;
    uint64_t generation = 0;  // the ended attachment's: a re-attach naming it takes the slot back
    uint64_t pid = 0;
    bool local = false;  // same machine: pid liveness can be checked
    uint64_t since_mono_ns = 0;
  };
  struct ClientInfo {
    bool attached = false;
    uint64_t generation = 0;
    uint64_t pid = 0;
    bool local = false;      // same machine: pid liveness can be checked
    bool remote = false;     // attached with the secret: reads over the Transfer Engine
    bool connected = false;
    uint64_t attach_ns = 0;  // NowNs at attach: heartbeat grace
    std::string tenant;      // key namespace (tenant.h), from Attach
    std::vector<uint64_t> abandoned;  // recent put ids it gave up on (bounded)
    uint64_t reply_tail = 0;          // ServeRing's copy of its reply ring's tail (ShmRing::Push)
    std::string hostname;             // its local_hostname: the name of its DRAM segment
    // Its DRAM segment (master_segments.cc): size and TE session from
    // Attach, the allocator of its bytes (the master never touches them).
    uint64_t segment_size = 0;
    std::string segment_session;
    std::shared_ptr<ExtentAllocator> segment;
  };
  // Where the value of a kInSegment entry (or a WRITING one bound there) lies.
  struct SegmentPlacement {
    uint32_t owner;
    uint64_t owner_generation;
    uint64_t handle;  // in the owner's segment allocator
  };

  // Makes `pool` (formatted, or verified when !fresh) the one served: every
  // record of the previous pool is dropped (it moves to replaced_). REQUIRES:
  // mu_ held, or in Open.
  void AdoptPool(std::unique_ptr<Pool> pool, bool fresh);
  // The device behind --cxl_path was replaced (another inode/device than the
  // one mapped: Mooncake's CXL test deletes and recreates its pool file while
  // the master runs). A new blank device, sized and with an acceptable mode,
  // is formatted (a new uuid and token) and served; one holding a
  // superblock is never formatted. Loud log lines; WITHOUT mu_.
  void CheckReplacedDevice();
  void LogReplacementOnce(uint64_t dev, uint64_t ino, int reason, bool error, const char* fmt, ...)
      __attribute__((format(printf, 6, 7)));
  void ReleaseReplacedPools(uint64_t now_mono);
  static constexpr uint64_t kReplacedPoolGraceNs = 30ull * 1000000000ull;

  // ---- dispatch and index lookups (master.cc) ----
  std::string Dispatch(uint16_t type, std::string_view payload, uint32_t* conn_slot);
  void CountOp(uint16_t type, const std::string& reply);
  // Live (WRITING or COMPLETE) entries of `key`, in probe order; corrupt
  // ones are left out (see CheckedLive).
  void FindLive(std::string_view key, uint64_t hash, std::vector<uint64_t>* out) const override;
  // True when the live entry `slot` agrees with the master's records: an
  // extent the master allocated for it, at the entry's object_offset, a value
  // that fits it, a header with the magic, key length and hash the master
  // wrote. Otherwise the entry is quarantined (logged once, counted) for
  // ReclaimCorrupt and false is returned. Cheap: compares, one header line.
  bool CheckedLive(uint64_t slot) const override;
  // Tombstones quarantined entries; frees what the master's handle names.
  void ReclaimCorrupt();
  // The key / header of a live entry, located by the master's own record
  // (allocator handle + key length), never by the pool: in bounds whatever
  // a client wrote (the bytes themselves may have been overwritten). Empty /
  // nullptr for an entry the master holds no record of.
  std::string_view KeyOf(uint64_t entry_slot) const override;
  const ObjectHeader* HeaderOf(uint64_t entry_slot) const;
  // The device shrank (Tick): refuse everything.
  bool PoolLost();

  // ---- recovery (master_recovery.cc) ----
  void Recover();

  // ---- clients and reclaim (master_clients.cc) ----
  void SetAttached(uint32_t slot, bool attached);
  std::string HandleAttach(Decoder* d, uint32_t* conn_slot);
  std::string HandleDetach(Decoder* d, uint32_t* conn_slot);
  std::string HandleHeartbeat(Decoder* d);
  // ---- remote clients (master_remote.cc) ----
  std::string HandleLocate(Decoder* d);
  std::string HandlePublish(Decoder* d);
  LocateItem LocateOne(const ClientRef& ref, const std::string& key, uint64_t lease_until_ns);
  // ---- leases of a non-coherent pool's clients (master_leases.cc) ----
  std::string HandleLeases(Decoder* d);
  std::string HandleSegmentSession(Decoder* d);
  int32_t ApplyLease(const LeaseItem& it, uint64_t now);
  // The session the serving process advertises (te_session_file), "" if none.
  std::string TeSession() const;
  void FillRemoteReply(AttachReply* reply) const;
  bool ClientValid(const ClientRef& ref) const;
  // A batch request (kLocate, kPublish, kLeases): refused, logged, with
  // reply.status set, when it does not decode, has more than kMaxRequestKeys
  // items (count(req)) or names no current attachment; else fold(req, &reply)
  // does its items. Returns the encoded reply.
  template <class Request, class Reply, class Count, class Fold>
  std::string FoldBatch(Decoder* d, const char* what, const char* unit, Count&& count, Fold&& fold);
  // Access check of every request but Ping and Attach (see Handle): false
  // with the refusal reply in *refusal.
  bool Admit(uint16_t type, std::string_view payload, uint32_t conn_slot, std::string* refusal);
  // Logs a refused request: at most kRefusalLinesPerSec lines per second,
  // the next line counts those not logged.
  static constexpr uint64_t kRefusalLinesPerSec = 10;
  void LogRefusal(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // Reclaims slots whose local process is gone (the table is full at attach).
  uint32_t ReclaimDeadLocalClients();
  void ReclaimClient(uint32_t slot, const char* why);
  void CheckClients();

  // ---- DRAM segments (master_segments.cc) ----
  // Records the segment an Attach names (size, session): false (logged)
  // when its size is out of bounds.
  bool AdoptSegment(ClientInfo* c, uint32_t slot, const AttachRequest& req);
  // The segment a put of `bytes` goes to (its owner's slot, the extent in
  // *ext), or kNoSlot for the pool: preferred_segment, then the putter's
  // own with kPlaceSameNode, then the putter's own when the pool is past the
  // point where eviction starts (watermark - ratio/2: eviction ahead). Only
  // the owner writes a segment (it has no engine here). Never a grouped put.
  uint32_t PlaceInSegment(const PutStartRequest& req, uint64_t bytes, uint64_t pool_extent_bytes, Extent* ext);
  // `bytes` in the segment of `owner` (evicting its LRU objects if need be):
  // owner, or kNoSlot when they do not fit.
  uint32_t AllocateInSegment(uint32_t owner, uint64_t bytes, Extent* ext);
  // A full segment: its least recently used objects go (by the rules of an
  // eviction round, groups and protected ones kept) until `bytes` fit.
  uint64_t EvictFromSegment(uint32_t owner, uint64_t bytes);
  void WriteSegmentStub(uint64_t stub_offset, uint64_t key_len, uint32_t owner, const Extent& ext);
  // Unlink's part: frees the segment extent of `entry_slot`, if any.
  void FreeSegmentExtent(uint64_t entry_slot);
  // Every object of `slot`'s segment is unlinked (its owner is gone: a miss,
  // never other bytes) and the segment forgotten. Before the slot is reused.
  void DropSegment(uint32_t slot, const char* why);
  // A live entry bound to a segment agrees with the master's record of it.
  bool SegmentEntryFits(uint64_t slot, uint64_t value_size, uint64_t extent_size, uint32_t key_len) const;
  // Records and forgets a placement in in_segment_ and its owner's index.
  void RecordSegmentPlacement(uint64_t entry_slot, const SegmentPlacement& p);
  void ForgetSegmentPlacement(uint64_t entry_slot);
  std::unordered_map<uint64_t, SegmentPlacement> in_segment_;  // entry slot -> placement
  // Owner slot -> its entry slots in in_segment_: a reclaim or a full
  // segment costs the owner's objects only, not every segment object.
  std::unordered_map<uint32_t, std::unordered_set<uint64_t>> segment_entries_of_;

  // ---- puts and pending puts (master_puts.cc) ----
  std::string HandlePutStart(Decoder* d);
  PutStartItem PutStartOne(const PutStartRequest& req, size_t i);
  // The current state of the entry `p` names, or kEmpty when the entry no
  // longer is that put (removed, or its slot reused): a stale record.
  EntryState PendingState(const PendingPut& p) const;
  void CountComplete(uint64_t entry_slot);
  void FinishPending(const PendingPut& p, EntryState state);
  void RevokePending(const PendingPut& p, bool owner_dead);
  // Records put ids the client abandoned and revokes what they allocated.
  void ForgetAbandoned(uint32_t slot, const std::vector<uint64_t>& ids);
  void ClearSupersededIfSettled(std::string_view key, uint64_t hash);
  // The newest generation of a key is its current value at every decision
  // (eviction, removal), whether or not Tick has noticed its completion: an
  // entry goes only together with every older COMPLETE entry of its key,
  // oldest first, so that no moment exists in which an older value is linked
  // and a newer one is not. Returns the entries unlinked (0 when `slot` is no
  // longer COMPLETE); adds their extent bytes to *bytes when given.
  uint64_t UnlinkWithOlder(uint64_t slot, uint64_t* bytes) override;
  // True when an older entry of `slot`'s key is still WRITING: it may yet be
  // published, so `slot` must not go before it (it would become current).
  bool OlderUnfinished(uint64_t slot) const;
  // The shadow files no other slot under `slot`'s key hash: the key has no
  // other entry (OtherWriting and UnlinkWithOlder skip their key lookup).
  bool AloneUnderItsHash(uint64_t slot) const;
  // Unlinks readable `slot` alone (its older values are the caller's):
  // adds its extent's size to *bytes (when given); returns 1.
  uint64_t UnlinkOne(uint64_t slot, uint64_t* bytes);
  // Another entry of slot's key, newer (or older) than slot, is still WRITING.
  bool OtherWriting(uint64_t slot, bool newer) const;
  // The members of slot's group (slot alone when ungrouped): a copy, since
  // Unlink edits the group.
  std::vector<uint64_t> GroupMembers(uint64_t slot) const override;
  // A random index slot to start a sampled scan at (under mu_).
  uint64_t RandomSlot() override;
  void CheckPending();

  // ---- removal and deferred frees (master_remove.cc) ----
  std::string HandleRemove(Decoder* d, bool batch);
  // Called WITHOUT mu_: decodes and compiles outside it, then scans the
  // index taking mu_ per slice.
  std::string HandleRemoveMatching(std::string_view payload, bool all);
  ErrorCode RemoveKey(std::string_view key, bool force);
  // Tombstones the entry and frees its extent now (or when unpinned), or
  // quarantines it (DeferredFree) until release_mono_ns / quarantine_pid.
  void Unlink(uint64_t entry_slot, bool free_now, uint64_t release_mono_ns, uint64_t quarantine_pid = 0);
  // Frees the quarantined extents whose time or owner process is over.
  void ReleaseQuarantined(uint64_t now_mono);
  // True when a live or retired pin table names the object of this
  // generation (zero-copy views hold a pin that removal and eviction respect).
  bool IsPinned(uint64_t generation) const override;
  // Calls `visit` with the generation of every pin in live or retired pin
  // tables (after a seq_cst fence and ObserveRange); stops at the first true.
  bool ScanPins(const std::function<bool(uint64_t generation)>& visit) const;
  void ReleaseUnpinned();

  // ---- pin tables outliving their attachment (master_pins.cc) ----
  // Pins of a live process survive its slot's reclaim, its close() and a
  // master restart: while a BufferHandle lives its bytes never change.
  bool PinTableLive(uint32_t slot) const { return clients_[slot].attached || retired_[slot].active; }
  // A superset of the slots whose PinTableLive holds, for ScanPins: set
  // wherever a table becomes live (attach, retire at reclaim, retire at
  // recovery), cleared where an attachment ends (reclaim: its retire sets
  // it again) and by ScanPins when it finds a table no longer live. A bit
  // missing would lose pins (pin_tables_test.cc fails for each set point);
  // a stale one costs one check.
  void MarkPinTable(uint32_t slot) { pin_tables_[slot / 64] |= 1ull << (slot % 64); }
  void UnmarkPinTable(uint32_t slot) const { pin_tables_[slot / 64] &= ~(1ull << (slot % 64)); }
  mutable std::vector<uint64_t> pin_tables_;
  bool TableHasPins(uint32_t slot) const;
  // At reclaim (after the slot's generation was cleared): keeps the table as
  // retired when the owner may be alive and holds views, else clears it.
  void RetireOrClearPins(uint32_t slot, const ClientInfo& was, bool owner_dead, bool in_ring_call);
  // The request ring's caller word names `generation` (ShmRing::ClaimCaller).
  bool RingCallerHolds(uint32_t slot, uint64_t generation);
  // Zeroes the records; the counters too when no owner can still write them.
  void ClearPinTable(uint32_t slot, bool owner_may_live);
  // Releases retired tables whose views are gone or whose owner died.
  void CheckRetiredPins();
  // Recovery: slot `slot` of the previous incarnation keeps its table when
  // its process may be alive and holds views; REQUIRES: before objects are
  // unlinked. ReservePinnedExtents keeps the extents of objects unlinked
  // while viewed (after the live objects' extents are reserved).
  void RecoverPinTable(uint32_t slot);
  void ReservePinnedExtents();

  // ---- eviction (master_eviction.cc) ----
  // An extent for a new object, evicting first when the pool is above its
  // high watermark or the index near full, and again when allocation fails.
  Result<Extent> AllocateForPut(uint64_t extent_bytes, std::string_view key);
  // Eviction ahead of the watermark: once a put lifts the pool past
  // watermark - ratio/2, the RingServer spends its idle moments (no request
  // waiting) in slices of about `budget_ns` evicting down to watermark -
  // ratio, so a PutStart rarely runs a round inline. With an SSD tier it
  // demotes as an inline round does (bytes queued for demotion count as
  // gone), so puts with a tier rarely run a round either. `interrupted`
  // (optional) is polled between candidates: a request waiting ends the
  // slice at once, so a PutStart waits for one candidate, not a slice.
  void EvictAhead(uint64_t budget_ns, const std::function<bool()>& interrupted);
  struct PinSet;
  // Evicts unprotected COMPLETE objects, least recently used first, until
  // `bytes` and `entries` are freed or nothing evictable is left; returns the
  // number of objects evicted. Logs one line per round.
  uint64_t EvictRound(uint64_t bytes, uint64_t entries, const char* why);
  // EvictRound's first step: evicts from the ahead rounds' sorted window
  // (ahead_window_) while it is fresh, until `*freed_bytes` reaches `bytes`
  // and `entries` objects went.
  uint64_t EvictFromAheadWindow(uint64_t bytes, uint64_t entries, uint64_t now, const PinSet& pins,
                                uint64_t* freed_bytes);
  // The ahead rounds' sorted window still has candidates and, at `mono_ns`,
  // is younger than a lease (at most 1 s): a round may evict from it.
  bool AheadWindowUsable(uint64_t mono_ns) const;
  uint64_t LastAccessNs(uint64_t slot, uint64_t ttl_ns) const override;
  enum class Protection { kNone, kTransient /* lease, view, unfinished */, kPermanent /* hard pin */ };
  Protection Protected(uint64_t slot, uint64_t now, const PinSet& pins) const;
  bool SoftPinActive(uint64_t slot, uint64_t now) const override;
  // Evicts `slot` and, when it belongs to a group, every member of the group;
  // nothing when any member is protected. Adds to *bytes; returns objects.
  uint64_t EvictWithGroup(uint64_t slot, uint64_t now, const PinSet& pins, uint64_t* bytes);
  // A group member that keeps its group: protected (Protected), or, with
  // `check_older`, an older upsert of its key still WRITING. Notes a
  // transient hold for the round.
  bool MemberHeld(uint64_t m, uint64_t now, const PinSet& pins, bool check_older);
  // What a round may take: COMPLETE objects, and when index slots are
  // wanted (`for_index`) disk-resident ones too (their pool bytes left
  // already; only their slot is gained).
  bool Evictable(EntryState st, bool for_index) const {
    return st == EntryState::kComplete || (for_index && tier_ && st == EntryState::kOnDisk);
  }
  // EvictWithGroup for a COMPLETE `slot`; for a kOnDisk one, drops it with
  // its group, entries and SSD records (TierManager::DropForIndex), by the
  // same protection rules.
  uint64_t EvictCandidate(uint64_t slot, uint64_t now, const PinSet& pins, uint64_t* bytes);
  // Group membership is the master's own (group_of_), not re-read from the
  // header: `group` is the hash the master wrote or recovery checked.
  void AddToGroup(uint64_t slot, uint64_t group);
  void RemoveFromGroup(uint64_t slot);
  // Entries in use the index may hold (--index_high_watermark_ratio), where
  // eviction frees down to, and past which eviction ahead starts.
  uint64_t IndexLimit() const { return IndexShare(config_.index_high_watermark_ratio); }
  uint64_t IndexLow() const { return IndexShare(config_.index_high_watermark_ratio - config_.eviction_ratio); }
  uint64_t IndexAhead() const { return IndexShare(config_.index_high_watermark_ratio - config_.eviction_ratio / 2); }
  uint64_t IndexShare(double ratio) const {
    return std::max<uint64_t>(1, uint64_t(std::max(0.0, ratio) * double(index_->capacity())));
  }
  // A put whose key's probe window (ObjectIndex::kMaxProbeSlots from its
  // home) is full: evicts the least recently used evictable object of the
  // window, by the rules of a round. The number of objects evicted.
  uint64_t EvictInWindow(uint64_t hash);
  // Look-ahead for a loop over sorted candidates: each one's misses (entry,
  // records, header, shadow window) overlap the candidates before it.
  template <typename Window>
  void PrefetchVictims(const Window& w, size_t next) const {
    if (next + 8 < w.size()) {
      index_->PrefetchEntry(w[next + 8].slot);
      if (w[next + 8].slot < entry_meta_.size()) __builtin_prefetch(&entry_meta_[w[next + 8].slot]);
    }
    if (next + 4 < w.size() && w[next + 4].slot < entry_meta_.size()) {
      index_->PrefetchBehindEntry(w[next + 4].slot);
      alloc_->Prefetch(entry_meta_[w[next + 4].slot].extent);
    }
  }
  // The i-th slot a sampled scan from `start` visits (every slot once in
  // `capacity` steps, spread over the whole index).
  uint64_t SampleSlot(uint64_t start, uint64_t i) const;
  // Once per master: the index, not the data region, drives eviction (log).
  void NoteIndexDrivesEviction(const char* why);

  // ---- the SSD tier's hooks ----
  // Eviction's hook (master_eviction.cc): to the SSD tier when there is one
  // (TierManager::EvictOrDemote), else, or when the round wants index
  // slots, unlinked with the older values of the key.
  uint64_t EvictOrDemote(uint64_t slot, uint64_t* bytes);
  // Extent bytes queued for demotion: leaving soon (0 without a tier).
  uint64_t EvictPendingBytes() const { return tier_ ? tier_->evict_pending_bytes() : 0; }
  std::string HandlePromote(Decoder* d);  // master_disk_entries.cc
  std::string HandleSettle(Decoder* d);   // master_puts.cc

  // ---- announcement channels (master_announce.cc) ----
  std::string HandleAnnounceOpen(Decoder* d);
  std::string HandleAnnounceClose(Decoder* d);
  // One hold of `ch` by `slot` ended (already out of its list).
  void ReleaseHold(uint32_t slot, uint32_t ch);
  // Every hold of the slot ends (its attachment ended).
  void DropAnnounceHolds(uint32_t slot);
  // A new attachment of `slot` by `pid` of `machine_hash`: it takes over
  // the holds a restart found for that process.
  void AttachAnnounceHolds(uint32_t slot, uint64_t pid, uint64_t machine_hash);
  // Mirrors in the header whether `slot` (or holds a restart found there) holds `ch`.
  void SyncHolderBit(uint32_t slot, uint32_t ch);
  void MaybeFreeChannel(uint32_t ch);
  void SweepAnnounceChannels();    // CheckClients
  // Refusal lines: at most kRefusalLinesPerSec a second, the rest counted.
  bool AnnounceLogAllowed();
  void RecoverAnnounceChannels();  // Recover, before the client slots are cleared
  void WriteStub(uint64_t stub_offset, uint64_t key_len, const tier::RecordLocation& loc);

  // ---- TierHost (tier_host.h): master_disk_entries.cc; DropGroup in
  // master_eviction.cc; the lookups above ----
  FencedMutex& mu() const override { return mu_; }
  const ObjectIndex& index() const override { return *index_; }
  const ExtentAllocator& alloc() const override { return *alloc_; }
  bool pool_lost() const override { return pool_lost_; }
  EntryRecord Record(uint64_t slot) const override;
  const char* ValueBytes(uint64_t slot) const override;
  bool NewerWriting(uint64_t slot) const override { return OtherWriting(slot, true); }
  bool ConvertToDisk(uint64_t slot, const tier::RecordLocation& loc, uint64_t* bytes) override;
  void RewriteStub(uint64_t slot, const tier::RecordLocation& loc) override;
  Result<PromotionTarget> AllocateForPromotion(uint64_t slot) override;
  void LinkPromoted(uint64_t slot, const Extent& extent) override;
  void FreeExtent(uint64_t handle) override { (void)alloc_->Free(handle); }
  void FreeWhenUnpinned(uint64_t handle, uint64_t generation) override;
  void UnlinkNow(uint64_t slot) override { Unlink(slot, true, 0); }
  void DropGroup(uint64_t slot) override;
  Result<uint64_t> InsertOnDisk(const std::string& key, const tier::RecordLocation& loc, uint64_t now) override;
  void ReserveGeneration(uint64_t generation) override;
  uint64_t TombsDurable() const override;
  void PublishTombsDurable(uint64_t seq) override;

  // ---- monitoring (master_http.cc) ----
  struct ReadCountsResult {
    uint64_t hits, misses, clients;
  };
  bool CountsAreCurrent(uint32_t slot) const;  // the slot's counters are its attachment's
  ReadCountsResult ReadCounts() const;  // REQUIRES: mu_ held
  // The index's load, its evictions and probe lengths; `hit` from the scan.
  void WriteIndexMetrics(PromWriter* w, const ProbeHistogram& hit) const;  // under mu_
  void WriteSegmentMetrics(PromWriter* w) const;  // DRAM segments' bytes, per segment (master_segments.cc); under mu_
  struct DiskReads {
    uint64_t hits, bad;
  };
  DiskReads DiskReadCounts() const;  // the clients' SSD tier reads, reclaimed clients' included; under mu_

  MasterConfig config_;
  std::unique_ptr<Pool> pool_;
  std::atomic<const Pool*> pool_view_{nullptr};  // pool_.get(), for pool() without mu_
  std::atomic<uint32_t> slot_count_{0};          // clients_.size(), for the RingServer
  // Identity of the device mapped (fstat at adoption) and of a replacement
  // already logged as refused or waiting (reason), under replace_mu_.
  uint64_t pool_dev_ = 0, pool_ino_ = 0;
  uint64_t skipped_dev_ = 0, skipped_ino_ = 0;
  int skipped_reason_ = 0;
  std::mutex replace_mu_;  // one CheckReplacedDevice at a time; taken before mu_
  std::atomic<uint64_t> last_replace_check_mono_{0};
  struct ReplacedPool {
    std::unique_ptr<Pool> pool;
    uint8_t token[16] = {};
    std::string uuid;
    uint64_t since_mono_ns = 0;
  };
  std::vector<ReplacedPool> replaced_;
  // The tokens of pools replaced, for a clear refusal of their clients.
  std::vector<std::pair<std::string, std::array<uint8_t, 16>>> replaced_tokens_;
  // Bumped per request served (ring or TCP): the populator defers its
  // steps while requests keep coming (populate.h).
  ActivityCounter requests_seen_;
  // The end of the latest extent a put was given: the populator leads it
  // while requests keep coming (populate.h). Relaxed: a hint read by the
  // populating thread of this process; nothing is published by it.
  std::atomic<uint64_t> alloc_frontier_{0};
  // Populates pool_'s pages after start (--prefault_pool); stopped before
  // a replacement retires the pool it reads (under replace_mu_, not mu_).
  BackgroundPopulator populator_;
  uint64_t pool_epoch_ = 0;  // bumped by AdoptPool of a replacement: scans in slices stop
  std::unique_ptr<ObjectIndex> index_;
  std::unique_ptr<WarmScan> warm_;  // a standby's scan for the first Recover (then gone)
  std::unique_ptr<ExtentAllocator> alloc_;
  // Per index slot, for live entries: the allocator handle of its extent (its
  // offset and size come from the allocator), the key length, and whether the
  // master has counted it COMPLETE (settles the race between a remove and the
  // Tick that notices the completion). 16 bytes per slot.
  // (Soft pin and put time live in the ObjectHeader the master wrote, read
  // via HeaderOf: values only, never offsets or lengths.)
  struct EntryMeta {
    uint64_t extent = 0;  // allocator handle, when `live`
    uint32_t key_len = 0;
    bool live = false;         // the master inserted (or recovered) this entry
    bool counted = false;
    mutable bool quarantined = false;  // found corrupt; ReclaimCorrupt unlinks it
  };
  std::vector<EntryMeta> entry_meta_;
  mutable std::vector<uint64_t> quarantine_;  // slots found corrupt (by const scans too)
  mutable uint64_t corrupt_entries_ = 0;
  bool pool_lost_ = false;
  uint64_t last_size_check_mono_ = 0;
  std::unordered_map<uint64_t, uint64_t> group_of_;  // slot -> group hash, grouped slots only
  std::vector<PendingPut> pending_;
  std::vector<DeferredFree> deferred_;
  std::vector<PinnedFree> pinned_;
  std::vector<RetiredPins> retired_;  // per client slot
  uint64_t last_pin_scan_mono_ = 0;
  uint64_t last_quarantine_check_mono_ = 0;
  std::vector<ClientInfo> clients_;
  struct ChannelState {
    uint64_t name_hash = 0;  // the name in the pool; 0 = never named
    uint32_t holds = 0;      // opens not yet closed, over all slots
    bool freed = false;      // no holder, no live producer: another name may take it
    uint64_t freed_seq = 0;  // when (channels_freed_): the longest freed goes first
  };
  // Holds a restart found in the channel headers: they follow their process
  // (pid and machine) to whatever slot it re-attaches to.
  struct RecoveredHolds {
    uint64_t pid = 0, machine_hash = 0, since_mono = 0;
    uint32_t old_slot = 0;
    std::vector<uint32_t> channels;
  };
  std::vector<ChannelState> channels_;      // per announcement channel
  std::vector<std::vector<uint32_t>> slot_holds_;  // per client slot: one channel per open
  std::vector<RecoveredHolds> recovered_holds_;
  std::unordered_map<uint64_t, uint32_t> channel_of_;  // name hash -> channel
  uint64_t channels_freed_ = 0;
  uint64_t announce_log_mono_ = 0, announce_logged_ = 0, announce_unlogged_ = 0;
  uint8_t token_[16] = {};  // the pool's credential, copied at Open
  uint64_t refusal_log_mono_ = 0, refusals_logged_ = 0, refusals_unlogged_ = 0;
  std::string machine_;
  uint64_t next_generation_ = 1;
  uint64_t live_entries_ = 0;  // WRITING + COMPLETE + ABORTED, for the load limit
  mutable std::vector<uint64_t> find_candidates_;  // FindLive's scratch (the master's thread)
  uint64_t lookup_samples_ = 0;  // puts since the last probe-length sample
  ProbeHistogram put_lookup_probes_, insert_probes_;  // PutStart lookups (sampled) and inserts
  bool index_drive_logged_ = false;
  uint64_t last_client_check_mono_ = 0;
  MasterStats stats_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> groups_;  // group hash -> slots
  uint64_t eviction_rng_ = 0x9E3779B97F4A7C15ull;
  bool round_blocked_transiently_ = false;  // last round skipped something that will pass
  bool evict_drop_ = false;  // this eviction round needs index slots: it drops, never demotes
  // EvictAhead's round in progress: the sampled window (last access, slot),
  // sorted once complete, and how far the scan and the eviction got.
  std::vector<SampledSlot> ahead_window_;
  uint64_t ahead_start_ = 0, ahead_scanned_ = 0, ahead_complete_ = 0;
  size_t ahead_next_ = 0;  // next window member to evict; SIZE_MAX while scanning
  uint64_t ahead_t0_ = 0, ahead_freed_ = 0, ahead_freed_bytes_ = 0, ahead_used_before_ = 0;
  uint64_t ahead_sampled_mono_ns_ = 0;  // when ahead_window_ was sorted (reused while younger than a lease)
  std::atomic<bool> evict_ahead_wanted_{false};
  uint64_t retired_hits_ = 0, retired_misses_ = 0;  // of reclaimed clients
  uint64_t retired_disk_hits_ = 0, retired_disk_bad_ = 0;  // of reclaimed clients (SSD tier)
  // The SSD tier (--enable_offload), or null. Its state is under mu_ too.
  std::unique_ptr<TierManager> tier_;
  static constexpr uint16_t kMessageTypes = 17;  // every MessageType; kOpNames (master_http.cc) names them
  uint64_t op_requests_[kMessageTypes] = {}, op_failures_[kMessageTypes] = {};  // by MessageType
  // One lock for all entry points: the TCP loop, the ring server, the HTTP
  // thread and the tier thread each call in; the work under it is short and
  // never blocks (see Thread safety above).
  mutable FencedMutex mu_;
  std::unique_ptr<std::atomic<uint64_t>[]> attached_bits_;  // see AttachedWord
};

template <class Request, class Reply, class Count, class Fold>
std::string MasterImpl::FoldBatch(Decoder* d, const char* what, const char* unit, Count&& count, Fold&& fold) {
  Request req;
  Reply reply;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed %s request rejected", what);
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (count(req) > kMaxRequestKeys) {
    MCXL_LOG(kWarn, "master", "%s of %zu %s refused: at most %u", what, count(req), unit, kMaxRequestKeys);
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (!ClientValid(req.client)) {
    reply.status = ErrorCode::ILLEGAL_CLIENT;
  } else {
    fold(req, &reply);
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

}  // namespace mcxl
