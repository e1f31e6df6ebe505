// Master: the only structural writer of a pool. Allocates extents, inserts
// and unlinks index entries, tracks clients and unfinished puts, and
// recovers a pool after a restart. Transport-independent: a transport hands
// it decoded frames (Handle) and calls Tick() periodically.
//
// Object life as the master sees it (docs/architecture.md, "Object life"):
//   PutStart: allocate extent, write ObjectHeader + key, insert WRITING entry,
//             remember it as pending. The client copies the value and CASes the
//             entry COMPLETE itself; Tick notices and accounts for it.
//   Remove:   tombstone (seqlock), then free the extent, or, while a client's
//             pin table names the object (a live BufferHandle), keep the
//             extent until the pin is gone. An unforced remove of a pinned
//             object is OBJECT_HAS_LEASE, like a leased one.
//   Pending puts whose client died or that outlived
//   --put_start_discard_timeout_sec are revoked; their extent is freed at once
//   when the client is known dead, else after --put_start_release_timeout_sec
//   (a stalled but live client may still be writing into it).
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
// Atomics in master*.cc follow three rules, so each load and store there
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
// Thread safety: none. One thread calls Create, Handle, Tick and OnDisconnect.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mooncake_cxl/error_code.h"
#include "mooncake_cxl/extent_allocator.h"
#include "mooncake_cxl/object_index.h"
#include "mooncake_cxl/pool.h"
#include "mooncake_cxl/rpc_protocol.h"

namespace mcxl {

struct MasterConfig {
  std::string rpc_address = "0.0.0.0";
  int64_t rpc_port = 50051;
  int64_t metrics_port = 9003;
  std::string metrics_host = "0.0.0.0";
  bool enable_cxl = true;
  std::string cxl_path = "/dev/dax0.0";
  uint64_t cxl_size = 0;  // 0 = the device's size
  bool format = false;
  uint64_t index_capacity = 0;  // 0 = DefaultIndexCapacity(pool size)
  uint64_t client_slots = 64;
  // At format: "coherent" (one host, CXL 3.x) or "noncoherent" (CXL 2.0
  // multi-host: every publish flushes, see publish.h).
  std::string coherence = "coherent";
  uint64_t default_kv_lease_ttl_ms = 10000;
  uint64_t default_kv_soft_pin_ttl_ms = 30 * 60 * 1000;
  uint64_t max_kv_soft_pin_ttl_ms = 24 * 3600 * 1000;
  double eviction_high_watermark_ratio = 0.90;
  double eviction_ratio = 0.05;
  bool allow_evict_soft_pinned_objects = true;
  uint64_t client_ttl_s = 10;
  uint64_t put_start_discard_timeout_sec = 30;
  uint64_t put_start_release_timeout_sec = 600;
};

struct MasterStats {
  uint64_t complete_keys = 0;   // COMPLETE entries
  uint64_t soft_pinned_keys = 0, hard_pinned_keys = 0;
  uint64_t pending_puts = 0;    // WRITING entries
  uint64_t attached_clients = 0;
  uint64_t allocated_bytes = 0;
  uint64_t capacity_bytes = 0;
  uint64_t put_requests = 0, put_failures = 0;
  uint64_t remove_requests = 0, remove_failures = 0;
  uint64_t revoked_puts = 0;
  uint64_t eviction_rounds = 0, eviction_rounds_empty = 0;  // empty: freed nothing
  uint64_t evicted_keys = 0, evicted_bytes = 0;
  uint64_t recovered_objects = 0, dropped_on_recovery = 0;
};

class Master {
 public:
  static Result<std::unique_ptr<Master>> Create(const MasterConfig& config);

  // Answers one request; the reply payload (status first) is always valid,
  // also for a malformed request. `conn_slot` is the client slot bound to the
  // calling connection (updated by Attach), or kNoSlot.
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  std::string Handle(uint16_t type, std::string_view payload, uint32_t* conn_slot);
  // The connection that attached `slot` is gone.
  void OnDisconnect(uint32_t slot);
  // CXL RPC: answers every request waiting in client `slot`'s request ring
  // (called by the RingServer thread when it sees one). Garbage in the ring
  // gets a kError reply and a log line; the ring is resynchronised.
  void ServeRing(uint32_t slot);
  // Attached client slots, as a bitmap the RingServer polls without the lock.
  bool SlotAttached(uint32_t slot) const {
    // Acquire: pairs with the release in SetAttached; the rings were reset.
    return (attached_bits_[slot / 64].load(std::memory_order_acquire) >> (slot % 64)) & 1;
  }
  uint32_t client_slot_count() const { return uint32_t(clients_.size()); }
  // Periodic work; returns how long the caller may sleep before the next call.
  uint64_t Tick();

  MasterStats stats() const;
  // For the monitoring port (master_http.cc); thread-safe like Handle. The
  // first two settle pending puts first, so counts include fresh completions.
  std::string MetricsText();
  std::string SummaryLine();
  // 200 + JSON body, or 404 when the key is not stored.
  std::pair<int, std::string> QueryKey(std::string_view key) const;
  std::string AllKeys() const;
  std::string AllSegments() const;
  const Pool& pool() const { return *pool_; }
  const MasterConfig& config() const { return config_; }

 private:
  struct PendingPut {
    uint64_t entry_slot, generation;
    uint32_t owner;
    uint64_t put_id;  // the owner's PutStart that made it
    uint64_t start_mono_ns;
    bool upsert;
  };
  struct DeferredFree {
    uint64_t handle;
    uint64_t release_mono_ns;
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
    bool connected = false;
    uint64_t attach_ns = 0;  // NowNs at attach: heartbeat grace
    std::vector<uint64_t> abandoned;  // recent put ids it gave up on (bounded)
  };

  explicit Master(const MasterConfig& config) : config_(config) {}
  Status Open();

  // ---- dispatch and index lookups (master.cc) ----
  std::string Dispatch(uint16_t type, std::string_view payload, uint32_t* conn_slot);
  void CountOp(uint16_t type, const std::string& reply);
  // Live (WRITING or COMPLETE) entries of `key`, in probe order.
  void FindLive(std::string_view key, uint64_t hash, std::vector<uint64_t>* out) const;
  std::string_view KeyOf(uint64_t entry_slot) const;
  // The header the master wrote for a live (or just unlinked) entry: trusted.
  const ObjectHeader& HeaderOf(uint64_t entry_slot) const;

  // ---- recovery (master_recovery.cc) ----
  void Recover();

  // ---- clients and reclaim (master_clients.cc) ----
  void SetAttached(uint32_t slot, bool attached);
  std::string HandleAttach(Decoder* d, uint32_t* conn_slot);
  std::string HandleDetach(Decoder* d, uint32_t* conn_slot);
  std::string HandleHeartbeat(Decoder* d);
  bool ClientValid(const ClientRef& ref) const;
  void ReclaimClient(uint32_t slot, const char* why);
  void CheckClients();

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
  uint64_t UnlinkWithOlder(uint64_t slot, uint64_t* bytes);
  // True when an older entry of `slot`'s key is still WRITING: it may yet be
  // published, so `slot` must not go before it (it would become current).
  bool OlderUnfinished(uint64_t slot) const;
  void CheckPending();

  // ---- removal and deferred frees (master_remove.cc) ----
  std::string HandleRemove(Decoder* d, bool batch);
  std::string HandleRemoveMatching(Decoder* d, bool all);
  ErrorCode RemoveKey(std::string_view key, bool force);
  void Unlink(uint64_t entry_slot, bool free_now, uint64_t release_mono_ns);
  // True when a live or retired pin table names the object of this
  // generation (zero-copy views hold a pin that removal and eviction respect).
  bool IsPinned(uint64_t generation) const;
  void ReleaseUnpinned();

  // ---- pin tables outliving their attachment (master_pins.cc) ----
  // Pins of a live process survive its slot's reclaim, its close() and a
  // master restart: while a BufferHandle lives its bytes never change.
  bool PinTableLive(uint32_t slot) const { return clients_[slot].attached || retired_[slot].active; }
  bool TableHasPins(uint32_t slot) const;
  // At reclaim (after the slot's generation was cleared): keeps the table as
  // retired when the owner may be alive and holds views, else clears it.
  void RetireOrClearPins(uint32_t slot, const ClientInfo& was, bool owner_dead);
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
  struct PinSet;
  // Evicts unprotected COMPLETE objects, least recently used first, until
  // `bytes` and `entries` are freed or nothing evictable is left; returns the
  // number of objects evicted. Logs one line per round.
  uint64_t EvictRound(uint64_t bytes, uint64_t entries, const char* why);
  uint64_t LastAccessNs(uint64_t slot, uint64_t ttl_ns) const;
  enum class Protection { kNone, kTransient /* lease, view, unfinished */, kPermanent /* hard pin */ };
  Protection Protected(uint64_t slot, uint64_t now, const PinSet& pins) const;
  bool SoftPinActive(uint64_t slot, uint64_t now) const;
  // Evicts `slot` and, when it belongs to a group, every member of the group;
  // nothing when any member is protected. Adds to *bytes; returns objects.
  uint64_t EvictWithGroup(uint64_t slot, uint64_t now, const PinSet& pins, uint64_t* bytes);
  void AddToGroup(uint64_t slot);
  void RemoveFromGroup(uint64_t slot);
  uint64_t IndexLimit() const { return index_->capacity() / 8 * 7; }

  // ---- monitoring (master_http.cc) ----
  struct ReadCountsResult {
    uint64_t hits, misses, clients;
  };
  ReadCountsResult ReadCounts() const;  // REQUIRES: mu_ held

  MasterConfig config_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<ObjectIndex> index_;
  std::unique_ptr<ExtentAllocator> alloc_;
  // Per index slot, for live entries: the allocator handle of its extent, and
  // whether the master has counted it COMPLETE (settles the race between a
  // remove and the Tick that notices the completion).
  // (Group, soft pin and extent size live in the ObjectHeader the master
  // wrote: read from there, so the master's own memory per object stays small.)
  struct EntryMeta {
    uint64_t extent = 0;  // allocator handle
    bool counted = false;
  };
  std::vector<EntryMeta> entry_meta_;
  std::vector<PendingPut> pending_;
  std::vector<DeferredFree> deferred_;
  std::vector<PinnedFree> pinned_;
  std::vector<RetiredPins> retired_;  // per client slot
  uint64_t last_pin_scan_mono_ = 0;
  std::vector<ClientInfo> clients_;
  std::string machine_;
  uint64_t next_generation_ = 1;
  uint64_t live_entries_ = 0;  // WRITING + COMPLETE + ABORTED, for the load limit
  uint64_t last_client_check_mono_ = 0;
  MasterStats stats_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> groups_;  // group hash -> slots
  uint64_t eviction_rng_ = 0x9E3779B97F4A7C15ull;
  bool round_blocked_transiently_ = false;  // last round skipped something that will pass
  uint64_t retired_hits_ = 0, retired_misses_ = 0;  // of reclaimed clients
  static constexpr uint16_t kMessageTypes = 16;
  uint64_t op_requests_[kMessageTypes] = {}, op_failures_[kMessageTypes] = {};  // by MessageType
  // One lock for all entry points: the TCP loop, the ring server and the
  // HTTP thread each call in; the work under it is short and never blocks.
  mutable std::mutex mu_;
  std::unique_ptr<std::atomic<uint64_t>[]> attached_bits_;  // see SlotAttached
};

}  // namespace mcxl
