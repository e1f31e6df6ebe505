// This client's DRAM segment (EntryState::kInSegment, docs/architecture.md
// §10). Contract: with ClientOptions::dram_segment_size > 0 the client maps
// a MAP_SHARED memfd of that size before its first Attach and names the
// size there; the master may then place this client's puts in it (the
// PutStart item names the range), and the client writes and publishes them
// kInSegment. Reads copy the entry's SegmentStub from the pool, check it
// names this attachment's segment and a range inside it, copy from the
// mapping and re-check the entry's version: a value moved, freed or reused
// meanwhile bumped it. A stub naming another client's segment is a miss
// here (only the owner reads its segment); one past the segment is refused
// with a log line (a miss). A non-coherent pool has no segments: refused
// here and at the master's Attach.
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
  MCXL_LOG(kInfo, "client", "DRAM segment of %llu bytes mapped", (unsigned long long)size);
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
    return ErrorCode::OBJECT_NOT_FOUND;  // another client's segment (or our ended attachment's)
  bool fits = stub.magic == kSegmentStubMagic && segment_base_ != nullptr && stub.offset <= segment_size_ &&
              stub.length <= segment_size_ - stub.offset && snap.value_size <= stub.length;
  if (!fits) {
    static std::atomic<uint64_t> last_log{0};  // relaxed: rate limit of a log line
    uint64_t now = MonoNs(), last = last_log.load(std::memory_order_relaxed);
    if (now - last > 1000000000ull && last_log.compare_exchange_strong(last, now, std::memory_order_relaxed))
      MCXL_LOG(kError, "client", "segment stub of '%.*s' refused: %llu bytes at %llu (value %llu) do not fit "
               "this client's segment of %llu bytes; a miss", int(key.size()), key.data(),
               (unsigned long long)stub.length, (unsigned long long)stub.offset,
               (unsigned long long)snap.value_size, (unsigned long long)segment_size_);
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  CopyOut(segment_base_ + stub.offset, snap.value_size, dest);
  return index_->StillValid(snap);
}

}  // namespace mcxl
