// mooncake_cxl_master: the master of a CXL pool. Flags follow mooncake_master.
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <unistd.h>

#include "mooncake_cxl/common/access.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/flags.h"
#include "mooncake_cxl/control/http_server.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/master/master.h"
#include "mooncake_cxl/master/master_ha.h"
#include "mooncake_cxl/master/warm_scan.h"
#include "mooncake_cxl/pool/populate.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/common/tenant.h"
#include "mooncake_cxl/control/ring_server.h"
#include "mooncake_cxl/control/tcp_server.h"

namespace {

std::atomic<bool> g_stop{false};

bool g_enable_key_listing = false;  // --enable_key_listing; set before the HTTP thread starts

// The monitoring port's pages (mooncake_master's paths). The pages that
// reveal keys are for loopback peers only unless --enable_key_listing.
mcxl::HttpResponse MonitoringPage(mcxl::Master& m, const mcxl::HttpRequest& req) {
  if ((req.path == "/get_all_keys" || req.path == "/query_key") &&
      !mcxl::KeyListingAllowed(g_enable_key_listing, req.peer_address)) {
    static uint64_t last_log_ns = 0;  // the HTTP thread only: one line per second at most
    uint64_t now = mcxl::MonoNs();
    if (last_log_ns == 0 || now - last_log_ns > 1000000000ull) {
      last_log_ns = now;
      MCXL_LOG(kWarn, "http", "%s from %s refused (403): key listing is loopback-only without --enable_key_listing",
               req.path.c_str(), req.peer_address.c_str());
    }
    return mcxl::TextResponse(403, req.path + " reveals keys: served to loopback peers only unless the master "
                                   "runs with --enable_key_listing");
  }
  if (req.path == "/metrics") {
    mcxl::HttpResponse r;  // Prometheus text format 0.0.4 (the default type)
    r.body = m.MetricsText();
    return r;
  }
  if (req.path == "/metrics/summary") return mcxl::TextResponse(200, m.SummaryLine());
  if (req.path == "/health") return mcxl::JsonResponse("{\"status\":\"ok\"}");
  if (req.path == "/get_all_keys") {
    // At most ?limit= keys (default 1,000,000) and 64 MiB; when more exist
    // the last line is the marker below (not a key).
    bool present = false, truncated = false;
    std::string limit_text = req.Query("limit", &present);
    uint64_t limit = 1000000;
    if (present) {
      char* end = nullptr;
      limit = strtoull(limit_text.c_str(), &end, 10);
      if (limit_text.empty() || *end != '\0') return mcxl::BadRequest("limit must be a number of keys");
    }
    // ?tenant=T: T's keys (default: the default tenant's, as Mooncake
    // lists them); ?tenant=*: every key as "tenant<TAB>key".
    bool has_tenant = false;
    std::string tenant = req.Query("tenant", &has_tenant);
    if (!has_tenant || tenant.empty()) tenant = "default";
    if (tenant != "*" && !mcxl::ValidTenantId(tenant)) return mcxl::BadRequest("invalid tenant");
    std::string body = m.AllKeys(limit, &truncated, tenant);
    if (truncated) body += (body.empty() ? "" : "\n") + std::string("...(truncated; ask /get_all_keys?limit=N)");
    return mcxl::TextResponse(200, body);
  }
  if (req.path == "/get_all_segments") return mcxl::TextResponse(200, m.AllSegments());
  if (req.path == "/query_key") {
    bool present = false;
    std::string key = req.Query("key", &present);
    if (!present || key.empty()) return mcxl::BadRequest("missing parameter: key");
    bool has_tenant = false;
    std::string tenant = req.Query("tenant", &has_tenant);
    if (!has_tenant || tenant.empty()) tenant = "default";
    if (!mcxl::ValidTenantId(tenant)) return mcxl::BadRequest("invalid tenant");
    auto [status, body] = m.QueryKey(key, tenant);
    return mcxl::JsonResponse(body, status);
  }
  return mcxl::NotFound(req.path);
}
// The soft RLIMIT_NOFILE (often 1024) up to the hard one, so that
// --max_rpc_connections is what limits connections, not EMFILE.
void RaiseFdLimit(int64_t max_connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    (void)getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rlim_t(max_connections) + 64)
    MCXL_LOG(kWarn, "master", "file descriptor limit %llu is below --max_rpc_connections=%lld + 64: accepts pause "
             "when it is reached", (unsigned long long)rl.rlim_cur, (long long)max_connections);
}
void OnSignal(int) { g_stop.store(true, std::memory_order_relaxed); }  // polled by Run
}  // namespace

int main(int argc, char** argv) {
  mcxl::InitLogLevelFromEnv(mcxl::LogLevel::kInfo);
  mcxl::MasterConfig cfg;
  if (const char* p = getenv("MC_CXL_DEV_PATH")) cfg.cxl_path = p;
  if (const char* s = getenv("MC_CXL_DEV_SIZE")) cfg.cxl_size = strtoull(s, nullptr, 10);
  mcxl::TcpServerOptions tcp;
  mcxl::FlagSet flags;
  flags.Add("rpc_address", &cfg.rpc_address, "address the RPC server binds");
  flags.Add("rpc_port", &cfg.rpc_port, "RPC server port (0 = any free port)");
  flags.Add("metrics_port", &cfg.metrics_port, "HTTP monitoring port (/metrics ...); 0 = any free port");
  flags.Add("metrics_host", &cfg.metrics_host, "address the HTTP monitoring server binds");
  flags.Add("enable_cxl", &cfg.enable_cxl, "serve a CXL pool (always on here)");
  flags.Add("cxl_path", &cfg.cxl_path, "pool: device-DAX node, regular file or /dev/shm file");
  flags.Add("cxl_size", &cfg.cxl_size, "pool size in bytes; 0 = the device's size");
  flags.Add("format", &cfg.format, "format the pool (erases it); an unformatted pool is always formatted");
  flags.Add("index_capacity", &cfg.index_capacity, "object index entries at format (64 B of pool each); 0 = one per 4 KiB of pool");
  flags.Add("client_slots", &cfg.client_slots, "client slots at format");
  flags.Add("announce_channels", &cfg.announce_channels,
            "announcement channels at format; 0 = two per client slot (bounded by the pool size)");
  flags.Add("announce_channels_per_client", &cfg.announce_channels_per_client,
            "announcement channels one client may hold open at once");
  flags.Add("coherence", &cfg.coherence,
            "at format: coherent (one host, CXL 3.x) or noncoherent (CXL 2.0 multi-host: flush on publish)");
  flags.Add("default_kv_lease_ttl", &cfg.default_kv_lease_ttl_ms, "lease granted by get/exist, ms");
  flags.Add("default_kv_soft_pin_ttl", &cfg.default_kv_soft_pin_ttl_ms, "soft pin duration, ms");
  flags.Add("max_kv_soft_pin_ttl", &cfg.max_kv_soft_pin_ttl_ms, "longest soft pin a put may ask for, ms");
  flags.Add("eviction_high_watermark_ratio", &cfg.eviction_high_watermark_ratio, "evict above this used ratio");
  flags.Add("eviction_ratio", &cfg.eviction_ratio, "fraction of capacity one eviction round frees");
  flags.Add("index_high_watermark_ratio", &cfg.index_high_watermark_ratio,
            "evict above this share of the object index's entries in use (0.1..0.95)");
  flags.Add("allow_evict_soft_pinned_objects", &cfg.allow_evict_soft_pinned_objects,
            "soft-pinned objects may be evicted last");
  flags.Add("client_ttl", &cfg.client_ttl_s, "seconds without heartbeat before a client is reclaimed");
  flags.Add("put_start_discard_timeout_sec", &cfg.put_start_discard_timeout_sec,
            "an unfinished put is revoked after this many seconds");
  flags.Add("put_start_release_timeout_sec", &cfg.put_start_release_timeout_sec,
            "a revoked put's space is freed after this many seconds when its writer is on another "
            "host (at once if its client died; a live writer on this host: when its process exits)");
  flags.Add("max_rpc_connections", &tcp.max_connections,
            "RPC connections served at once; a connection beyond is closed at once");
  flags.Add("rpc_conn_timeout_seconds", &tcp.idle_timeout_s,
            "an RPC connection idle this long is closed (clients reconnect); 0 = never");
  flags.Add("enable_key_listing", &g_enable_key_listing,
            "serve /get_all_keys and /query_key (they reveal keys) to non-loopback peers too");
  flags.Add("pool_group", &cfg.pool_group,
            "group of a pool file the master creates (mode 0660); empty = mode 0600, owner only");
  flags.Add("allow_world_readable_pool", &cfg.allow_world_readable_pool,
            "format a pool that other users may read or write (refused otherwise)");
  flags.Add("prefault_pool", &cfg.prefault_pool,
            "populate the pool's pages in the background after start (the data region too on "
            "tmpfs/hugetlbfs, which keeps the whole pool resident): puts take no first-touch page "
            "faults; --prefault_pool=false leaves pages to fault in as they are used");
  uint64_t ring_max_spin_us = mcxl::RingServer::kDefaultMaxSpinNs / 1000;
  flags.Add("ring_max_spin_us", &ring_max_spin_us,
            "longest the ring thread polls after a request before it sleeps, while clients' requests keep "
            "coming at about that pace (from 50 µs; a sleep costs the next request a wake-up of its core); "
            "idle, it sleeps after one such window");
  // Mooncake 0.3.13's tenant flags: isolation is always on here (setup's
  // tenant_id); quotas are not enforced (the flags are accepted, logged).
  bool enable_multi_tenants = false;
  flags.Add("enable_multi_tenants", &enable_multi_tenants,
            "accepted (Mooncake: strict tenant namespaces and quota admission); tenants are always isolated here");
  for (const char* n : {"quota_bytes", "tenant_quota_connector_type", "tenant_quota_connector_uri",
                        "kv_events_tenant_id"})
    flags.Ignore(n);
  // The SSD tier under the pool (cpp/master/src/tier_manager.h): Mooncake's names.
  flags.Add("enable_offload", &cfg.enable_offload,
            "keep objects in an SSD tier under the pool (segment files in --root_fs_dir)");
  flags.Add("offload_on_evict", &cfg.offload_on_evict,
            "write an object to the tier when eviction picks it (without it: after each put completes)");
  flags.Add("promotion_on_hit", &cfg.promotion_on_hit, "copy a disk-only object back into the pool after "
            "--promotion_admission_threshold reads");
  flags.Add("promotion_admission_threshold", &cfg.promotion_admission_threshold,
            "disk reads of an object before it is promoted back into the pool");
  flags.Add("root_fs_dir", &cfg.root_fs_dir, "directory of the SSD tier (clients that can open it read "
            "records themselves; others ask the master to stage them)");
  flags.Add("offload_capacity_bytes", &cfg.offload_capacity_bytes, "capacity of the SSD tier in bytes");
  flags.Add("offload_force_evict", &cfg.offload_force_evict,
            "evict without offload while --offloading_queue_limit demotions wait (puts never wait for the disk)");
  flags.Add("offloading_queue_limit", &cfg.offloading_queue_limit,
            "demotions waiting for the tier before --offload_force_evict drops instead");
  flags.Add("offload_high_watermark_ratio", &cfg.offload_high_watermark_ratio,
            "above this share of the tier's capacity its least recently used objects are dropped");
  flags.Add("offload_ahead_ratio", &cfg.offload_ahead_ratio,
            "with --offload_on_evict: while more than this share of the pool has no disk copy, write clean "
            "copies of the coldest objects in the background (kept in the pool), so eviction at the "
            "watermark needs no disk write; e.g. 0.7 (eviction_high_watermark_ratio - 0.2); 0 = off "
            "(nothing reaches the disk below the watermark)");
  // Hosts outside the pod (remote clients over Mooncake's Transfer Engine).
  flags.Add("pool_te_protocol", &cfg.te_protocol,
            "tcp or rdma: remote clients reach the pool through the Transfer Engine of the process serving "
            "its mapping (mooncake_cxl_master starts it: python -m mooncake_cxl.pool_te); empty = off");
  flags.Add("pool_te_session_file", &cfg.te_session_file,
            "where that process writes its Transfer Engine session (default: <cxl_path>.te)");
  std::string auth_token_file;
  flags.Add("auth_token_file", &auth_token_file,
            "secret remote clients present (MC_CXL_AUTH_TOKEN_FILE); created 0600 if missing; "
            "empty = remote clients are refused");
  for (const char* n : {"enable_http_metadata_server", "http_metadata_server_port",
                        "http_metadata_server_host", "rpc_thread_num", "rpc_enable_tcp_no_delay",
                        "enable_metric_reporting",
                        "memory_allocator", "global_file_segment_size", "rpc_interface",
                        "max_total_finished_tasks", "max_total_pending_tasks", "max_total_processing_tasks"})
    flags.Ignore(n);
  // High availability (master_ha.h): Mooncake's flag names.
  bool enable_ha = false;
  std::string ha_backend_type = "etcd", ha_backend_connstring, etcd_endpoints;
  const char* env_cluster = getenv("MC_STORE_CLUSTER_ID");
  std::string cluster_id = env_cluster && *env_cluster ? env_cluster : "mooncake";
  int64_t ha_lease_ttl_sec = 2;
  int64_t ha_standby_rescan_ms = 3000;
  flags.Add("enable_ha", &enable_ha, "elect one master of several through etcd; the others stand by");
  flags.Add("ha_backend_type", &ha_backend_type, "election backend (etcd only)");
  flags.Add("ha_backend_connstring", &ha_backend_connstring, "etcd endpoints, \"h1:2379;h2:2379\" (or ,)");
  flags.Add("etcd_endpoints", &etcd_endpoints, "etcd endpoints when --ha_backend_connstring is empty");
  flags.Add("cluster_id", &cluster_id, "election namespace in etcd (clients: MC_STORE_CLUSTER_ID)");
  flags.Add("ha_lease_ttl_sec", &ha_lease_ttl_sec,
            "election lease TTL in seconds: a leader that cannot renew it for this long steps down; a "
            "standby takes over about this long after a leader on another host stops");
  flags.Add("ha_standby_rescan_ms", &ha_standby_rescan_ms,
            "a standby rescans the pool's index and headers this often, so that its takeover re-reads only "
            "what changed since (a rescan reads the whole index); 0: scan once, at start");
  std::string error;
  bool help = false;
  if (!flags.Parse(argc, argv, &error, &help)) {
    fprintf(stderr, "mooncake_cxl_master: %s\n", error.c_str());
    return 2;
  }
  if (help) {
    fputs(flags.Usage("mooncake_cxl_master").c_str(), stdout);
    return 0;
  }
  for (const auto& n : flags.ignored_seen())
    MCXL_LOG(kInfo, "master", "--%s accepted for Mooncake compatibility; it has no effect here", n.c_str());
  if (flags.WasSet("enable_multi_tenants"))
    MCXL_LOG(kInfo, "master", "--enable_multi_tenants=%s: tenants are always isolated here (setup(..., tenant_id=T)); "
             "per-tenant quotas are not enforced", enable_multi_tenants ? "true" : "false");
  if (!cfg.te_protocol.empty() && cfg.te_protocol != "tcp" && cfg.te_protocol != "rdma") {
    fprintf(stderr, "mooncake_cxl_master: --pool_te_protocol=%s: use tcp, rdma or nothing\n", cfg.te_protocol.c_str());
    return 2;
  }
  if (!cfg.te_protocol.empty() && cfg.te_session_file.empty()) cfg.te_session_file = cfg.cxl_path + ".te";
  // A killed serving process's session (a dead port) is not advertised.
  if (!cfg.te_protocol.empty()) (void)mcxl::DropDeadTeSession(cfg.te_session_file);
  if (!auth_token_file.empty()) {
    std::string why;
    if (!mcxl::LoadOrCreateSecret(auth_token_file, &cfg.remote_secret, &why)) {
      fprintf(stderr, "mooncake_cxl_master: --auth_token_file: %s\n", why.c_str());
      return 2;
    }
  }
  if (cfg.rpc_port < 0 || cfg.rpc_port > 65535) {
    fprintf(stderr, "mooncake_cxl_master: --rpc_port must be 0..65535\n");
    return 2;
  }
  for (const auto& w : mcxl::ExposureWarnings(cfg.rpc_address, flags.WasSet("rpc_address"), cfg.metrics_host,
                                              flags.WasSet("metrics_host")))
    MCXL_LOG(kWarn, "master", "%s", w.c_str());
  // A shrunk pool device: Tick logs it and exits with kPoolLostExitCode; a
  // SIGBUS in the mapping before Tick notices logs the offset and exits so.
  cfg.exit_on_pool_loss = true;
  mcxl::InstallPoolFaultHandler(mcxl::PoolFaultAction::kExit);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<mcxl::HaElector> elector;
  std::unique_ptr<mcxl::Pool> premapped;
  std::unique_ptr<mcxl::WarmScan> warm;
  if (enable_ha) {
    mcxl::HaOptions ha;
    ha.endpoints = mcxl::EtcdClient::SplitEndpoints(ha_backend_connstring.empty() ? etcd_endpoints
                                                                                   : ha_backend_connstring);
    ha.cluster_id = cluster_id;
    ha.ttl_s = ha_lease_ttl_sec;
    if (ha_backend_type != "etcd" || ha.endpoints.empty() || ha_lease_ttl_sec < 1 || cluster_id.empty() ||
        cluster_id.find('/') != std::string::npos) {
      fprintf(stderr, "mooncake_cxl_master: --enable_ha needs --ha_backend_type=etcd, etcd endpoints "
              "(--ha_backend_connstring or --etcd_endpoints), --ha_lease_ttl_sec >= 1 and a --cluster_id without '/'\n");
      return 2;
    }
    // A standby maps the pool (and its pages) while it waits: a takeover
    // then recovers with no page faults.
    if (access(cfg.cxl_path.c_str(), F_OK) == 0) {  // a missing pool is created once elected
      auto pool = mcxl::Pool::Open(cfg.cxl_path, cfg.cxl_size, false);
      if (pool) {
        if (cfg.prefault_pool) (void)mcxl::PopulateRange(**pool, 0, (*pool)->size());
        premapped = std::move(pool.value());
      }
    }
    // The standby keeps its recovery warm: the headers of COMPLETE objects,
    // scanned now and again every --ha_standby_rescan_ms.
    if (premapped && premapped->IsFormatted() && premapped->Verify(nullptr).ok()) {
      warm = std::make_unique<mcxl::WarmScan>();
      (void)warm->Scan(*premapped);
      MCXL_LOG(kInfo, "ha", "standby: %zu objects scanned ahead of a takeover", warm->size());
      if (ha_standby_rescan_ms > 0) warm->Start(premapped.get(), uint32_t(ha_standby_rescan_ms));
    }
    if (premapped && warm) {
      const mcxl::Superblock* sb = premapped->superblock();
      ha.leader_heartbeat = [sb] {
        mcxl::ObserveRange(&sb->master_heartbeat_ns, sizeof(uint64_t));  // written on another host, maybe
        // Relaxed: compared with its previous value only.
        return sb->master_heartbeat_ns.load(std::memory_order_relaxed);
      };
    }
    elector = std::make_unique<mcxl::HaElector>(ha);
    printf("mooncake_cxl_master standby cluster=%s pid=%d\n", cluster_id.c_str(), int(getpid()));
    fflush(stdout);
    int64_t term = 0;
    if (!elector->Campaign(g_stop, &term)) return 0;
    cfg.ha_term = uint64_t(term);
    cfg.ha_lease_deadline = elector->lease_deadline();
  }
  auto master = mcxl::Master::Create(cfg, std::move(premapped), std::move(warm));
  if (!master) {
    fprintf(stderr, "mooncake_cxl_master: cannot start: %s (see the log above)\n",
            mcxl::ErrorCodeName(master.error()));
    return 1;
  }
  RaiseFdLimit(tcp.max_connections);
  mcxl::TcpServer server(master->get(), tcp);
  if (!server.Listen(cfg.rpc_address, int(cfg.rpc_port)).ok()) return 1;
  mcxl::HttpServer http;
  if (!http.Listen(cfg.metrics_host, int(cfg.metrics_port)).ok()) return 1;
  http.Start([m = master->get()](const mcxl::HttpRequest& req) { return MonitoringPage(*m, req); });
  mcxl::RingServer rings(master->get(), 50000, ring_max_spin_us * 1000);
  rings.Start();
  if (elector) {
    // Clients find the leader by this record; a wildcard address names this host.
    std::string rpc_host = cfg.rpc_address, metrics_host = cfg.metrics_host;
    char self[256] = {};
    gethostname(self, sizeof(self) - 1);
    if (rpc_host == "0.0.0.0" || rpc_host.empty()) rpc_host = self;
    if (metrics_host == "0.0.0.0" || metrics_host.empty()) metrics_host = self;
    mcxl::Status a = elector->Announce(rpc_host + ":" + std::to_string(server.port()),
                                       metrics_host + ":" + std::to_string(http.port()));
    if (!a.ok()) {
      MCXL_LOG(kError, "ha", "cannot announce this leader in etcd (%s): stepping down", mcxl::ErrorCodeName(a.error()));
      return mcxl::kDeposedExitCode;
    }
  }
  // One machine-readable line for scripts and tests.
  printf("mooncake_cxl_master ready rpc=%s:%d pool=%s uuid=%s metrics=%s:%d term=%llu\n", cfg.rpc_address.c_str(),
         server.port(), (*master)->pool().path().c_str(), (*master)->pool().UuidString().c_str(),
         cfg.metrics_host.c_str(), http.port(),
         (unsigned long long)(*master)->pool().superblock()->master_term.load(std::memory_order_relaxed));
  fflush(stdout);
  server.Run(g_stop);
  rings.Stop();
  http.Stop();
  if (elector) elector->Resign();  // a standby takes over at once
  // A serving process killed before this master stopped leaves its file.
  if (!cfg.te_protocol.empty()) (void)mcxl::DropDeadTeSession(cfg.te_session_file);
  MCXL_LOG(kInfo, "master", "stopped");
  return 0;
}
