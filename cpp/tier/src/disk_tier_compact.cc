// SSD tier compaction: copies the live records of the segment with the most
// garbage to the active segment, reports relocations, and deletes the old
// segment only after the copies are fdatasynced (disk_tier.h).
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {
namespace {

// Raw record image chunks from the victim go to the destination (block 0 deferred).
struct CopySink : RawSink {
  ImageWriter* w;
  explicit CopySink(ImageWriter* writer) : w(writer) {}
  bool Chunk(uint64_t pos, uint8_t* data, uint64_t n) override {
    w->Put(pos, data, AlignUp(n));
    return w->err == 0;
  }
};

struct Relocation {
  std::string key;
  RecordLocation old_loc, new_loc;
};

}  // namespace

Status DiskTier::Compact(uint64_t budget_bytes) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> clock(t.cmu);
  std::vector<Relocation> relocs;
  bool finished_scan = false;
  Status result = ErrorCode::OK;
  {
    std::lock_guard<std::mutex> wlock(t.wmu);
    CompactCursor& cc = t.cc;
    if (cc.victim == 0) {
      double best = 0;
      uint32_t victim = 0;
      for (const auto& [id, seg] : t.segs) {
        if (id == t.active_id || seg.end <= kBlockSize) continue;
        uint64_t dead = seg.end - kBlockSize - std::min(seg.live, seg.end - kBlockSize);
        double ratio = double(dead) / double(seg.end - kBlockSize);
        if (dead > 0 && ratio >= t.opt.compact_garbage_ratio && ratio > best) {
          best = ratio;
          victim = id;
        }
      }
      if (victim == 0) return ErrorCode::OK;
      const std::string path = SegmentPath(t.opt.root_dir, victim);
      cc = CompactCursor{};
      cc.fd = OpenMaybeDirect(path, O_RDONLY, t.opt.direct_io, &cc.direct);
      struct stat st;
      if (cc.fd < 0 || fstat(cc.fd, &st) != 0) {
        MCXL_LOG(kError, "disk_tier", "compact: open %s: %s", path.c_str(), strerror(errno));
        if (cc.fd >= 0) close(cc.fd);
        cc.fd = -1;
        return ErrorCode::FILE_OPEN_FAIL;
      }
      cc.victim = victim;
      cc.cursor = kBlockSize;
      cc.file_size = uint64_t(st.st_size);
      MCXL_LOG(kInfo, "disk_tier", "compacting segment %u (%.0f%% garbage)", victim, best * 100);
    }
    AlignedBuf blk = AllocAligned(kBlockSize);
    if (!blk) {  // the cursor stays: the next call resumes
      MCXL_LOG(kError, "disk_tier", "compact: out of memory for a %llu-byte buffer", (unsigned long long)kBlockSize);
      return ErrorCode::INTERNAL_ERROR;
    }
    std::string key;
    uint64_t copied = 0;
    while (cc.cursor + kHeaderBytes <= cc.file_size && (budget_bytes == 0 || copied < budget_bytes)) {
      const uint64_t off = cc.cursor;
      uint64_t got = 0;
      RecordHeader h;
      const char* bad = nullptr;
      if (PreadUpTo(cc.fd, blk.get(), kBlockSize, off, &got) != 0 || got < kHeaderBytes) {
        bad = "short read";
      } else {
        memcpy(&h, blk.get(), sizeof(h));
        bad = CheckRecordHeader(h, cc.victim, off, cc.file_size);
      }
      if (bad == nullptr) {
        key.resize(h.key_len);
        uint64_t in_blk = std::min<uint64_t>(h.key_len, got - kHeaderBytes);
        memcpy(key.data(), blk.get() + kHeaderBytes, in_blk);
        if (in_blk < h.key_len) {
          // A long key: read the rest (aligned reads for an O_DIRECT fd).
          uint64_t span = AlignUp(kHeaderBytes + h.key_len);
          AlignedBuf kb = AllocAligned(span);
          if (!kb) {  // not garbage: stop here, the next call retries this record
            MCXL_LOG(kError, "disk_tier", "compact: out of memory for a %llu-byte key buffer",
                     (unsigned long long)span);
            result = ErrorCode::INTERNAL_ERROR;
            break;
          }
          if (PreadUpTo(cc.fd, kb.get(), span, off, &got) != 0 || got < kHeaderBytes + h.key_len)
            bad = "key read";
          else
            memcpy(key.data(), kb.get() + kHeaderBytes, h.key_len);
        }
        if (bad == nullptr && Crc32c(key.data(), key.size()) != h.key_crc) bad = "key crc";
      }
      if (bad != nullptr) {  // not a record (rebuild skipped it too): garbage
        cc.cursor += kBlockSize;
        continue;
      }
      const uint64_t bytes = RecordBytes(h.key_len, h.value_len);
      auto it = t.keys.find(key);
      bool keep = false;
      if (it != t.keys.end()) {
        const KeyState& st = it->second;
        if (h.kind == kKindValue)
          keep = st.live.segment_id == cc.victim && st.live.offset == off;
        else
          keep = st.tomb_seg == cc.victim && st.tomb_off == off && st.dead_values > 0;
      }
      if (!keep) {
        if (it != t.keys.end()) {
          if (h.kind == kKindValue) cc.dead_values.push_back(key);
          else cc.dropped.emplace_back(key, off);
        }
        cc.cursor += bytes;
        continue;
      }
      uint32_t dseg = 0;
      uint64_t doff = 0;
      Status s = t.Reserve(bytes, true, &dseg, &doff);
      if (!s.ok() && s.error() == ErrorCode::NO_AVAILABLE_HANDLE && t.ReleaseReserve())
        continue;  // the full filesystem gave way to the reserve: this record again
      if (!s.ok()) {
        result = s;
        break;
      }
      ImageWriter w{t.active_fd, doff, bytes, ThreadBuffer(2, kBlockSize)};
      CopySink sink(&w);
      const char* why = "";
      RecordHeader src{};
      s = ReadVerified(cc.fd, cc.direct, cc.victim, off, cc.file_size, key, nullptr, nullptr, &sink,
                       &src, &why);
      if (!s.ok() && w.err != 0) s = WriteErrorCode(w.err);  // the copy's write failed
      if (s.ok()) {
        RecordHeader nh = src;
        nh.reserved |= kRecordCopy;  // its seq is the original's: rebuild's damage bound skips it
        nh.segment_id = dseg;
        nh.offset = doff;
        SealRecordHeader(&nh);
        if (w.Finish(nh) != 0) s = WriteErrorCode(w.err);
      }
      if (!s.ok()) {
        t.Unreserve(dseg, doff, bytes);
        if (w.err != 0) t.WriteFailed(w.err, "compaction copy", dseg, doff);
        if (s.error() == ErrorCode::CHECKSUM_MISMATCH && h.kind == kKindValue) {
          // A corrupt live record: dropped (reported with new segment 0), never copied.
          CountChecksumFailure();
          MCXL_LOG(kError, "disk_tier", "compact: segment %u offset %llu: %s; record dropped",
                   cc.victim, (unsigned long long)off, why);
          std::lock_guard<std::mutex> lock(t.mu);
          KeyState& st = it->second;
          relocs.push_back({key, st.live, RecordLocation{}});
          st.live = RecordLocation{};
          t.objects--;
          cc.cursor += bytes;
          continue;
        }
        if (s.error() == ErrorCode::NO_AVAILABLE_HANDLE && t.ReleaseReserve()) continue;
        uint64_t suppressed = 0;
        if (t.write_log.Allow(&suppressed))
          MCXL_LOG(kError, "disk_tier", "compact: copy of segment %u offset %llu: %s (%s; %llu more failed writes "
                   "in the last second not logged)", cc.victim, (unsigned long long)off, ErrorCodeName(s.error()),
                   why, (unsigned long long)suppressed);
        result = s;
        break;
      }
      {
        std::lock_guard<std::mutex> lock(t.mu);
        KeyState& st = it->second;
        if (h.kind == kKindValue) {
          RecordLocation old = st.live;
          st.live.segment_id = dseg;
          st.live.offset = doff;
          relocs.push_back({key, old, st.live});
          t.relocations++;
        } else {
          st.tomb_seg = dseg;
          st.tomb_off = doff;
        }
        t.AddLive(dseg, int64_t(bytes));  // the victim's accounting goes with it
      }
      t.Hook("compact.copied");
      copied += bytes;
      cc.cursor += bytes;
    }
    finished_scan = result.ok() && cc.cursor + kHeaderBytes > cc.file_size;
  }
  // Callbacks without our locks (see the header), before the old copies go away.
  if (t.reloc_cb)
    for (const Relocation& r : relocs) t.reloc_cb(r.key, r.old_loc, r.new_loc);
  if (!finished_scan) return result;

  std::lock_guard<std::mutex> wlock(t.wmu);
  CompactCursor& cc = t.cc;
  if (t.active_fd >= 0 && fdatasync(t.active_fd) != 0) {
    MCXL_LOG(kError, "disk_tier", "compact: fdatasync: %s; segment %u kept", strerror(errno),
             cc.victim);
    return ErrorCode::WRITE_FAIL;
  }
  t.Hook("compact.synced");
  const std::string path = SegmentPath(t.opt.root_dir, cc.victim);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    MCXL_LOG(kError, "disk_tier", "compact: unlink %s: %s", path.c_str(), strerror(errno));
    return ErrorCode::WRITE_FAIL;
  }
  int e = FsyncDir(t.opt.root_dir);
  if (e != 0) MCXL_LOG(kWarn, "disk_tier", "compact: fsync of %s: %s", t.opt.root_dir.c_str(), strerror(e));
  ForgetReaderFd(path);
  t.Hook("compact.unlinked");
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (const std::string& k : cc.dead_values) {
      auto it = t.keys.find(k);
      if (it == t.keys.end()) continue;
      if (it->second.dead_values > 0) it->second.dead_values--;
      t.Reaccount(it->second, k.size());
      t.MaybeErase(it);
    }
    for (const auto& [k, off] : cc.dropped) {
      auto it = t.keys.find(k);
      if (it == t.keys.end()) continue;
      KeyState& st = it->second;
      if (st.tombs > 0) st.tombs--;
      if (st.tomb_seg == cc.victim && st.tomb_off == off) {
        st.tomb_seg = 0;  // gone with the victim (its bytes were not counted live)
        st.tomb_live = false;
      }
      if (st.tombs == 0) st.tomb_gen = 0;
      t.MaybeErase(it);
    }
    auto sit = t.segs.find(cc.victim);
    if (sit != t.segs.end()) {
      t.used -= sit->second.end;
      t.segs.erase(sit);
    }
    t.compactions++;
    close(cc.fd);
    cc = CompactCursor{};
  }
  t.HoldReserve();
  // What the filesystem got back (a reader's open fd may still keep the
  // victim's blocks): the capacity must not count on more.
  t.RefreshSpace();
  return ErrorCode::OK;
}

}  // namespace mcxl::tier
