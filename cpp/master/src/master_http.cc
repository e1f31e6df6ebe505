// What the master shows on its monitoring port: Prometheus text, a summary
// line, and the key/segment queries SGLang and operators use. Metric names
// follow mooncake_master's where the meaning is the same.
// Atomics follow the three rules stated in master_impl.h.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "master_impl.h"
#include "prom_writer.h"
#include "mooncake_cxl/common/tenant.h"

namespace mcxl {
namespace {

std::string JsonEscape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  snprintf(buf, sizeof(buf), "%.2f %s", bytes, units[u]);
  return buf;
}

const char* kOpNames[] = {"error", "ping", "attach", "detach", "put_start", "remove", "batch_remove",
                          "remove_by_regex", "remove_all", "heartbeat", "promote", "settle",
                          "announce_open", "announce_close", "locate", "publish", "leases"};

}  // namespace

bool MasterImpl::CountsAreCurrent(uint32_t slot) const {
  // Relaxed: a statistic. Until the attachment's client zeroed its counters
  // (with heartbeat_generation, one line) they are the last one's, retired.
  return clients_[slot].remote ||
         pool_->client_slot(slot)->heartbeat_generation.load(std::memory_order_relaxed) == clients_[slot].generation;
}

MasterImpl::ReadCountsResult MasterImpl::ReadCounts() const {
  // Hits and misses are counted by the clients (reads never reach us), each
  // in its own slot; reclaimed clients' counts were retired into ours.
  ReadCountsResult r{retired_hits_, retired_misses_, 0};
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    if (!clients_[c].attached) continue;
    ++r.clients;
    if (!CountsAreCurrent(c)) continue;
    // Relaxed: statistics.
    r.hits += pool_->client_slot(c)->get_hits.load(std::memory_order_relaxed);
    r.misses += pool_->client_slot(c)->get_misses.load(std::memory_order_relaxed);
  }
  return r;
}

MasterImpl::DiskReads MasterImpl::DiskReadCounts() const {
  // As ReadCounts: counted by the clients reading the SSD tier.
  DiskReads r{retired_disk_hits_, retired_disk_bad_};
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    if (!clients_[c].attached || !CountsAreCurrent(c)) continue;
    // Relaxed: statistics.
    r.hits += pool_->client_slot(c)->disk_hits.load(std::memory_order_relaxed);
    r.bad += pool_->client_slot(c)->disk_checksum_failures.load(std::memory_order_relaxed);
  }
  return r;
}

std::string MasterImpl::MetricsText() {
  // The index scan runs in slices of mu_ (see master.h): the counts are of
  // moments a few milliseconds apart, which a gauge can afford.
  {
    std::lock_guard<FencedMutex> lock(mu_);
    if (pool_lost_) {  // the pool is not to be touched again
      PromWriter w;
      w.Metric("mooncake_cxl_pool_lost", "gauge", "1 when the pool device shrank: nothing is served", 1);
      return std::move(w.text());
    }
  }
  uint64_t leased = 0, hard = 0, soft = 0;
  ProbeHistogram hit;  // per live entry: the slots a lookup that finds it reads
  // Per tenant: keys and value bytes; at most kMaxTenantsShown tenants by
  // name (bounded label cardinality), the rest summed under "_other".
  struct TenantCount {
    std::string name;
    uint64_t keys = 0, bytes = 0;
  };
  std::vector<TenantCount> tenants;
  TenantCount other{"_other"};
  uint64_t cap, epoch;
  {
    std::lock_guard<FencedMutex> lock(mu_);
    cap = index_->capacity(), epoch = pool_epoch_;  // fixed until a replaced device is adopted
  }
  for (uint64_t s = 0; s < cap;) {
    {
      std::lock_guard<FencedMutex> lock(mu_);
      if (pool_epoch_ != epoch) break;  // the device was replaced: counts below are the new pool's
      uint64_t now = NowNs();
      for (uint64_t end = std::min(cap, s + kScanSliceSlots); s < end; ++s) {
        const IndexEntry& e = index_->entry(s);
        if (!Readable(StateOf(e.state_gen.load(std::memory_order_relaxed)))) continue;
        if (!CheckedLive(s)) continue;  // corrupt: counted below, reclaimed by Tick
        hit.Add(index_->Distance(s, e.key_hash.load(std::memory_order_relaxed)) + 1);
        if (index_->LeaseUntil(s) > now) ++leased;
        if (e.flags.load(std::memory_order_relaxed) & kFlagHardPin) ++hard;
        if (SoftPinActive(s, now)) ++soft;
        std::string_view tenant, key;
        SplitStoredKey(KeyOf(s), &tenant, &key);
        TenantCount* tc = nullptr;
        for (auto& t : tenants)
          if (t.name == tenant) tc = &t;
        if (tc == nullptr && tenants.size() < kMaxTenantsShown) tc = &tenants.emplace_back(TenantCount{std::string(tenant)});
        if (tc == nullptr) tc = &other;
        ++tc->keys;
        tc->bytes += e.value_size.load(std::memory_order_relaxed);
      }
    }
    if (s < cap) SlicePause();
  }
  std::lock_guard<FencedMutex> lock(mu_);
  CheckPending();  // count puts completed since the last Tick
  PromWriter w;
  auto [hits, misses, clients] = ReadCounts();
  w.Metric("master_total_capacity_bytes", "gauge", "Bytes of the pool's data region", alloc_->capacity());
  w.Metric("master_allocated_bytes", "gauge", "Bytes allocated to objects (complete, unfinished, pinned)",
           alloc_->used_bytes());
  w.Metric("master_key_count", "gauge", "Complete objects", stats_.complete_keys);
  w.Metric("master_soft_pin_key_count", "gauge", "Objects with an active soft pin", soft);
  w.Header("master_objects", "gauge", "Objects by state");
  w.Sample("master_objects", "{state=\"complete\"}", double(stats_.complete_keys));
  w.Sample("master_objects", "{state=\"writing\"}", double(pending_.size()));
  w.Sample("master_objects", "{state=\"leased\"}", double(leased));
  w.Sample("master_objects", "{state=\"hard_pinned\"}", double(hard));
  w.Sample("master_objects", "{state=\"soft_pinned\"}", double(soft));
  w.Sample("master_objects", "{state=\"removed_but_viewed\"}", double(pinned_.size()));
  // Extents of revoked puts kept while their writer may still run.
  w.Sample("master_objects", "{state=\"revoked_quarantined\"}", double(deferred_.size()));
  if (other.keys > 0) tenants.push_back(other);
  w.Header("master_tenant_key_count", "gauge", "Complete objects per tenant (at most 64 tenants named)");
  for (const auto& t : tenants)
    w.Sample("master_tenant_key_count", ("{tenant=\"" + LabelEscape(t.name) + "\"}").c_str(), double(t.keys));
  w.Header("master_tenant_value_bytes", "gauge", "Value bytes of complete objects per tenant");
  for (const auto& t : tenants)
    w.Sample("master_tenant_value_bytes", ("{tenant=\"" + LabelEscape(t.name) + "\"}").c_str(), double(t.bytes));
  w.Metric("master_index_capacity", "gauge", "Entries of the object index", index_->capacity());
  WriteSegmentMetrics(&w);
  WriteIndexMetrics(&w, hit);
  w.Metric("master_client_count", "gauge", "Attached clients", clients);
  w.Metric("master_active_clients", "gauge", "Attached clients (Mooncake's name)", clients);
  w.Metric("master_evicted_key_count", "counter", "Objects evicted", stats_.evicted_keys);
  w.Metric("master_evicted_size_bytes", "counter", "Bytes evicted", stats_.evicted_bytes);
  w.Metric("master_successful_evictions_total", "counter", "Eviction rounds that freed something",
           stats_.eviction_rounds - stats_.eviction_rounds_empty);
  w.Metric("master_attempted_evictions_total", "counter", "Eviction rounds run", stats_.eviction_rounds);
  w.Metric("master_get_hits_total", "counter", "Reads (get, get_into, get_buffer) that found the key", hits);
  w.Metric("master_get_misses_total", "counter", "Reads that did not find the key", misses);
  w.Metric("master_revoked_puts_total", "counter", "Unfinished puts revoked (client died or too slow)",
           stats_.revoked_puts);
  w.Metric("master_refused_requests_total", "counter",
           "Requests refused for want of the pool's token or an attached client (ILLEGAL_CLIENT)",
           stats_.refused_requests);
  uint64_t channels_in_use = 0;
  for (const auto& c : channels_) channels_in_use += c.name_hash != 0 && !c.freed;
  w.Metric("mooncake_cxl_announce_channels_in_use", "gauge",
           "Announcement channels held open or with a live producer", channels_in_use);
  w.Metric("mooncake_cxl_announce_channels", "gauge", "Announcement channels of the pool",
           uint64_t(channels_.size()));
  w.Metric("mooncake_cxl_announce_refusals_total", "counter",
           "Announcement channel opens refused (the per-client cap, or every channel held)", stats_.announce_refusals);
  w.Metric("mooncake_cxl_announce_channels_freed_total", "counter",
           "Announcement channels freed once no client held them and their producer was gone",
           stats_.announce_channels_freed);
  w.Metric("master_put_object_requests_total", "counter", "Objects asked for by PutStart", stats_.put_requests);
  w.Metric("master_put_object_failures_total", "counter", "Objects PutStart refused", stats_.put_failures);
  w.Metric("mooncake_cxl_pool_replaced_total", "counter",
           "Times the device behind --cxl_path was found replaced by a blank one and formatted", stats_.pool_replacements);
  w.Metric("mooncake_cxl_corrupt_entries_total", "counter",
           "Index entries found disagreeing with the master's records (skipped and reclaimed)", corrupt_entries_);
  if (tier_) {
    DiskReads reads = DiskReadCounts();
    tier_->WriteMetrics(&w, reads.hits, reads.bad);
  }
  for (uint16_t t = 1; t < sizeof(kOpNames) / sizeof(kOpNames[0]); ++t) {
    std::string req = std::string("master_") + kOpNames[t] + "_requests_total";
    std::string fail = std::string("master_") + kOpNames[t] + "_failures_total";
    w.Metric(req.c_str(), "counter", "Requests received", op_requests_[t]);
    w.Metric(fail.c_str(), "counter", "Requests answered with an error", op_failures_[t]);
  }
  return std::move(w.text());
}

void MasterImpl::WriteIndexMetrics(PromWriter* w, const ProbeHistogram& hit) const {
  uint64_t cap = index_->capacity();
  w->Metric("mooncake_cxl_index_entries_in_use", "gauge", "Index entries in use (complete, unfinished, aborted)",
            live_entries_);
  w->Header("mooncake_cxl_index_load_ratio", "gauge", "Share of the index's entries in use");
  w->Sample("mooncake_cxl_index_load_ratio", "", double(live_entries_) / double(cap));
  w->Header("mooncake_cxl_index_high_watermark_ratio", "gauge", "Index load past which puts evict");
  w->Sample("mooncake_cxl_index_high_watermark_ratio", "", config_.index_high_watermark_ratio);
  w->Metric("mooncake_cxl_index_max_probe", "gauge", "Longest probe sequence (slots past an entry's home)",
            index_->max_probe());
  w->Metric("mooncake_cxl_index_evicted_keys_total", "counter",
            "Objects evicted for index slots while the data region was below its watermark",
            stats_.index_evicted_keys);
  w->Metric("mooncake_cxl_index_window_evictions_total", "counter",
            "Of those, objects evicted because a new key's probe window was full", stats_.index_window_evictions);
  w->Metric("mooncake_cxl_index_evicted_disk_keys_total", "counter",
            "Of the objects evicted for the index, disk-resident ones (entry and SSD record dropped)",
            stats_.index_evicted_disk_keys);
  // Cumulative histograms of the puts' probes, and a snapshot of the entries'.
  w->Header("mooncake_cxl_index_probe_length", "histogram",
            "Index slots read by each put's lookup of its key (op=put_lookup) and to place its entry (op=insert)");
  auto buckets = [&](const char* name, const char* op, const ProbeHistogram& h, bool sum) {
    uint64_t acc = 0;
    char labels[96];
    for (int b = 0; b < ProbeHistogram::kBuckets; ++b) {
      acc += h.counts[b];
      if (b + 1 < ProbeHistogram::kBuckets)
        snprintf(labels, sizeof(labels), "{op=\"%s\",le=\"%llu\"}", op, 1ull << b);
      else
        snprintf(labels, sizeof(labels), "{op=\"%s\",le=\"+Inf\"}", op);
      w->Sample((std::string(name) + "_bucket").c_str(), labels, double(acc));
    }
    if (!sum) return;
    snprintf(labels, sizeof(labels), "{op=\"%s\"}", op);
    w->Sample((std::string(name) + "_sum").c_str(), labels, double(h.sum));
    w->Sample((std::string(name) + "_count").c_str(), labels, double(h.n));
  };
  buckets("mooncake_cxl_index_probe_length", "put_lookup", put_lookup_probes_, true);
  buckets("mooncake_cxl_index_probe_length", "insert", insert_probes_, true);
  w->Header("mooncake_cxl_index_hit_probe_entries_bucket", "gauge",
            "Readable entries a lookup reaches within le slots (a snapshot of the index now)");
  buckets("mooncake_cxl_index_hit_probe_entries", "hit", hit, false);
}

std::string MasterImpl::SummaryLine() {
  std::lock_guard<FencedMutex> lock(mu_);
  if (pool_lost_) return "CXL pool lost: the pool device shrank; nothing is served";
  CheckPending();  // count puts completed since the last Tick
  auto [hits, misses, clients] = ReadCounts();
  char buf[512];
  double cap = double(alloc_->capacity());
  snprintf(buf, sizeof(buf),
           "CXL pool: %s / %s (%.1f%%) | Index: %.1f%% | Keys: %" PRIu64 " (writing: %zu) | Clients: %" PRIu64
           " | Evicted: %" PRIu64 " keys, %s in %" PRIu64 " rounds | Hit rate: %.1f%% (%" PRIu64 "/%" PRIu64 ")",
           Human(double(alloc_->used_bytes())).c_str(), Human(cap).c_str(),
           cap > 0 ? 100.0 * double(alloc_->used_bytes()) / cap : 0.0,
           100.0 * double(live_entries_) / double(index_->capacity()), stats_.complete_keys, pending_.size(),
           clients, stats_.evicted_keys, Human(double(stats_.evicted_bytes)).c_str(), stats_.eviction_rounds,
           hits + misses ? 100.0 * double(hits) / double(hits + misses) : 0.0, hits, hits + misses);
  return buf;
}

std::pair<int, std::string> MasterImpl::QueryKey(std::string_view user_key, std::string_view tenant) const {
  std::string key = TenantPrefix(tenant);
  key.append(user_key);
  std::lock_guard<FencedMutex> lock(mu_);
  std::vector<uint64_t> live;
  if (pool_lost_)
    return {503, "{\"success\":false,\"error_code\":-1010,\"error_message\":\"UNAVAILABLE_IN_CURRENT_STATUS\"}"};
  if (!key.empty() && key.size() <= kMaxKeyLength) FindLive(key, KeyHash(key), &live);
  for (uint64_t s : live) {
    const IndexEntry& e = index_->entry(s);
    uint64_t sg = e.state_gen.load(std::memory_order_acquire);
    if (!Readable(StateOf(sg))) continue;
    uint64_t now = NowNs(), lease = index_->LeaseUntil(s);
    char buf[512];
    snprintf(buf, sizeof(buf),
             "{\"success\":true,\"data\":[{\"size_\":%" PRIu64 ",\"offset_\":%" PRIu64
             ",\"protocol_\":\"cxl\",\"transport_endpoint_\":\"%s\",\"lease_remaining_ms\":%" PRIu64
             ",\"hard_pinned\":%s,\"soft_pinned\":%s}]}",
             e.value_size.load(std::memory_order_relaxed),
             e.object_offset.load(std::memory_order_relaxed), JsonEscape(pool_->path()).c_str(),
             lease > now ? (lease - now) / 1000000 : 0,
             (e.flags.load(std::memory_order_relaxed) & kFlagHardPin) ? "true" : "false",
             SoftPinActive(s, now) ? "true" : "false");
    return {200, buf};
  }
  return {404, "{\"success\":false,\"error_code\":-704,\"error_message\":\"OBJECT_NOT_FOUND\"}"};
}

std::string MasterImpl::AllKeys(uint64_t limit, bool* truncated, std::string_view tenant) const {
  // In slices of mu_ (see master.h); at most `limit` keys and kMaxAllKeysBytes.
  constexpr size_t kMaxAllKeysBytes = 64u << 20;
  std::string out;
  uint64_t n = 0, cap, epoch;
  {
    std::lock_guard<FencedMutex> lock(mu_);
    cap = index_->capacity(), epoch = pool_epoch_;  // fixed until a replaced device is adopted
  }
  *truncated = false;
  for (uint64_t s = 0; s < cap && !*truncated;) {
    {
      std::lock_guard<FencedMutex> lock(mu_);
      if (pool_lost_) return std::string();
      if (pool_epoch_ != epoch) break;
      for (uint64_t end = std::min(cap, s + kScanSliceSlots); s < end; ++s) {
        if (!Readable(StateOf(index_->entry(s).state_gen.load(std::memory_order_acquire))))
          continue;
        if (!CheckedLive(s)) continue;  // corrupt: never dereferenced; Tick reclaims it
        std::string_view key_tenant, k;
        SplitStoredKey(KeyOf(s), &key_tenant, &k);
        bool all = tenant == "*";
        if (!all && key_tenant != tenant) continue;
        if (n >= limit || out.size() + k.size() + key_tenant.size() + 2 > kMaxAllKeysBytes) {
          *truncated = true;
          break;
        }
        if (!out.empty()) out += '\n';
        if (all) {
          out += key_tenant;
          out += '\t';
        }
        out += k;
        ++n;
      }
    }
    if (s < cap && !*truncated) SlicePause();
  }
  return out;
}

std::string MasterImpl::AllSegments() const {
  // One segment: the pool. SGLang polls this at start to see the store is up.
  std::lock_guard<FencedMutex> lock(mu_);
  return pool_->path();
}

}  // namespace mcxl
