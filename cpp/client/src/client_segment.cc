// This client's DRAM segment (EntryState::kInSegment, docs/architecture.md
// §10). Contract: with ClientOptions::dram_segment_size > 0 the client maps
// a MAP_SHARED memfd of that size before its first Attach and names the
// size there; the master may then place this client's puts in it (the
// PutStart item names the range), and the client writes and publishes them
// kInSegment. Reads copy the entry's SegmentStub from the pool, check it
// names this attachment's segment and a range inside it, copy from the
// mapping and re-check the entry's version: a value moved, freed or reused
// meanwhile bumped it. With ClientOptions::serve_segment the mapping is
// registered with a Transfer Engine and its session named at every Attach.
// A stub naming another client's segment is read over TE (read_peer_segment)
// from the session the master names for that attachment (kSegmentSession),
// straight into the caller's buffer when it is one (a scratch buffer for
// scatter lists and ranges), then re-checked as a pool read is; an ended
// attachment, one without a session, or no engine here is a miss, a failed
// transfer TRANSFER_FAIL. A stub past its segment is refused with a log
// line (a miss). A non-coherent pool has no segments: refused here and at
// the master's Attach.
//
// Atomics: as stated at the top of client.cc.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "client_internal.h"

namespace mcxl {

namespace {
// A log line at most once a second per call site (a hot refusal must not
// flood the log).
bool LogDue(std::atomic<uint64_t>* last_log) {
  // relaxed: a rate limit of log lines, nothing is published through it.
  uint64_t now = MonoNs(), last = last_log->load(std::memory_order_relaxed);
  return now - last > 1000000000ull && last_log->compare_exchange_strong(last, now, std::memory_order_relaxed);
}
constexpr size_t kMaxPeerSegments = 1024;  // cached attachments; past it the cache starts over

// True when the stub's range lies in a segment of `segment_size` bytes and
// holds the value; else logs the refusal (a miss for the caller).
bool StubFits(const SegmentStub& stub, uint64_t value_size, uint64_t segment_size, std::string_view key) {
  if (stub.magic == kSegmentStubMagic && segment_size != 0 && stub.offset <= segment_size &&
      stub.length <= segment_size - stub.offset && value_size <= stub.length)
    return true;
  static std::atomic<uint64_t> last_log{0};
  if (LogDue(&last_log))
    MCXL_LOG(kError, "client", "segment stub of '%.*s' refused: %llu bytes at %llu (value %llu) do not fit "
             "the segment of slot %u (%llu bytes); a miss", int(key.size()), key.data(),
             (unsigned long long)stub.length, (unsigned long long)stub.offset, (unsigned long long)value_size,
             stub.slot, (unsigned long long)segment_size);
  return false;
}
}  // namespace

Status Client::MapSegment() {
  uint64_t size = options_.dram_segment_size / kCacheLine * kCacheLine;
  if (size == 0) return ErrorCode::OK;
  if (NonCoherent()) {
    // The master publishes a non-coherent pool's puts itself, as kComplete:
    // no segment there (architecture.md §10; the master refuses one too).
    MCXL_LOG(kError, "client", "DRAM segment of %llu bytes refused: the pool is non-coherent "
             "(segments need a coherent pool)", (unsigned long long)size);
    return ErrorCode::INVALID_PARAMS;
  }
  int fd = memfd_create("mooncake_cxl_dram_segment", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, off_t(size)) != 0) {
    MCXL_LOG(kError, "client", "DRAM segment of %llu bytes: memfd failed: %s", (unsigned long long)size,
             strerror(errno));
    if (fd >= 0) close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    MCXL_LOG(kError, "client", "DRAM segment of %llu bytes: mmap failed: %s", (unsigned long long)size,
             strerror(errno));
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  segment_fd_ = fd;
  segment_base_ = static_cast<char*>(p);
  segment_size_ = size;
  if (options_.serve_segment) segment_session_ = options_.serve_segment(segment_base_, size);
  MCXL_LOG(kInfo, "client", "DRAM segment of %llu bytes mapped%s%s", (unsigned long long)size,
           segment_session_.empty() ? "; not served over the Transfer Engine (only this client reads it)"
                                    : ", served over the Transfer Engine at ",
           segment_session_.c_str());
  return ErrorCode::OK;
}

void Client::UnmapSegment() {
  if (segment_base_ != nullptr) munmap(segment_base_, segment_size_);
  if (segment_fd_ >= 0) close(segment_fd_);
  segment_base_ = nullptr;
  segment_size_ = 0;
  segment_fd_ = -1;
}

char* Client::SegmentTarget(const PutStartItem& it, uint64_t size) const {
  ClientRef me = Ref();
  bool fits = segment_base_ != nullptr && it.value_offset <= segment_size_ && size <= segment_size_ - it.value_offset;
  if (it.segment_slot != me.slot || it.segment_generation != me.generation || !fits) {
    MCXL_LOG(kError, "client", "PutStart placed %llu bytes at %llu of the segment of slot %u (generation %llu): "
             "not a range of this client's segment", (unsigned long long)size, (unsigned long long)it.value_offset,
             it.segment_slot, (unsigned long long)it.segment_generation);
    return nullptr;
  }
  return segment_base_ + it.value_offset;
}

Result<bool> Client::CopyFromSegment(const EntrySnapshot& snap, std::string_view key, const ReadDest& dest) {
  const SegmentStub* p = index_->SegmentStubPtr(snap, key);
  if (p == nullptr) return false;  // geometry of a stale snapshot: retry
  SegmentStub stub;
  memcpy(&stub, p, sizeof(stub));  // one copy: only it is checked and used
  if (!index_->StillValid(snap)) return false;
  ClientRef me = Ref();
  if (stub.magic == kSegmentStubMagic && (stub.slot != me.slot || stub.slot_generation != me.generation))
    return CopyFromPeerSegment(snap, key, stub, dest);  // another client's (or our ended attachment's)
  if (!StubFits(stub, snap.value_size, segment_size_, key))
    return ErrorCode::OBJECT_NOT_FOUND;
  CopyOut(segment_base_ + stub.offset, snap.value_size, dest);
  return index_->StillValid(snap);
}

std::string Client::PeerSegmentSession(const EntrySnapshot& snap, std::string_view key, uint32_t* owner_slot) {
  *owner_slot = UINT32_MAX;
  std::string buf;
  std::string_view stored;
  if (!ScopeKey(key, "get_replica_desc", &buf, &stored)) return "";
  SegmentStub stub;
  {
    GateScope entered(read_gate_);
    const SegmentStub* p = entered.ok() && !pool_->failed() ? index_->SegmentStubPtr(snap, stored) : nullptr;
    if (p == nullptr) return "";
    memcpy(&stub, p, sizeof(stub));
  }
  if (stub.magic != kSegmentStubMagic) return "";
  *owner_slot = stub.slot;
  ClientRef me = Ref();
  if (!options_.read_peer_segment || (stub.slot == me.slot && stub.slot_generation == me.generation)) return "";
  return FindPeerSegment(stub.slot, stub.slot_generation, false).session;
}

Client::PeerSegment Client::FindPeerSegment(uint32_t slot, uint64_t generation, bool fresh) {
  auto id = std::make_pair(slot, generation);
  if (!fresh) {
    std::lock_guard<std::mutex> l(peer_mu_);
    auto it = peers_.find(id);
    if (it != peers_.end()) return it->second;
  }
  auto r = MasterCall(MessageType::kSegmentSession, [&] {
    SegmentSessionRequest req;
    req.client = Ref();
    req.slot = slot;
    req.generation = generation;
    Encoder e;
    Encode(req, &e);
    return e.data();
  }, true);
  PeerSegment peer;
  SegmentSessionReply reply;
  Decoder d(r.ok() ? std::string_view(*r) : std::string_view());
  if (!r.ok() || !Decode(&d, &reply)) {
    peer.status = r.ok() ? ErrorCode::RPC_FAIL : r.error();
    return peer;  // not cached: the master may answer next time
  }
  peer.status = reply.status;
  if (reply.status == ErrorCode::OK) {
    peer.size = reply.segment_size;
    peer.session = std::move(reply.session);
  }
  if (reply.status == ErrorCode::OK || reply.status == ErrorCode::OBJECT_NOT_FOUND) {
    // Fixed for the attachment's life (its Attach named both), and an ended
    // attachment never returns: both answers stay true.
    std::lock_guard<std::mutex> l(peer_mu_);
    if (peers_.size() >= kMaxPeerSegments) peers_.clear();
    peers_[id] = peer;
  }
  return peer;
}

Result<bool> Client::CopyFromPeerSegment(const EntrySnapshot& snap, std::string_view key, const SegmentStub& stub,
                                         const ReadDest& dest) {
  if (!options_.read_peer_segment) return ErrorCode::OBJECT_NOT_FOUND;  // no engine here
  PeerSegment peer = FindPeerSegment(stub.slot, stub.slot_generation, false);
  if (peer.status != ErrorCode::OK) return peer.status == ErrorCode::OBJECT_NOT_FOUND ? peer.status : ErrorCode::TRANSFER_FAIL;
  if (!StubFits(stub, snap.value_size, peer.size, key)) return ErrorCode::OBJECT_NOT_FOUND;
  // One destination buffer: the transfer lands there, as a pool read's copy
  // does before its re-check; scatter lists and ranges go through scratch.
  char* direct = dest.ranges == nullptr && dest.nslices == 1 && dest.slices[0].size >= snap.value_size
                     ? static_cast<char*>(dest.slices[0].data)
                     : nullptr;
  thread_local std::string scratch;
  if (direct == nullptr && scratch.size() < snap.value_size) scratch.resize(snap.value_size);
  bool copied = options_.read_peer_segment(peer.session, stub.offset, direct ? direct : scratch.data(),
                                           snap.value_size);
  // The re-check: a changed entry is located again (the caller's bytes are
  // then rewritten or the read is a miss).
  if (!index_->StillValid(snap)) return false;
  if (!copied) {
    // An owner gone (not yet reclaimed) is a miss; a live one a failed transfer.
    bool live = FindPeerSegment(stub.slot, stub.slot_generation, true).status == ErrorCode::OK;
    static std::atomic<uint64_t> last_log{0};
    if (LogDue(&last_log))
      MCXL_LOG(kWarn, "client", "Transfer Engine read of '%.*s' (%llu bytes) from the segment of slot %u at %s "
               "failed: %s", int(key.size()), key.data(), (unsigned long long)snap.value_size, stub.slot,
               peer.session.c_str(), live ? "TRANSFER_FAIL" : "its owner is gone, a miss");
    return live ? ErrorCode::TRANSFER_FAIL : ErrorCode::OBJECT_NOT_FOUND;
  }
  if (direct == nullptr) CopyOut(scratch.data(), snap.value_size, dest);
  return true;
}

}  // namespace mcxl
