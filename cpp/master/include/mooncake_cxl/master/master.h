// Master: the only structural writer of a pool. It allocates extents,
// inserts and unlinks index entries, tracks clients and unfinished puts,
// evicts (to the SSD tier under the pool, when there is one), and recovers
// a pool after a restart; clients read and write values one-sidedly.
// Transport-independent: a transport (TcpServer, RingServer) hands it
// decoded frames through the Service interface and calls Tick() periodically.
//
// Create opens the pool at --cxl_path: formats it (--format, or a blank
// device), or recovers it (every COMPLETE object whose header checks out is
// kept; unfinished puts are revoked; clients re-attach). The pool is memory
// every client can write: an entry that disagrees with the master's own
// records is logged, counted (mooncake_cxl_corrupt_entries_total), skipped
// and reclaimed, never trusted. A shrunk pool device stops the master
// (MasterConfig::exit_on_pool_loss).
//
// Thread safety: every method is thread-safe (the TCP loop, its long-request
// worker, the ring server and the HTTP thread call in at once). Whole-index
// scans (remove_by_regex, remove_all, /metrics, /get_all_keys) run in
// slices of kScanSliceSlots index slots, so other requests interleave.
//
// Master is an interface; its implementation is private to the master
// library (a virtual call per request, as through Service already).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "mooncake_cxl/master/warm_scan.h"
#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/service.h"
#include "mooncake_cxl/pool/pool.h"  // pool() is part of the interface

namespace mcxl {

// A new key whose probe window is full frees up to this many of the window's
// least recently used objects (groups whole) at once: the window lies in a
// long run of live entries where the next new keys land too.
constexpr size_t kWindowEvictions = 4;

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
  // Announcement channels at format (0 = DefaultAnnounceChannels), and how
  // many one client may hold open at once (announce.h).
  uint64_t announce_channels = 0;
  uint64_t announce_channels_per_client = 16;
  // At format: "coherent" (one host, CXL 3.x) or "noncoherent" (CXL 2.0
  // multi-host: every publish flushes, see publish.h).
  std::string coherence = "coherent";
  uint64_t default_kv_lease_ttl_ms = 10000;
  uint64_t default_kv_soft_pin_ttl_ms = 30 * 60 * 1000;
  uint64_t max_kv_soft_pin_ttl_ms = 24 * 3600 * 1000;
  double eviction_high_watermark_ratio = 0.90;
  double eviction_ratio = 0.05;
  // The index is a capacity too: above this share of its entries live, puts
  // evict (down to it minus eviction_ratio) by the same rules. Up to 0.8,
  // linear probing's probes stay short (ObjectIndex::kMaxProbeSlots bounds
  // them anyway). 0.1 .. 0.95.
  double index_high_watermark_ratio = 0.80;
  bool allow_evict_soft_pinned_objects = true;
  uint64_t client_ttl_s = 10;
  uint64_t put_start_discard_timeout_sec = 30;
  uint64_t put_start_release_timeout_sec = 600;
  // Pool file access (access.h): group of a pool file the master creates
  // (0660 then, else 0600), and whether a pool others may read or write may
  // be formatted.
  std::string pool_group;
  bool allow_world_readable_pool = false;
  // Populate the pool's pages after start, on a background thread
  // (populate.h): the metadata always, the data region on tmpfs/hugetlbfs
  // (allocated, so the whole file is resident), so that puts do not pay
  // first-touch faults. Start does not wait for it.
  bool prefault_pool = true;
  // When Tick finds the pool device smaller than the mapping: log and
  // _exit(kPoolLostExitCode) (the master binary), or, false (in-process
  // users, tests), refuse every request with UNAVAILABLE_IN_CURRENT_STATUS.
  bool exit_on_pool_loss = false;
  // The SSD tier under the pool (its contract: the master's tier sources),
  // Mooncake's flag names.
  // enable_offload: objects get a copy in segment files under root_fs_dir;
  // offload_on_evict: written when eviction picks them (write back), else
  // after each put completes (write through). Eviction then frees the
  // pool bytes of an object with a copy and keeps its entry (kOnDisk).
  bool enable_offload = false;
  bool offload_on_evict = false;
  bool promotion_on_hit = false;
  uint64_t promotion_admission_threshold = 2;  // disk reads before a copy back into the pool
  std::string root_fs_dir;
  uint64_t offload_capacity_bytes = 64ull << 30;
  // Above this share of the tier's capacity, its least recently used
  // objects are dropped (entry and record) before more are appended.
  double offload_high_watermark_ratio = 0.95;
  // Mooncake's: with offload_force_evict, eviction drops (as without a tier)
  // the objects it picks while offloading_queue_limit demotions are already
  // waiting, so puts never wait for the disk; without it (default) puts at
  // the watermark wait for demotions (OBJECT_REPLICA_BUSY, retried): no
  // object is lost, and puts go at the tier's write speed.
  bool offload_force_evict = false;
  uint64_t offloading_queue_limit = 50000;
  // Ours (with --offload_on_evict): while the pool's bytes without a disk
  // copy exceed this share of its capacity, the tier thread writes clean
  // copies of the objects eviction would pick next (coldest first) in the
  // background, without evicting them; eviction at the watermark then only
  // converts them (no disk write on the put path). 0 = off (Mooncake's
  // behaviour: nothing reaches the disk below the watermark).
  double offload_ahead_ratio = 0;
  // Remote clients (hosts outside the pod, over Mooncake's Transfer Engine):
  // te_protocol ("" = off, "tcp", "rdma") is what the process serving the
  // pool's mapping speaks; it writes its session to te_session_file, which
  // each remote Attach reads and advertises. remote_secret: what a client
  // without the pool's token must present (--auth_token_file); "" refuses
  // every such Attach.
  std::string te_protocol;
  std::string te_session_file;
  std::string remote_secret;
  // --enable_ha (master_ha.h, master_fence.h): the term this master was
  // elected with (0 = no HA: single-master mode) and the MonoNs() before
  // which its etcd lease is surely valid. The master raises the pool's term
  // to it before its first structural write and checks both before each
  // write batch, exiting (kDeposedExitCode) when either says it no longer leads.
  uint64_t ha_term = 0;
  const std::atomic<uint64_t>* ha_lease_deadline = nullptr;
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
  uint64_t index_live_entries = 0;  // entries in use (complete, unfinished, aborted)
  uint64_t index_evicted_keys = 0;  // of evicted_keys, while the index, not the data region, was over its watermark
  uint64_t index_window_evictions = 0;  // of those, to free a slot of a key's full probe window
  uint64_t index_evicted_disk_keys = 0;  // of index_evicted_keys, kOnDisk objects (entry and SSD record dropped)
  uint64_t recovered_objects = 0, dropped_on_recovery = 0;
  uint64_t refused_requests = 0;  // no credential, or not from the named client's connection
  uint64_t announce_refusals = 0;        // channel opens refused: per-client cap, or every channel held
  uint64_t announce_channels_freed = 0;  // channels whose last holder went
  uint64_t corrupt_entries = 0;  // entries found disagreeing with the master's records
  bool pool_lost = false;        // the device shrank: nothing is served
  uint64_t pool_replacements = 0;  // devices found replaced and formatted (CheckReplacedDevice)
  // SSD tier
  bool tier_enabled = false;
  uint64_t tier_capacity = 0, tier_used_bytes = 0, tier_live_bytes = 0, tier_records = 0, tier_segments = 0;
  uint64_t disk_objects = 0;   // kOnDisk entries
  uint64_t demotions = 0, demotion_failures = 0, promotions = 0, promotion_failures = 0;
  uint64_t tier_writes = 0;    // records appended (demotions and write-through copies)
  uint64_t tier_ahead_writes = 0;  // of those, clean copies written ahead of eviction (--offload_ahead_ratio)
  uint64_t demotions_clean = 0;    // evictions that found a clean copy on disk (no write on the put path)
  uint64_t tier_stale_copies = 0;  // copies whose object changed while written (tombstoned, never used)
  uint64_t pool_clean_bytes = 0;   // value bytes of pool objects that have a clean copy on disk
  uint64_t tier_evictions = 0; // objects dropped from the tier for room
  uint64_t offload_skipped = 0;  // evicted without offload (--offload_force_evict, queue full)
  uint64_t tier_rebuilt = 0;   // entries rebuilt from the segment files after --format
  uint64_t group_promotions = 0;  // group members queued for promotion with another member
  uint64_t tier_checksum_failures = 0, tier_compactions = 0, tier_queue = 0;
  uint64_t disk_hits = 0;      // reads served from the tier, summed over clients
  uint64_t disk_hits_reported = 0;  // of those, reported to the master (promotion on hit)
  uint64_t disk_checksum_failures = 0;  // records clients found bad (a miss each)
};

class Master : public Service {
 public:
  // Opens (formats or recovers) the pool and, with --enable_offload, the
  // SSD tier; INVALID_PARAMS for a bad flag, the pool's error otherwise.
  // `premapped`: the pool at --cxl_path already mapped (a standby's, so
  // that a takeover takes no page faults); else Create maps it. `warm`: a
  // standby's scan of that pool (warm_scan.h), used by its recovery only.
  static Result<std::unique_ptr<Master>> Create(const MasterConfig& config,
                                                std::unique_ptr<Pool> premapped = nullptr,
                                                std::unique_ptr<WarmScan> warm = nullptr);
  ~Master() override = default;

  // Service, as the master answers it:
  //  * Handle: one request; the reply payload (status first) is always
  //    valid, also for a malformed request. Access (access.h): Attach must
  //    carry the pool's token; every other request but Ping must name
  //    (slot, generation) of the client bound to `conn_slot`, else it is
  //    ILLEGAL_CLIENT (one rate-limited log line) and changes nothing.
  //    RemoveByRegex and RemoveAll run in slices (a transport runs them off
  //    its main loop); over a ring they are refused with NOT_SUPPORTED.
  //  * ServeRing: every request waiting in client `slot`'s ring; garbage
  //    gets a kError reply and a log line, and the ring is resynchronised.
  //  * Tick: periodic work (pending puts, pins, clients, the pool device's
  //    size); returns how long the caller may sleep.
  //  * IdleWork: eviction ahead of the watermark, in the ring server's idle
  //    moments, so that a put rarely runs an eviction round inline.
  //  * pool(): the pool served now (a replaced device swaps it; the old one
  //    stays mapped for a grace period).

  // Index slots one hold of the master's lock covers in a scan.
  static constexpr uint64_t kScanSliceSlots = 4096;
  // Longest remove_by_regex pattern accepted (RE2 syntax).
  static constexpr size_t kMaxPatternBytes = 64 * 1024;
  // Tenants /metrics names (master_tenant_*{tenant=...}); the rest: "_other".
  static constexpr size_t kMaxTenantsShown = 64;

  virtual MasterStats stats() const = 0;
  // For the monitoring port. The first two settle pending puts first, so
  // counts include fresh completions.
  virtual std::string MetricsText() = 0;
  virtual std::string SummaryLine() = 0;
  // 200 + JSON body, or 404 when the key is not stored (in `tenant`'s
  // namespace, tenant.h).
  virtual std::pair<int, std::string> QueryKey(std::string_view key, std::string_view tenant = "default") const = 0;
  // Complete keys of `tenant` (without its prefix), one per line, at most
  // `limit`; *truncated when more exist. tenant "*": every key, as
  // "tenant<TAB>key".
  virtual std::string AllKeys(uint64_t limit, bool* truncated, std::string_view tenant = "default") const = 0;
  virtual std::string AllSegments() const = 0;
  virtual const MasterConfig& config() const = 0;

 protected:
  Master() = default;
};

// The serving process (mooncake_cxl.pool_te) writes "session\npid\n" to
// te_session_file and removes it when it stops cleanly; a killed one leaves
// it. This removes such a file when the pid it names is gone from this host
// (the serving process runs beside the master), so a dead session is neither
// advertised nor left behind; a live writer's file stays, since the serving
// process may outlive masters. True if it removed one.
bool DropDeadTeSession(const std::string& path);

}  // namespace mcxl
