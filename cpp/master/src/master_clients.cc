// Clients as the master sees them. Contract: Attach assigns a slot and a
// generation (incarnation << 32 | counter) and resets the slot's rings;
// every request names (slot, generation) and a stale pair is ILLEGAL_CLIENT.
// Access (access.h): an Attach without the pool's token, or whose local pid
// claim names no running process, is ILLEGAL_CLIENT before any slot is
// taken; a request naming a slot other than its connection's is refused
// unread. The pid is a liveness hint: a TCP peer has no SO_PEERCRED, and a
// token holder can write the pool anyway, so proving its pid would add no
// protection. A full table first reclaims slots whose local process is gone.
// A client is reclaimed when it detaches, when its local process is gone,
// or when its heartbeat is older than --client_ttl: its unfinished puts are
// revoked first, then its slot, rings and pin table are cleared (or, while
// its process may still hold views, the slot is retired with its pin table
// and a re-attach naming the old generation takes it back: master_pins.cc).
//
// Atomics follow the three rules stated in master_impl.h.
#include "master_impl.h"

#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "mooncake_cxl/common/access.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"
#include "mooncake_cxl/common/tenant.h"

namespace mcxl {

std::string ThisMachine() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool LocalPidDead(uint64_t pid) {
  if (pid == 0) return false;
  if (kill(pid_t(pid), 0) != 0 && errno == ESRCH) return true;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%llu/stat", (unsigned long long)pid);
  FILE* f = fopen(path, "r");
  // Out of file descriptors (EMFILE) is no news about the pid: only a
  // missing /proc entry says it is gone.
  if (f == nullptr) return errno == ENOENT || errno == ESRCH;
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  const char* rp = static_cast<const char*>(memrchr(buf, ')', n));
  return rp != nullptr && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

bool MasterImpl::ClientValid(const ClientRef& ref) const {
  return ref.slot < clients_.size() && clients_[ref.slot].attached &&
         clients_[ref.slot].generation == ref.generation;
}

void MasterImpl::LogRefusal(const char* fmt, ...) {
  ++stats_.refused_requests;
  uint64_t now = MonoNs();
  if (refusal_log_mono_ == 0 || now - refusal_log_mono_ >= kNsPerSec) {
    refusal_log_mono_ = now;  // a new one-second window
    refusals_logged_ = 0;
  }
  if (refusals_logged_ >= kRefusalLinesPerSec) {
    ++refusals_unlogged_;  // a flood costs a few lines per second, not one per frame
    return;
  }
  ++refusals_logged_;
  char msg[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  MCXL_LOG(kWarn, "master", "%s (refused: ILLEGAL_CLIENT; %llu earlier refusals not logged)", msg,
           (unsigned long long)refusals_unlogged_);
  refusals_unlogged_ = 0;
}

bool MasterImpl::Admit(uint16_t type, std::string_view payload, uint32_t conn_slot, std::string* refusal) {
  switch (MessageType(type)) {
    case MessageType::kDetach:
    case MessageType::kHeartbeat:
    case MessageType::kPutStart:
    case MessageType::kRemove:
    case MessageType::kBatchRemove:
    case MessageType::kRemoveByRegex:
    case MessageType::kRemoveAll:
    case MessageType::kPromote:
    case MessageType::kSettle:
    case MessageType::kAnnounceOpen:
    case MessageType::kAnnounceClose:
    case MessageType::kLocate:
    case MessageType::kPublish:
    case MessageType::kLeases:
    case MessageType::kSegmentSession:
      break;
    default:
      return true;  // Ping (bootstrap), Attach (checks its token), unknown types (rejected)
  }
  Decoder d(payload);
  ClientRef ref;
  if (!Decode(&d, &ref)) return true;  // too short: the handler answers INVALID_PARAMS
  if (conn_slot != kNoSlot && ref.slot == conn_slot && ClientValid(ref)) return true;
  uint64_t incarnation = pool_->superblock()->master_incarnation.load(std::memory_order_relaxed);
  // A reclaimed client on its own connection, or one of an earlier master
  // incarnation reconnecting: it re-attaches; not worth a warning.
  uint64_t ref_incarnation = ref.generation >> 32;
  bool stale = (conn_slot != kNoSlot && conn_slot == ref.slot) ||
               (ref_incarnation != 0 && ref_incarnation < incarnation);
  if (!stale) {
    if (conn_slot == kNoSlot)
      LogRefusal("%s naming client slot %u from a connection that has not attached with the pool's token",
                 MessageTypeName(type), ref.slot);
    else
      LogRefusal("%s naming client slot %u from the connection of slot %u", MessageTypeName(type), ref.slot,
                 conn_slot);
  } else {
    ++stats_.refused_requests;
  }
  Encoder e;
  switch (MessageType(type)) {
    case MessageType::kPutStart: Encode(PutStartReply{ErrorCode::ILLEGAL_CLIENT, {}}, &e); break;
    case MessageType::kRemove:
    case MessageType::kBatchRemove: Encode(RemoveReply{ErrorCode::ILLEGAL_CLIENT, {}}, &e); break;
    case MessageType::kRemoveByRegex:
    case MessageType::kRemoveAll: Encode(CountReply{ErrorCode::ILLEGAL_CLIENT, 0}, &e); break;
    case MessageType::kSettle: Encode(TicketReply{ErrorCode::ILLEGAL_CLIENT, 0}, &e); break;
    case MessageType::kAnnounceOpen: Encode(AnnounceOpenReply{ErrorCode::ILLEGAL_CLIENT, 0, 0}, &e); break;
    case MessageType::kLocate: Encode(LocateReply{ErrorCode::ILLEGAL_CLIENT, {}}, &e); break;
    case MessageType::kPublish:
    case MessageType::kLeases: Encode(PublishReply{ErrorCode::ILLEGAL_CLIENT, {}, 0}, &e); break;
    case MessageType::kSegmentSession: Encode(SegmentSessionReply{ErrorCode::ILLEGAL_CLIENT, 0, {}}, &e); break;
    default: EncodeStatus(ErrorCode::ILLEGAL_CLIENT, &e);
  }
  *refusal = e.data();
  return false;
}

uint32_t MasterImpl::ReclaimDeadLocalClients() {
  uint32_t n = 0;
  for (uint32_t i = 0; i < clients_.size(); ++i)
    if (clients_[i].attached && clients_[i].local && LocalPidDead(clients_[i].pid)) {
      ReclaimClient(i, "process exited (found when the client table was full)");
      ++n;
    }
  return n;
}

void MasterImpl::SetAttached(uint32_t slot, bool attached) {
  uint64_t bit = 1ull << (slot % 64);
  auto& word = attached_bits_[slot / 64];
  // Release: the ring resets made before are visible to the RingServer
  // once it sees the bit. Only this (locked) path writes the bitmap.
  word.store(attached ? word.load(std::memory_order_relaxed) | bit : word.load(std::memory_order_relaxed) & ~bit,
             std::memory_order_release);
}

std::string MasterImpl::HandleAttach(Decoder* d, uint32_t* conn_slot) {
  AttachRequest req;
  AttachReply reply;
  bool local = false;
  bool remote = false;
  if (!Decode(d, &req)) {
    MCXL_LOG(kWarn, "master", "malformed Attach request rejected");
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (!req.tenant.empty() && !ValidTenantId(req.tenant)) {
    MCXL_LOG(kWarn, "master", "Attach of '%.64s' refused: invalid tenant id of %zu bytes",
             req.local_hostname.c_str(), req.tenant.size());
    reply.status = ErrorCode::INVALID_PARAMS;
  } else if (PoolLost()) {  // checked at each attach as well as in Tick
    reply.status = ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  } else if (!TokensEqual(req.token, token_) &&
             !(remote = !req.secret.empty() && SecretsEqual(req.secret, config_.remote_secret))) {
    const char* replaced = nullptr;
    for (const auto& [uuid, tok] : replaced_tokens_)
      if (TokensEqual(req.token, tok.data())) replaced = uuid.c_str();
    if (replaced != nullptr)
      LogRefusal("Attach of '%.64s' (pid %llu) refused: it mapped pool %s, whose device was replaced; it must "
                 "setup() again", req.local_hostname.c_str(), (unsigned long long)req.pid, replaced);
    else if (!req.secret.empty())
      LogRefusal("Attach of '%.64s' (claimed pid %llu) with a wrong secret%s", req.local_hostname.c_str(),
                 (unsigned long long)req.pid,
                 config_.remote_secret.empty() ? " (the master has no --auth_token_file)" : "");
    else
      LogRefusal("Attach of '%.64s' (claimed pid %llu) without the pool's token", req.local_hostname.c_str(),
                 (unsigned long long)req.pid);
    reply.status = ErrorCode::ILLEGAL_CLIENT;
  } else if ((local = req.machine == machine_) && (req.pid == 0 || LocalPidDead(req.pid))) {
    // The claim can be checked here: a slot for a process that is not
    // running would only wait for --client_ttl to be reclaimed.
    LogRefusal("Attach of '%.64s' claims pid %llu on this host, which is not running",
               req.local_hostname.c_str(), (unsigned long long)req.pid);
    reply.status = ErrorCode::ILLEGAL_CLIENT;
  } else {
    uint32_t slot = kNoSlot;
    if (ClientValid({req.prev_slot, req.prev_generation})) {
      slot = req.prev_slot;  // a reconnect of a live client keeps its slot
    } else if (req.prev_slot < retired_.size() && retired_[req.prev_slot].active &&
               retired_[req.prev_slot].generation == req.prev_generation) {
      slot = req.prev_slot;  // its views outlived the attachment: it takes back their pins
      retired_[slot].active = false;
    } else {
      for (int pass = 0; pass < 2 && slot == kNoSlot; ++pass) {
        if (pass == 1 && ReclaimDeadLocalClients() == 0) break;
        for (uint32_t i = 0; i < clients_.size(); ++i)
          if (!clients_[i].attached && !retired_[i].active) {
            slot = i;
            break;
          }
      }
    }
    if (slot == kNoSlot) {
      MCXL_LOG(kWarn, "master", "attach of %s refused: all %zu client slots are taken",
               req.local_hostname.c_str(), clients_.size());
      reply.status = ErrorCode::NO_AVAILABLE_HANDLE;
    } else {
      ClientInfo& c = clients_[slot];
      ClientSlot* cs = pool_->client_slot(slot);
      if (!c.attached || c.generation != req.prev_generation) {
        AttachAnnounceHolds(slot, req.pid, KeyHash(req.machine));
        DropSegment(slot, "a new attachment");
        c = ClientInfo{};
        c.attached = true;
        MarkPinTable(slot);
        c.generation = (uint64_t(pool_->superblock()->master_incarnation.load(std::memory_order_relaxed)) << 32) +
                       next_generation_++;
        c.pid = req.pid;
        c.local = local;
        c.remote = remote;
        c.attach_ns = NowNs();
        c.tenant = req.tenant.empty() ? std::string(kDefaultTenant) : req.tenant;
        (void)AdoptSegment(&c, slot, req);  // a refused segment: the client runs on the pool alone
        cs->pid.store(req.pid, std::memory_order_relaxed);
        cs->machine_hash.store(KeyHash(req.machine), std::memory_order_relaxed);
        snprintf(cs->host, sizeof(cs->host), "%s", req.local_hostname.c_str());
        // Release: pid and host are visible before the generation that
        // marks the slot assigned.
        ShmRing::Reset(pool_->ring(slot, 0));
        ShmRing::Reset(pool_->ring(slot, 1));
        c.reply_tail = 0;
        cs->generation.store(c.generation, std::memory_order_release);
        PublishRange(cs, kCacheLine);
        SetAttached(slot, true);
        MCXL_LOG(kInfo, "master", "client %s (pid %llu, tenant '%s'%s) attached as slot %u",
                 req.local_hostname.c_str(), (unsigned long long)req.pid, c.tenant.c_str(),
                 remote ? ", remote" : "", slot);
      }
      c.connected = true;
      *conn_slot = slot;
      const Superblock* sb = pool_->superblock();
      reply.slot = slot;
      reply.slot_generation = c.generation;
      reply.incarnation = sb->master_incarnation.load(std::memory_order_relaxed);
      reply.pool_path = pool_->path();
      reply.pool_size = pool_->geometry().pool_size;  // the verified copies, not the shared words
      memcpy(reply.uuid, pool_->geometry().uuid, 16);
      reply.lease_ttl_ms = config_.default_kv_lease_ttl_ms;
      if (remote) FillRemoteReply(&reply);
    }
  }
  Encoder e;
  Encode(reply, &e);
  return e.data();
}

std::string MasterImpl::HandleDetach(Decoder* d, uint32_t* conn_slot) {
  ClientRef ref;
  if (!Decode(d, &ref) || !d->done()) return StatusReply(ErrorCode::INVALID_PARAMS);
  if (!ClientValid(ref)) return StatusReply(ErrorCode::ILLEGAL_CLIENT);
  ReclaimClient(ref.slot, "detached");
  *conn_slot = kNoSlot;
  return StatusReply(ErrorCode::OK);
}

std::string MasterImpl::HandleHeartbeat(Decoder* d) {
  ClientRef ref;
  if (!Decode(d, &ref) || !d->done()) return StatusReply(ErrorCode::INVALID_PARAMS);
  if (!ClientValid(ref)) return StatusReply(ErrorCode::ILLEGAL_CLIENT);
  if (clients_[ref.slot].remote) {
    // A remote client cannot write its slot line; the master does it for it
    // (relaxed: CheckClients, under mu_ like this, is the only reader).
    ClientSlot* cs = pool_->client_slot(ref.slot);
    cs->heartbeat_generation.store(ref.generation, std::memory_order_relaxed);
    cs->heartbeat_ns.store(NowNs(), std::memory_order_relaxed);
    PublishRange(&cs->heartbeat_ns, kCacheLine);
  }
  return StatusReply(ErrorCode::OK);
}

void MasterImpl::ReclaimClient(uint32_t slot, const char* why) {
  ClientInfo& c = clients_[slot];
  if (!c.attached) return;
  bool dead = c.local && LocalPidDead(c.pid);
  // Revoke this client's unfinished puts before the slot can be reused.
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingPut p = pending_[i];
    if (p.owner != slot) {
      pending_[keep++] = p;
      continue;
    }
    EntryState st = PendingState(p);
    if (st != EntryState::kWriting) FinishPending(p, st);
    else RevokePending(p, dead);
  }
  pending_.resize(keep);
  DropSegment(slot, why);  // before the slot can be reused: its objects are misses
  ClientInfo was = c;
  c = ClientInfo{};
  SetAttached(slot, false);
  UnmarkPinTable(slot);  // its table stays live only if RetireOrClearPins retires it
  ClientSlot* cs = pool_->client_slot(slot);
  // The client's line (counters) was written on its host: observed before
  // it is read. Its counts are retired into ours; the next attachment
  // zeroes them (Client::Attach), and ReadCounts skips them until then. On
  // a non-coherent pool the master never writes that line: a live
  // reclaimed client (detached with views, stopped) may still write it.
  ObserveRange(cs, sizeof(ClientSlot));
  retired_hits_ += cs->get_hits.load(std::memory_order_relaxed);
  retired_misses_ += cs->get_misses.load(std::memory_order_relaxed);
  retired_disk_hits_ += cs->disk_hits.load(std::memory_order_relaxed);
  retired_disk_bad_ += cs->disk_checksum_failures.load(std::memory_order_relaxed);
  if (GetCoherenceMode() == CoherenceMode::kCoherent || was.remote) {  // a remote client's line is ours
    cs->get_hits.store(0, std::memory_order_relaxed);
    cs->get_misses.store(0, std::memory_order_relaxed);
    cs->disk_hits.store(0, std::memory_order_relaxed);
    cs->disk_checksum_failures.store(0, std::memory_order_relaxed);
  }
  cs->generation.store(0, std::memory_order_release);
  PublishRange(cs, kCacheLine);
  // The generation store first, then the caller word (a Dekker pair with
  // ShmRing::ClaimCaller): a process stopped inside a ring call keeps its
  // rings, and its slot is retired rather than handed to another client.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool in_ring_call = !dead && RingCallerHolds(slot, was.generation);
  if (!in_ring_call) {
    ShmRing::Reset(pool_->ring(slot, 0));
    ShmRing::Reset(pool_->ring(slot, 1));
  }
  // Its pins die with it (docs/architecture.md §3), unless its process may still hold
  // views or be inside a ring call: then the slot is retired (master_pins.cc).
  RetireOrClearPins(slot, was, dead, in_ring_call);
  DropAnnounceHolds(slot);
  MCXL_LOG(kInfo, "master", "client slot %u reclaimed: %s", slot, why);
}

void MasterImpl::OnDisconnect(uint32_t slot) {
  std::lock_guard<FencedMutex> lock(mu_);
  if (slot >= clients_.size() || !clients_[slot].attached) return;
  clients_[slot].connected = false;
  if (clients_[slot].local && LocalPidDead(clients_[slot].pid)) ReclaimClient(slot, "process exited");
}

void MasterImpl::CheckClients() {
  uint64_t now = NowNs();
  uint64_t ttl = config_.client_ttl_s * kNsPerSec;
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    ClientInfo& c = clients_[i];
    if (!c.attached) continue;
    if (c.local && LocalPidDead(c.pid)) {
      ReclaimClient(i, "process exited");
      continue;
    }
    ClientSlot* cs = pool_->client_slot(i);
    ObserveRange(&cs->heartbeat_ns, kCacheLine);
    uint64_t hb = cs->heartbeat_ns.load(std::memory_order_relaxed);
    if (cs->heartbeat_generation.load(std::memory_order_relaxed) != c.generation) hb = 0;
    uint64_t last = std::max(hb, c.attach_ns);
    if (now > last && now - last > ttl) ReclaimClient(i, "heartbeat expired");
  }
  CheckRetiredPins();
  SweepAnnounceChannels();
}

}  // namespace mcxl
