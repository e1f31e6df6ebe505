// TierManager: opening the SSD tier, the tier thread, and what it shows
// (statistics, /metrics). Contract in tier_manager.h.
#include "tier_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <grp.h>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "prom_writer.h"

namespace mcxl {

Result<std::unique_ptr<TierManager>> TierManager::Open(const MasterConfig& config, TierHost* host,
                                                        const std::string& owner) {
  if (config.root_fs_dir.empty()) {
    MCXL_LOG(kError, "master", "--enable_offload needs --root_fs_dir (the directory of the SSD tier)");
    return ErrorCode::INVALID_PARAMS;
  }
  if (config.root_fs_dir.size() >= sizeof(Superblock::tier_root)) {
    MCXL_LOG(kError, "master", "--root_fs_dir is longer than %zu bytes", sizeof(Superblock::tier_root) - 1);
    return ErrorCode::INVALID_PARAMS;
  }
  if (config.offload_high_watermark_ratio <= 0 || config.offload_high_watermark_ratio > 1) {
    MCXL_LOG(kError, "master", "--offload_high_watermark_ratio must be in (0, 1]");
    return ErrorCode::INVALID_PARAMS;
  }
  if (!(config.offload_ahead_ratio >= 0 && config.offload_ahead_ratio < 1)) {
    MCXL_LOG(kError, "master", "--offload_ahead_ratio must be in [0, 1) (0 = off)");
    return ErrorCode::INVALID_PARAMS;
  }
  if (config.offload_ahead_ratio > 0 && !config.offload_on_evict)
    MCXL_LOG(kInfo, "master", "--offload_ahead_ratio has no effect without --offload_on_evict (write-through "
             "copies every object already)");
  else if (config.offload_ahead_ratio >= config.eviction_high_watermark_ratio)
    MCXL_LOG(kWarn, "master", "--offload_ahead_ratio=%.2f is not below --eviction_high_watermark_ratio=%.2f: "
             "eviction will find few clean copies", config.offload_ahead_ratio,
             config.eviction_high_watermark_ratio);
  tier::Options o;
  o.root_dir = config.root_fs_dir;
  o.capacity_bytes = config.offload_capacity_bytes;
  // Several segments even in a small tier: only sealed segments are
  // compacted, so a tier of one segment could never reclaim its dead
  // records (once full, every append would fail). Large tiers keep the
  // default size.
  o.segment_bytes = std::clamp<uint64_t>(config.offload_capacity_bytes / 8, 1ull << 20, o.segment_bytes);
  // The pool's access rules (pool.h): owner only, or the pool's group.
  o.file_mode = config.pool_group.empty() ? 0600 : 0660;
  if (!config.pool_group.empty()) {
    std::vector<char> buf(16384);
    struct group gr, *found = nullptr;
    if (getgrnam_r(config.pool_group.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
      MCXL_LOG(kError, "master", "--pool_group '%s' is not a group on this host", config.pool_group.c_str());
      return ErrorCode::INVALID_PARAMS;
    }
    o.group = int64_t(gr.gr_gid);
  }
  o.allow_world_readable = config.allow_world_readable_pool;
  o.owner = owner;
  auto disk = tier::DiskTier::Open(o);
  if (!disk) {
    MCXL_LOG(kError, "master", "SSD tier at %s cannot be opened (%s)", config.root_fs_dir.c_str(),
             ErrorCodeName(disk.error()));
    return disk.error();
  }
  std::unique_ptr<TierManager> t(new TierManager(config, host, std::move(disk.value())));
  if (t->disk_stats_.capacity_effective < config.offload_capacity_bytes)
    MCXL_LOG(kWarn, "master", "SSD tier at %s: the filesystem leaves room for %llu bytes, below "
             "--offload_capacity_bytes=%llu: the tier holds at most that (it follows the free space)",
             config.root_fs_dir.c_str(), (unsigned long long)t->disk_stats_.capacity_effective,
             (unsigned long long)config.offload_capacity_bytes);
  MCXL_LOG(kInfo, "master", "SSD tier at %s: %llu records, %llu of %llu bytes used; %s, promotion on hit %s "
           "(threshold %llu)", config.root_fs_dir.c_str(), (unsigned long long)t->disk_stats_.objects,
           (unsigned long long)t->disk_stats_.used_bytes, (unsigned long long)config.offload_capacity_bytes,
           !config.offload_on_evict ? "write-through after each put"
           : config.offload_ahead_ratio > 0 ? "offload on eviction, clean copies ahead of it"
                                             : "offload on eviction",
           config.promotion_on_hit ? "on" : "off", (unsigned long long)config.promotion_admission_threshold);
  return t;
}

TierManager::TierManager(const MasterConfig& config, TierHost* host, std::unique_ptr<tier::DiskTier> disk)
    : config_(config), host_(*host), disk_(std::move(disk)) {
  // Tests only: a pause before each demotion write (the window in which an
  // object may change under its copy), at most 1 s.
  if (const char* d = getenv("MCXL_TEST_TIER_WRITE_DELAY_MS"))
    test_write_delay_ms_ = std::min(1000ul, strtoul(d, nullptr, 10));
  disk_->SetRelocationCallback(
      [this](std::string_view key, const tier::RecordLocation& from, const tier::RecordLocation& to) {
        OnRelocated(key, from, to);
      });
  disk_stats_ = disk_->stats();
}

TierManager::~TierManager() { Stop(); }

void TierManager::PublishConfig(const TierManager* tier, const MasterConfig& config, Superblock* sb) {
  memset(sb->tier_root, 0, sizeof(sb->tier_root));
  uint64_t cfg = 0;
  if (tier != nullptr) {
    memcpy(sb->tier_root, config.root_fs_dir.data(), config.root_fs_dir.size());
    cfg = kTierEnabled | (config.promotion_on_hit ? kTierPromotionOnHit : 0) |
          (std::min<uint64_t>(config.promotion_admission_threshold, 0xffffffffu) << 32);
  }
  // Relaxed + publish: read by clients at attach, after the incarnation
  // bump that follows (release) in AdoptPool.
  sb->tier_config.store(cfg, std::memory_order_relaxed);
  PublishRange(&sb->tier_config, sizeof(uint64_t) + sizeof(sb->tier_root));
}

void TierManager::Start() {
  thread_ = std::thread([this] { Loop(); });
  if (!removals_.empty()) Wake();
}

void TierManager::Wake() {
  {
    std::lock_guard<std::mutex> l(wake_mu_);
    wake_ = true;
  }
  cv_.notify_one();
}

void TierManager::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(wake_mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void TierManager::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(wake_mu_);
      // With pre-demotion on, polled more often: a retry it set (DemoteAhead)
      // does not wait for a put to wake it.
      auto wait = std::chrono::milliseconds(config_.offload_ahead_ratio > 0 ? 2 : 50);
      cv_.wait_for(l, wait, [this] { return stop_ || wake_; });
      if (stop_) return;
      wake_ = false;
    }
    for (int round = 0; round < 1000000; ++round) {
      bool more = false;
      // Tombstones first and between the steps: removes wait for them.
      more |= FlushTombstones();
      more |= DemoteBatch();
      more |= FlushTombstones();
      more |= PromoteOne();
      more |= Housekeeping();
      more |= DemoteAhead();  // last: it yields to eviction's demotions
      {
        std::lock_guard<std::mutex> l(wake_mu_);
        if (stop_) return;
      }
      if (!more) break;
    }
  }
}

void TierManager::ForgetPool() {
  disk_loc_.clear();  // the records of the old pool stay on disk (orphans until a rebuild)
  demote_q_.clear();
  demote_queued_.clear();
  promote_q_.clear();
  promote_queued_.clear();
  promote_count_.clear();
  no_disk_.clear();
  disk_objects_ = 0;
  pool_clean_bytes_ = 0;
  evict_pending_.clear();
  evict_pending_bytes_ = 0;
  pre_window_.clear();
  pre_next_ = SIZE_MAX;
  pre_scanned_ = pre_complete_ = 0;
  busy_demote_.clear();
  counters_ = Counters{};
}

void TierManager::FillStats(MasterStats* s) const {
  s->tier_enabled = true;
  s->tier_capacity = config_.offload_capacity_bytes;
  s->tier_used_bytes = disk_stats_.used_bytes;
  s->tier_live_bytes = disk_stats_.live_bytes;
  s->tier_records = disk_stats_.objects;
  s->tier_segments = disk_stats_.segments;
  s->tier_compactions = disk_stats_.compactions;
  s->disk_objects = disk_objects_;
  s->pool_clean_bytes = pool_clean_bytes_;
  s->tier_queue = QueueLength();
  s->demotions = counters_.demotions;
  s->demotion_failures = counters_.demotion_failures;
  s->promotions = counters_.promotions;
  s->promotion_failures = counters_.promotion_failures;
  s->tier_writes = counters_.tier_writes;
  s->tier_ahead_writes = counters_.tier_ahead_writes;
  s->demotions_clean = counters_.demotions_clean;
  s->tier_stale_copies = counters_.tier_stale_copies;
  s->tier_evictions = counters_.tier_evictions;
  s->offload_skipped = counters_.offload_skipped;
  s->tier_rebuilt = counters_.tier_rebuilt;
  s->group_promotions = counters_.group_promotions;
  s->tier_checksum_failures = counters_.tier_checksum_failures + disk_stats_.checksum_failures;
  s->disk_hits_reported = counters_.disk_hits_reported;
}

void TierManager::WriteMetrics(PromWriter* out, uint64_t disk_hits, uint64_t disk_bad) const {
  PromWriter& w = *out;
  w.Metric("mooncake_cxl_tier_capacity_bytes", "gauge", "Capacity of the SSD tier (--offload_capacity_bytes)",
           config_.offload_capacity_bytes);
  w.Metric("mooncake_cxl_tier_used_bytes", "gauge", "Bytes of the tier's segment files", disk_stats_.used_bytes);
  w.Metric("mooncake_cxl_tier_live_bytes", "gauge", "Bytes of live records in the tier", disk_stats_.live_bytes);
  w.Metric("mooncake_cxl_tier_records", "gauge", "Live records in the tier", disk_stats_.objects);
  w.Metric("mooncake_cxl_tier_segments", "gauge", "Segment files of the tier", disk_stats_.segments);
  w.Metric("mooncake_cxl_tier_objects", "gauge", "Objects whose value is only in the tier (kOnDisk entries)",
           disk_objects_);
  w.Metric("mooncake_cxl_tier_demotions_total", "counter", "Objects whose pool bytes moved to the tier",
           counters_.demotions);
  w.Metric("mooncake_cxl_tier_demotion_failures_total", "counter", "Appends to the tier that failed",
           counters_.demotion_failures);
  w.Metric("mooncake_cxl_tier_writes_total", "counter", "Records appended (demotions and write-through)",
           counters_.tier_writes);
  w.Metric("mooncake_cxl_tier_ahead_writes_total", "counter",
           "Clean copies written ahead of eviction (--offload_ahead_ratio), also in writes_total",
           counters_.tier_ahead_writes);
  w.Metric("mooncake_cxl_tier_demotions_clean_total", "counter",
           "Demotions that found a clean copy on disk (no disk write on the put path)", counters_.demotions_clean);
  w.Metric("mooncake_cxl_tier_stale_copies_total", "counter",
           "Records written for an object removed or replaced meanwhile (tombstoned, never served)",
           counters_.tier_stale_copies);
  w.Metric("mooncake_cxl_tier_pool_clean_bytes", "gauge",
           "Value bytes of pool objects that also have a clean copy on disk", pool_clean_bytes_);
  w.Metric("mooncake_cxl_tier_promotions_total", "counter", "Objects copied back into the pool",
           counters_.promotions);
  w.Metric("mooncake_cxl_tier_promotion_failures_total", "counter", "Promotions given up (no room, bad record)",
           counters_.promotion_failures);
  w.Metric("mooncake_cxl_tier_evictions_total", "counter", "Objects dropped from the tier for room",
           counters_.tier_evictions);
  w.Metric("mooncake_cxl_tier_offload_skipped_total", "counter",
           "Objects evicted without offload while the demotion queue was full (--offload_force_evict)",
           counters_.offload_skipped);
  w.Metric("mooncake_cxl_tier_disk_hits_total", "counter", "Reads served from the tier (attached clients)",
           disk_hits);
  w.Metric("mooncake_cxl_tier_checksum_failures_total", "counter",
           "Tier records found bad (clients' reads, promotions, compaction): each a miss",
           disk_bad + counters_.tier_checksum_failures + disk_stats_.checksum_failures);
  w.Metric("mooncake_cxl_tier_compactions_total", "counter", "Segments compacted", disk_stats_.compactions);
  w.Metric("mooncake_cxl_tier_rebuilt_objects", "gauge", "Entries rebuilt from the segment files after --format",
           counters_.tier_rebuilt);
  w.Metric("mooncake_cxl_tier_group_promotions_total", "counter",
           "Group members queued for promotion along with another member", counters_.group_promotions);
  w.Metric("mooncake_cxl_tier_tombstones_durable", "gauge",
           "Sequence number of the last tombstone written (removes of disk-resident keys wait for theirs)",
           host_.TombsDurable());
  w.Metric("mooncake_cxl_tier_capacity_effective_bytes", "gauge",
           "Capacity the tier uses: --offload_capacity_bytes, or less when its filesystem has less room",
           disk_stats_.capacity_effective);
  w.Metric("mooncake_cxl_tier_fs_free_bytes", "gauge", "Free bytes of the tier's filesystem (statvfs)",
           disk_stats_.fs_free_bytes);
  w.Metric("mooncake_cxl_tier_degraded", "gauge",
           "1 while tier writes meet a full filesystem (ENOSPC): demotions and tombstones wait or fail", degraded_);
  w.Metric("mooncake_cxl_tier_enospc_total", "counter", "Tier writes that met a full filesystem (ENOSPC, EDQUOT)",
           disk_stats_.enospc);
  w.Metric("mooncake_cxl_tier_write_errors_total", "counter", "Tier writes that failed (the log shows 1 a second)",
           disk_stats_.write_errors);
  w.Metric("mooncake_cxl_tier_tombstone_retries_total", "counter",
           "Tombstone writes that failed and wait for a retry (backoff up to 2 s; their removes wait)",
           counters_.tomb_retries);
  w.Metric("mooncake_cxl_tier_damage_dropped_records", "gauge",
           "Records dropped when the tier was opened: written before a damaged block that may have been a tombstone",
           disk_stats_.damage_dropped);
  w.Metric("mooncake_cxl_tier_queue", "gauge", "Demotions, promotions and tombstones waiting for the tier thread",
           QueueLength());
}

uint64_t TierManager::QueueLength() const {
  return demote_q_.size() + promote_q_.size() + removals_.size() + busy_demote_.size();
}

}  // namespace mcxl
