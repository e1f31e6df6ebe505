// The client's session with the master: connect, bootstrap (Ping says where
// the pool is; the client maps it and reads its token) and attach with the
// token over TCP, the control calls over the CXL RPC rings or TCP with
// re-attach on a stale slot, the heartbeat thread, close. Reads are in
// client_read.cc, puts and removes in client_write.cc, zero-copy views and
// registered buffers in client_pins.cc.
//
// Atomics: slot_/slot_generation_/incarnation_ are relaxed (see client.h);
// the pool's shared words are accessed through ObjectIndex (seqlock, CAS)
// and the helpers of publish.h; the remaining loads and stores of this
// client's own slot line (heartbeat, pin counters, hit counters) are relaxed
// statistics or hints, ordered where it matters by the seq_cst fence in
// PinValue (commented there).
#include "mooncake_cxl/client/client.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/doorbell.h"
#include "mooncake_cxl/common/tenant.h"
#include "client_internal.h"
#include "mooncake_cxl/pool/pool_copy.h"
#include "mooncake_cxl/tier/disk_tier.h"

namespace mcxl {
namespace {
// How long a ring call polls for its reply before it sleeps: a polling
// master answers in a few µs; one our doorbell woke needs its core woken
// first (50-100 µs on this class of VM), and sleeping on the reply too would
// add a second wake-up, this time of our own core.
constexpr uint64_t kReplySpinNs = 30000;
constexpr uint64_t kReplySpinAfterWakeNs = 400000;
}  // namespace

ErrorCode StatusOfReply(const std::string& reply) {
  Decoder d(reply);
  ErrorCode st = ErrorCode::RPC_FAIL;
  DecodeStatus(&d, &st);
  return st;
}

void PrefaultForWrite(void* p, uint64_t n) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  (void)madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE);
}

uint64_t TotalSize(const MutSlice* s, size_t n) {
  uint64_t t = 0;
  for (size_t i = 0; i < n; ++i) t += s[i].size;
  return t;
}

void ScatterTo(const char* src, uint64_t len, const MutSlice* dsts, size_t ndsts) {
  for (size_t i = 0; i < ndsts && len > 0; ++i) {
    uint64_t n = dsts[i].size < len ? dsts[i].size : len;
    CopyFromPool(dsts[i].data, src, n);  // pool_copy.h: a vector loop for large copies
    src += n;
    len -= n;
  }
}

void CopyOut(const char* src, uint64_t len, const ReadDest& dest) {
  if (dest.ranges == nullptr) return ScatterTo(src, len, dest.slices, dest.nslices);
  for (size_t i = 0; i < dest.nranges; ++i) {
    const RangeCopy& r = dest.ranges[i];
    if (r.src_offset <= len && r.size <= len - r.src_offset) CopyFromPool(r.dst, src + r.src_offset, r.size);
  }
}

Client::Client(const ClientOptions& options) : options_(options) {
  if (options_.tenant.empty()) options_.tenant = std::string(kDefaultTenant);
  tenant_prefix_ = TenantPrefix(options_.tenant);
}

Client::~Client() {
  (void)Close();
  UnmapSegment();  // after the Detach: the master no longer places puts there
}

Result<std::shared_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::string host;
  int port = 0;
  std::unique_ptr<EtcdClient> etcd;
  std::string leader_key;
  if (options.master_addr.rfind("etcd://", 0) == 0) {
    auto endpoints = EtcdClient::SplitEndpoints(options.master_addr);
    if (endpoints.empty()) {
      MCXL_LOG(kError, "client", "master_server_addr '%s' names no etcd endpoint", options.master_addr.c_str());
      return ErrorCode::INVALID_PARAMS;
    }
    std::string cluster = options.cluster_id;
    const char* env = getenv("MC_STORE_CLUSTER_ID");
    if (cluster.empty()) cluster = env && *env ? env : "mooncake";
    leader_key = "mooncake-cxl/" + cluster + "/leader";  // master_ha.h's key
    etcd = std::make_unique<EtcdClient>(endpoints, options.connect_timeout_ms);
  } else if (!SplitHostPort(options.master_addr, &host, &port)) {
    MCXL_LOG(kError, "client", "master_server_addr '%s' is not host:port", options.master_addr.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  // A SIGBUS in our mapping (the device shrank) fails the pool instead of
  // killing the user's process; other faults go to the previous handler.
  if (!options.tenant.empty() && !ValidTenantId(options.tenant)) {
    MCXL_LOG(kError, "client", "tenant_id of %zu bytes refused: 1..%zu bytes, no control characters",
             options.tenant.size(), kMaxTenantBytes);
    return ErrorCode::INVALID_PARAMS;
  }
  InstallPoolFaultHandler(PoolFaultAction::kRemap);
  std::shared_ptr<Client> c(new Client(options));
  Status s = ErrorCode::OK;
  if (etcd) {
    c->etcd_ = std::move(etcd);
    c->leader_key_ = leader_key;
    s = c->FindLeader(MonoNs() + uint64_t(options.connect_timeout_ms) * 1000000ull, &host, &port);
  }
  c->rpc_ = std::make_unique<RpcClient>(host, port, options.connect_timeout_ms, options.rpc_timeout_ms);
  if (s.ok()) s = c->MapPool();
  if (s.ok()) s = c->MapSegment();
  if (s.ok()) s = c->Attach(true);
  if (s.ok() && NonCoherent()) s = c->CheckMasterFoldsLeases();
  if (!s.ok()) {
    if (c->slot_generation_.load(std::memory_order_relaxed) != 0) {
      // Attached but could not use the pool: give the slot back at once.
      Encoder e;
      Encode(ClientRef{c->slot_.load(std::memory_order_relaxed),
                       c->slot_generation_.load(std::memory_order_relaxed)}, &e);
      (void)c->rpc_->Call(MessageType::kDetach, e.data());
    }
    std::unique_lock<std::shared_mutex> lock(c->life_mu_);
    c->closed_ = true;
    c->read_gate_.CloseAndWait();
    return s.error();
  }
  c->hb_thread_ = std::thread([raw = c.get()] { raw->HeartbeatLoop(); });
  return c;
}

Status Client::MapPool() {
  auto r = rpc_->Call(MessageType::kPing, "");
  if (!r) return r.error();
  Decoder d(*r);
  PingReply boot;
  if (!Decode(&d, &boot) || boot.status != ErrorCode::OK) {
    MCXL_LOG(kError, "client", "the master's bootstrap reply is malformed (an older master?)");
    return ErrorCode::RPC_FAIL;
  }
  std::string path = options_.pool_path_override.empty() ? boot.pool_path : options_.pool_path_override;
  uint64_t size = options_.pool_size_override ? options_.pool_size_override : boot.pool_size;
  // Open checks the file holds `size` bytes before it maps them; Verify
  // that the superblock's pool_size fits what is mapped.
  auto pool = Pool::Open(path, size, false);
  if (!pool) return pool.error();
  Status v = (*pool)->Verify(boot.uuid);
  if (!v.ok()) return v;
  if (!(*pool)->CheckSize()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  pool_ = std::shared_ptr<Pool>(std::move(pool.value()));
  // Off the setup path: a put or read reaching a page first maps it itself.
  if (options_.prefault_pool)
    populator_.Start(pool_.get(), PopulatePlan(*pool_, true), "client", PopulateMode::kMap,
                     BusySinceLastPoll(&calls_seen_),
                     [this] { return put_frontier_.load(std::memory_order_relaxed); });  // relaxed: a hint
  SetCoherenceMode(pool_->geometry().coherence);
  index_ = std::make_unique<ObjectIndex>(pool_.get());
  memcpy(uuid_, boot.uuid, 16);
  // Verify observed the superblock; the token is read-only after Format.
  memcpy(token_, pool_->superblock()->auth_token, sizeof(token_));
  return ErrorCode::OK;
}

Status Client::Attach(bool initial) {
  std::lock_guard<std::mutex> lock(attach_mu_);
  // Held across the attach: a ring call of another thread in flight (the
  // lease thread's, say) ends first, so it cannot write the ring's caller
  // or consumer_waiting words after the master reset them for this
  // attachment (a lost update on a non-coherent pool).
  std::lock_guard<std::mutex> ring_lock(ring_mu_);
  AttachRequest req;
  req.local_hostname = options_.local_hostname;
  char machine[256] = {};
  gethostname(machine, sizeof(machine) - 1);
  req.machine = machine;
  machine_hash_ = KeyHash(req.machine);
  req.pid = uint64_t(getpid());
  req.prev_slot = slot_.load(std::memory_order_relaxed);
  req.prev_generation = slot_generation_.load(std::memory_order_relaxed);
  memcpy(req.token, token_, sizeof(req.token));
  req.tenant = options_.tenant;
  req.segment_size = segment_size_;
  req.segment_session = segment_session_;
  Encoder e;
  Encode(req, &e);
  Result<std::string> r = ErrorCode::RPC_FAIL;
  if (etcd_ && !initial) {
    // The leader may be changing: ask etcd which master serves before each
    // try (the previous one may be stopped, its socket still accepting),
    // for up to put_wait_ms.
    uint64_t deadline = MonoNs() + uint64_t(options_.put_wait_ms) * 1000000ull;
    for (;;) {
      std::string host;
      int port = 0;
      if (FindLeader(deadline, &host, &port).ok()) (void)rpc_->SetTarget(host, port);
      r = rpc_->Call(MessageType::kAttach, e.data());
      if (r || (r.error() != ErrorCode::RPC_FAIL && r.error() != ErrorCode::RPC_TIMEOUT) || MonoNs() >= deadline)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the takeover is under way
    }
  } else {
    r = rpc_->Call(MessageType::kAttach, e.data());
  }
  if (!r) return r.error();
  Decoder d(*r);
  AttachReply reply;
  if (!Decode(&d, &reply)) return ErrorCode::RPC_FAIL;
  if (reply.status != ErrorCode::OK) {
    MCXL_LOG(kError, "client", "the master refused to attach %s: %s%s", options_.local_hostname.c_str(),
             ErrorCodeName(reply.status),
             !initial && reply.status == ErrorCode::ILLEGAL_CLIENT
                 ? " (the master's pool device may have been replaced: close() and setup() again)" : "");
    return reply.status;
  }
  if (memcmp(uuid_, reply.uuid, 16) != 0) {  // the pool was mapped by MapPool
    MCXL_LOG(kError, "client", "the master now serves pool %s, not the mapped pool %s",
             UuidToString(reply.uuid).c_str(), UuidToString(uuid_).c_str());
    return ErrorCode::INVALID_PARAMS;
  } else if (reply.slot >= pool_->geometry().client_slot_count) {
    MCXL_LOG(kError, "client", "the master gave client slot %u of a pool with %u slots", reply.slot,
             pool_->geometry().client_slot_count);
    return ErrorCode::RPC_FAIL;
  }
  // Relaxed: ordered by attach_mu_ for writers; see the member comment.
  slot_.store(reply.slot, std::memory_order_relaxed);
  slot_generation_.store(reply.slot_generation, std::memory_order_relaxed);
  // The master that attached us raised the term before it served anyone.
  ObserveRange(&pool_->superblock()->master_term, sizeof(uint64_t));
  term_.store(pool_->superblock()->master_term.load(std::memory_order_acquire), std::memory_order_relaxed);
  incarnation_.store(reply.incarnation, std::memory_order_relaxed);
  {
    uint32_t ring_bytes = pool_->geometry().ring_bytes;
    // The slot may have been another host's attachment: this host's copies
    // of its lines (slot, both rings, pin table) go before we write any of
    // them (a non-coherent pool; a fence elsewhere).
    const char* rings = reinterpret_cast<const char*>(pool_->ring(reply.slot, 0));
    const char* second = reinterpret_cast<const char*>(pool_->ring(reply.slot, 1));
    ObserveRange(rings, size_t(2 * (second - rings)));
    ObserveRange(pool_->client_slot(reply.slot), sizeof(ClientSlot));
    ObserveRange(pool_->pin_table(reply.slot), pool_->geometry().pins_per_client * sizeof(PinRecord));
    ring_requests_ = ShmRing(pool_->ring(reply.slot, 0), ring_bytes);
    ring_replies_ = ShmRing(pool_->ring(reply.slot, 1), ring_bytes);
    ring_slot_ = reply.slot;
    ring_generation_ = reply.slot_generation;
  }
  LoadTier();
  ClientSlot* cs = pool_->client_slot(reply.slot);
  // Our line: this attachment's counters start at 0 (the master retired the
  // last one's, and counts ours once heartbeat_generation names us).
  cs->get_hits.store(0, std::memory_order_relaxed);
  cs->get_misses.store(0, std::memory_order_relaxed);
  cs->disk_hits.store(0, std::memory_order_relaxed);
  cs->disk_checksum_failures.store(0, std::memory_order_relaxed);
  cs->heartbeat_generation.store(reply.slot_generation, std::memory_order_relaxed);
  cs->heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
  PublishRange(&cs->heartbeat_ns, kCacheLine);
  if (!initial)
    MCXL_LOG(kInfo, "client", "re-attached to the master (incarnation %llu) as slot %u",
             (unsigned long long)reply.incarnation, reply.slot);
  return ErrorCode::OK;
}

Result<std::string> Client::MasterCall(MessageType type, const std::function<std::string()>& build,
                                       bool idempotent) {
  std::string req, reply;
  Status s = MasterCallInto(type, [&](std::string* p) { *p = build(); }, idempotent, &req, &reply);
  if (!s.ok()) return s.error();
  return reply;
}

Status Client::MasterCallInto(MessageType type, const std::function<void(std::string*)>& build, bool idempotent,
                              std::string* req, std::string* reply) {
  uint64_t inc_before = incarnation_.load(std::memory_order_relaxed);
  build(req);
  Status r = CallOnceInto(type, *req, reply);
  if (r.ok() && StatusOfReply(*reply) != ErrorCode::ILLEGAL_CLIENT) return r;
  if (!r.ok() && r.error() != ErrorCode::RPC_FAIL && r.error() != ErrorCode::RPC_TIMEOUT &&
      r.error() != ErrorCode::ILLEGAL_CLIENT)
    return r;
  // The connection broke, or the master no longer knows our slot (restarted
  // or reclaimed us; RingCall saw it in the pool): re-attach, then retry once
  // if it cannot duplicate work. (A lost slot can be retried: the reclaim
  // revoked whatever our request may have started, and the master serves no
  // request of a stale attachment.)
  bool lost_slot = r.ok() || r.error() == ErrorCode::ILLEGAL_CLIENT;
  Status a = Attach(false);
  // Refused (e.g. our pool's device was replaced): that is the answer.
  if (!a.ok()) return a.error() == ErrorCode::ILLEGAL_CLIENT ? a.error() : r.ok() ? ErrorCode::RPC_FAIL : r.error();
  bool restarted = incarnation_.load(std::memory_order_relaxed) != inc_before;
  if (!idempotent && !lost_slot && !restarted) return r.error();
  build(req);
  return CallOnceInto(type, *req, reply);
}

Result<std::string> Client::CallOnce(MessageType type, const std::string& payload) {
  std::string reply;
  Status s = CallOnceInto(type, payload, &reply);
  if (!s.ok()) return s.error();
  return reply;
}

Status Client::CallOnceInto(MessageType type, const std::string& payload, std::string* reply) {
  // Attach/Detach bind the TCP connection; whole-index scans would stall
  // every ring client behind them on the master's ring thread.
  if (options_.use_rings && type != MessageType::kAttach && type != MessageType::kDetach &&
      type != MessageType::kRemoveByRegex && type != MessageType::kRemoveAll) {
    Status r = RingCallInto(type, payload, reply);
    if (r.ok() || r.error() != ErrorCode::NOT_SUPPORTED) return r;
  }
  auto r = rpc_->Call(type, payload);
  if (!r) return r.error();
  if (TermSuperseded()) return ErrorCode::RPC_FAIL;  // a deposed master's answer: ask the new one
  *reply = std::move(*r);
  return ErrorCode::OK;
}

bool Client::SlotCurrent(uint32_t slot, uint64_t gen) const {
  const ClientSlot* cs = pool_->client_slot(slot);
  ObserveRange(&cs->generation, sizeof(uint64_t));
  // Acquire: pairs with the master's release store when it assigns or
  // reclaims the slot (it resets the rings before).
  return cs->generation.load(std::memory_order_acquire) == gen;
}

Result<std::string> Client::RingCall(MessageType type, const std::string& payload) {
  std::string reply;
  Status s = RingCallInto(type, payload, &reply);
  if (!s.ok()) return s.error();
  return reply;
}

Status Client::RingCallInto(MessageType type, std::string_view payload, std::string* reply_out) {
  calls_seen_.Note();
  std::lock_guard<std::mutex> lock(ring_mu_);
  if (!ring_requests_.valid()) return ErrorCode::NOT_SUPPORTED;
  uint64_t id = RingRequestId(ring_generation_, ring_next_id_++);
  // Pushed as header + payload: no joined copy of the frame.
  FrameHeader fh{kFrameMagic, kProtocolVersion, uint16_t(type), uint32_t(payload.size()), 0, id};
  // Both the request and its reply must fit one ring record; else TCP.
  if (sizeof(fh) + payload.size() > ring_requests_.max_frame() ||
      sizeof(fh) + ReplyBytesBound(uint16_t(type), payload) > ring_replies_.max_frame())
    return ErrorCode::NOT_SUPPORTED;
  if (pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  Superblock* sb = pool_->superblock();
  uint64_t incarnation = incarnation_.load(std::memory_order_relaxed);
  auto master_gone = [&](bool probe, uint64_t mono) {
    // Restarted (a new incarnation), silent for longer than any Tick gap,
    // or exited (its pid, when on this machine). One line, the master's
    // only: observed first (a non-coherent pool's stale copy of it goes).
    ObserveRange(&sb->master_incarnation, kCacheLine);
    if (sb->master_incarnation.load(std::memory_order_acquire) != incarnation) return true;
    if (TermSuperseded()) return true;
    // The heartbeat and pid checks cost a clock read (~25 ns) and a syscall
    // (~0.5 µs) against a ~2 µs small put: before a push they are made at
    // most every 10 ms; a master that died since is caught by the wait below
    // (which always probes once the reply is late).
    if (!probe && mono - ring_pid_probe_ns_ < 10000000ull) return false;
    ring_pid_probe_ns_ = mono;
    uint64_t hb = sb->master_heartbeat_ns.load(std::memory_order_relaxed);
    if (NowNs() > hb + 3000000000ull) return true;
    pid_t pid = pid_t(sb->master_pid.load(std::memory_order_relaxed));
    return sb->master_machine_hash.load(std::memory_order_relaxed) == machine_hash_ && pid > 0 &&
           kill(pid, 0) != 0 && errno == ESRCH;
  };
  // Our slot was reclaimed (we were stopped or silent past --client_ttl) and
  // its rings may be another client's now: touch nothing, re-attach
  // (MasterCall). Checked right before every write into a ring; a stop
  // between a check and the write it guards is covered by the caller word.
  auto stale = [&] { return !SlotCurrent(ring_slot_, ring_generation_); };
  uint64_t start = MonoNs();
  if (master_gone(false, start)) return ErrorCode::RPC_FAIL;
  // Held from before the first slot check until we are done with both rings:
  // the master keeps a held slot from any successor (shm_ring.h).
  if (!ring_requests_.ClaimCaller(ring_generation_)) return ErrorCode::ILLEGAL_CLIENT;
  struct Release {
    ShmRing& ring;
    uint64_t gen;
    ~Release() { ring.ReleaseCaller(gen); }
  } release{ring_requests_, ring_generation_};
  if (stale()) return ErrorCode::ILLEGAL_CLIENT;
  if (!ring_requests_.Push(&fh, sizeof(fh), payload)) return ErrorCode::RPC_FAIL;
  // Woken from its sleep, the master answers only once its core is up again.
  const uint64_t reply_spin_ns = RingDoorbell(sb) ? kReplySpinAfterWakeNs : kReplySpinNs;
  uint64_t deadline = start + uint64_t(options_.rpc_timeout_ms) * 1000000ull;
  std::string& reply = *reply_out;  // the caller's buffer: its capacity is reused
  for (bool first = true;; first = false) {
    uint64_t now = first ? start : MonoNs();  // (one clock read less per call)
    // (WaitForData writes the ring's consumer_waiting hint.) Checked before
    // the deadline: a client stopped past --client_ttl mid-call resumes late
    // with its slot reclaimed, which MasterCall re-attaches and retries for.
    if (stale()) return ErrorCode::ILLEGAL_CLIENT;
    if (now >= deadline) return ErrorCode::RPC_TIMEOUT;
    // Spin (the master answers in a few µs), then sleep in short slices so
    // that a dead master is noticed; shorter with elected masters, where a
    // standby takes over within tens of ms.
    const uint64_t slice_ns = etcd_ ? 20000000ull : 200000000ull;
    if (!ring_replies_.WaitForData(reply_spin_ns, std::min<uint64_t>(deadline - now, slice_ns), &ring_spin_)) {
      if (master_gone(true, MonoNs())) return ErrorCode::RPC_FAIL;
      continue;
    }
    ShmRing::Position at;
    ShmRing::PopResult pr = ring_replies_.Peek(&reply, &at);
    if (pr == ShmRing::PopResult::kEmpty) continue;
    FrameHeader h{};
    bool ours = pr == ShmRing::PopResult::kOk && reply.size() >= sizeof(h) &&
                (memcpy(&h, reply.data(), sizeof(h)), RingRequestOf(h.request_id, ring_generation_));
    // Before we consume anything: if the slot is no longer ours, the record
    // is the next client's; leave it.
    if (stale()) return ErrorCode::ILLEGAL_CLIENT;
    if (pr == ShmRing::PopResult::kCorrupt) {
      MCXL_LOG(kWarn, "client", "reply ring holds a torn or stale record; skipped");
      ring_replies_.SkipAll();
      continue;
    }
    ring_replies_.Consume(at);
    if (!ours) {
      MCXL_LOG(kWarn, "client", "reply ring of slot %u held a reply for another attachment; skipped",
               ring_slot_);
      continue;
    }
    if (h.request_id != id) continue;  // a late reply to a request of ours that timed out
    reply.erase(0, sizeof(h));  // the body, in place
    if (h.type == uint16_t(MessageType::kError)) {
      Decoder d(reply);
      ErrorCode st = ErrorCode::RPC_FAIL;
      DecodeStatus(&d, &st);
      return st;
    }
    return ErrorCode::OK;
  }
}

void Client::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!hb_stop_) {
    // A device that shrank would SIGBUS on the next touch: notice it first
    // (fstat; CheckSize logs once) and stop using the pool.
    if (!pool_->CheckSize()) {
      hb_cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_interval_ms),
                      [this] { return hb_stop_; });
      continue;
    }
    uint32_t slot = slot_.load(std::memory_order_relaxed);
    uint64_t gen = slot_generation_.load(std::memory_order_relaxed);
    ClientSlot* cs = pool_->client_slot(slot);
    // Checked first: a reclaimed slot may be another client's by now, and
    // our stale heartbeat must not land on its line.
    bool lost = !SlotCurrent(slot, gen);
    if (!lost) {
      // Relaxed + publish: the master compares it with its clock, nothing more.
      cs->heartbeat_generation.store(gen, std::memory_order_relaxed);
      cs->heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
      PublishRange(&cs->heartbeat_ns, kCacheLine);
    }
    lock.unlock();
    tier::CloseDeletedReaderFds();  // compacted segments' space goes back even while we do not read
    if (lost) {
      // The master restarted or reclaimed us: take a slot again so that the
      // master can see us alive (readers never talk to it otherwise).
      (void)Attach(false);
    }
    lock.lock();
    hb_cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_interval_ms),
                    [this] { return hb_stop_; });
  }
}

Status Client::Close() {
  std::unique_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::OK;
  closed_ = true;
  read_gate_.CloseAndWait();  // no single-key read is in flight from here on
  {
    std::lock_guard<std::mutex> hb(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (hb_thread_.joinable()) hb_thread_.join();
  StopLeaseThread();
  populator_.Stop();
  Encoder e;
  Encode(Ref(), &e);
  bool reconnected = false;
  auto r = rpc_->Call(MessageType::kDetach, e.data(), &reconnected);
  if (reconnected && r.ok() && StatusOfReply(*r) == ErrorCode::ILLEGAL_CLIENT && Attach(false).ok()) {
    // A new connection (the old one broke or idled out) is bound to no slot:
    // attach it to ours (kept, still valid), then detach.
    Encoder again;
    Encode(Ref(), &again);
    (void)rpc_->Call(MessageType::kDetach, again.data());
  }
  rpc_->Disconnect();
  return ErrorCode::OK;
}

bool Client::closed() const { return read_gate_.closed(); }

int Client::HealthCheck() {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return 1;
  auto r = CallOnce(MessageType::kPing, "");
  return r.ok() ? 0 : 2;
}

bool Client::ValidKey(std::string_view key, const char* op) const {
  if (key.empty()) {
    MCXL_LOG(kWarn, "client", "%s: empty key", op);
    return false;
  }
  if (key.size() > kMaxKeyLength) {
    MCXL_LOG(kWarn, "client", "%s: key of %zu bytes is longer than the limit of %u", op, key.size(),
             kMaxKeyLength);
    return false;
  }
  return true;
}

bool Client::ScopeKey(std::string_view key, const char* op, std::string* buf, std::string_view* stored) const {
  if (!key.empty() && key[0] == kTenantMark) {
    // Would name a key of another tenant's namespace (tenant.h).
    MCXL_LOG(kWarn, "client", "%s: a key may not begin with byte 0x1d (reserved for tenant namespaces)", op);
    return false;
  }
  if (tenant_prefix_.empty()) {
    *stored = key;
  } else {
    if (key.empty()) {
      MCXL_LOG(kWarn, "client", "%s: empty key", op);
      return false;
    }
    buf->reserve(tenant_prefix_.size() + key.size());
    buf->assign(tenant_prefix_);
    buf->append(key);
    *stored = *buf;
    if (buf->size() > kMaxKeyLength) {
      MCXL_LOG(kWarn, "client", "%s: key of %zu bytes is longer than the limit of %zu for tenant '%s'", op,
               key.size(), size_t(kMaxKeyLength) - tenant_prefix_.size(), options_.tenant.c_str());
      return false;
    }
  }
  return ValidKey(*stored, op);
}

uint64_t Client::LeaseTtlNs() const {
  // Relaxed: the master sets it at start; any recent value is fine.
  return pool_->superblock()->lease_ttl_ns.load(std::memory_order_relaxed);
}

}  // namespace mcxl
