// SSD tier writer: Open (rebuild from the segment files), Append, Remove,
// the index queries. Format and policy: disk_tier.h.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <unordered_set>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {

ErrorCode WriteErrorCode(int err) {
  return (err == ENOSPC || err == EDQUOT) ? ErrorCode::NO_AVAILABLE_HANDLE : ErrorCode::WRITE_FAIL;
}

void ImageWriter::Put(uint64_t pos, uint8_t* data, uint64_t n) {
  if (err != 0 || n == 0) return;
  if (pos == 0 && n >= total) {
    single = data;  // written whole by Finish
    return;
  }
  if (pos == 0) {
    memcpy(block0, data, kBlockSize);
    data += kBlockSize;
    n -= kBlockSize;
    pos = kBlockSize;
  }
  err = PwriteFull(fd, data, n, base + pos);
}

int ImageWriter::Finish(const RecordHeader& h) {
  if (err != 0) return err;
  uint8_t* first = single != nullptr ? single : block0;
  memcpy(first, &h, sizeof(h));
  err = PwriteFull(fd, first, single != nullptr ? total : kBlockSize, base);
  return err;
}

DiskTier::Impl::~Impl() {
  if (active_fd >= 0) {
    fdatasync(active_fd);
    close(active_fd);
  }
  if (cc.fd >= 0) close(cc.fd);
}

void DiskTier::Impl::AddLive(uint32_t seg, int64_t delta) {
  auto it = segs.find(seg);
  if (it != segs.end()) it->second.live = uint64_t(int64_t(it->second.live) + delta);
}

void DiskTier::Impl::Reaccount(KeyState& st, size_t key_len) {
  bool needed = st.tomb_seg != 0 && st.dead_values > 0;
  if (needed == st.tomb_live) return;
  st.tomb_live = needed;
  AddLive(st.tomb_seg, (needed ? 1 : -1) * int64_t(RecordBytes(key_len, 0)));
}

void DiskTier::Impl::MaybeErase(std::unordered_map<std::string, KeyState>::iterator it) {
  const KeyState& st = it->second;
  if (st.live.segment_id == 0 && st.dead_values == 0 && st.tombs == 0) keys.erase(it);
}

bool DiskTier::Impl::ReleaseReserve() {
  if (!reserve_held) return false;
  reserve_held = false;
  unlink((opt.root_dir + "/reserve.mcxl").c_str());
  MCXL_LOG(kWarn, "disk_tier", "filesystem full: released the %llu-byte reserve for removes/compaction",
           (unsigned long long)reserve_bytes);
  return true;
}

void DiskTier::Impl::HoldReserve() {
  if (reserve_held || reserve_bytes == 0) return;
  const std::string path = opt.root_dir + "/reserve.mcxl";
  // At most 1/8 of the free space, so a small filesystem keeps most of itself.
  uint64_t want = reserve_bytes;
  struct statvfs sv;
  if (statvfs(opt.root_dir.c_str(), &sv) == 0)
    want = std::min<uint64_t>(want, uint64_t(sv.f_bavail) * sv.f_frsize / 8);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  for (want &= ~(kBlockSize - 1); want >= 16 * kBlockSize; want = (want / 2) & ~(kBlockSize - 1)) {
    if (fallocate(fd, 0, 0, off_t(want)) == 0) {
      reserve_held = true;
      break;
    }
  }
  close(fd);
  if (!reserve_held) unlink(path.c_str());  // no room: try again after the next compaction
}

Status DiskTier::Impl::CreateSegment() {
  const uint32_t id = next_seg_id;
  const std::string path = SegmentPath(opt.root_dir, id);
  bool direct = false;
  int fd = OpenMaybeDirect(path, O_RDWR | O_CREAT | O_EXCL, opt.direct_io, &direct);
  if (fd < 0) {
    int e = errno;
    MCXL_LOG(kError, "disk_tier", "create %s: %s", path.c_str(), strerror(e));
    return WriteErrorCode(e);
  }
  AlignedBuf blk = AllocAligned(kBlockSize);
  if (!blk) {
    MCXL_LOG(kError, "disk_tier", "create %s: out of memory for a %llu-byte buffer", path.c_str(),
             (unsigned long long)kBlockSize);
    close(fd);
    unlink(path.c_str());
    return ErrorCode::INTERNAL_ERROR;
  }
  memset(blk.get(), 0, kBlockSize);
  SegmentHeader sh{};
  sh.magic = kSegmentMagic;
  sh.version = kFormatVersion;
  sh.segment_id = id;
  sh.block_size = kBlockSize;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  sh.created_ns = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  SealSegmentHeader(&sh);
  memcpy(blk.get(), &sh, sizeof(sh));
  int e = PwriteFull(fd, blk.get(), kBlockSize, 0);
  if (e == EINVAL && direct) {  // accepted O_DIRECT at open, not our writes: go buffered
    close(fd);
    fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    direct = false;
    e = fd < 0 ? errno : PwriteFull(fd, blk.get(), kBlockSize, 0);
  }
  if (e == 0 && fdatasync(fd) != 0) e = errno;
  if (e == 0) e = FsyncDir(opt.root_dir);
  if (e != 0) {
    MCXL_LOG(kError, "disk_tier", "initialize %s: %s", path.c_str(), strerror(e));
    if (fd >= 0) close(fd);
    unlink(path.c_str());
    return WriteErrorCode(e);
  }
  std::lock_guard<std::mutex> lock(mu);
  next_seg_id = id + 1;
  segs[id] = SegmentState{kBlockSize, 0};
  used += kBlockSize;
  active_id = id;
  active_fd = fd;
  active_direct = direct;
  return ErrorCode::OK;
}

Status DiskTier::Impl::Reserve(uint64_t bytes, bool compaction, uint32_t* seg, uint64_t* off) {
  bool roll = active_id == 0 || active_fd < 0 ||  // none yet, or the last creation failed
              (segs[active_id].end + bytes > opt.segment_bytes && segs[active_id].end > kBlockSize);
  uint64_t cost = bytes + (roll ? kBlockSize : 0);
  if (!compaction && used + cost > opt.capacity_bytes) {
    if (!logged_full)
      MCXL_LOG(kWarn, "disk_tier", "tier full: %llu of %llu bytes used, a record needs %llu",
               (unsigned long long)used, (unsigned long long)opt.capacity_bytes,
               (unsigned long long)cost);
    logged_full = true;
    return ErrorCode::NO_AVAILABLE_HANDLE;
  }
  if (roll) {
    if (active_fd >= 0) {  // seal: the full segment becomes durable before we leave it
      if (fdatasync(active_fd) != 0)
        MCXL_LOG(kError, "disk_tier", "fdatasync of segment %u: %s", active_id, strerror(errno));
      close(active_fd);
      active_fd = -1;
    }
    Status s = CreateSegment();
    if (!s.ok()) return s;
  }
  std::lock_guard<std::mutex> lock(mu);
  SegmentState& a = segs[active_id];
  *seg = active_id;
  *off = a.end;
  a.end += bytes;
  used += bytes;
  logged_full = false;
  return ErrorCode::OK;
}

void DiskTier::Impl::Unreserve(uint32_t seg, uint64_t off, uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu);
    SegmentState& a = segs[seg];
    a.end = off;  // writes are serialized (wmu): this record is the segment's tail
    used -= bytes;
  }
  if (seg == active_id && active_fd >= 0 && ftruncate(active_fd, off_t(off)) != 0)
    MCXL_LOG(kWarn, "disk_tier", "truncate segment %u after a failed write: %s", seg,
             strerror(errno));
}

namespace {

// Fills record image bytes [pos, pos + n) into out: header placeholder, key,
// value, zero padding; value bytes are crc'd in order as copied.
void FillImage(uint8_t* out, uint64_t pos, uint64_t n, std::string_view key, const uint8_t* value,
               uint64_t len, uint32_t* crc) {
  memset(out, 0, n);
  const uint64_t kb = kHeaderBytes, vb = kHeaderBytes + key.size(), ve = vb + len;
  const uint64_t end = pos + n;
  uint64_t a = std::max(pos, kb), b = std::min(end, vb);
  if (a < b) memcpy(out + (a - pos), key.data() + (a - kb), b - a);
  a = std::max(pos, vb);
  b = std::min(end, ve);
  if (a < b) {
    memcpy(out + (a - pos), value + (a - vb), b - a);
    *crc = Crc32c(out + (a - pos), b - a, *crc);  // crc of exactly the bytes written
  }
}

// Scans one segment's records. visit(h, key, off) for each valid record.
// Blocks that are not valid headers count as garbage; a header found after such
// a gap must pass its value crc too. INTERNAL_ERROR when no buffer could be
// allocated (nothing visited: a segment half scanned could miss a tombstone).
template <typename Visit>
Status ScanSegment(int fd, uint32_t id, uint64_t size, const std::string& path, Visit visit) {
  AlignedBuf blk = AllocAligned(kBlockSize);
  if (!blk) {
    MCXL_LOG(kError, "disk_tier", "%s: out of memory for the scan buffer", path.c_str());
    return ErrorCode::INTERNAL_ERROR;
  }
  std::string key;
  uint64_t off = kBlockSize;
  bool resync = false;
  uint64_t skipped = 0;
  while (off + kHeaderBytes <= size) {
    uint64_t got = 0;
    if (PreadUpTo(fd, blk.get(), kBlockSize, off, &got) != 0 || got < kHeaderBytes) break;
    RecordHeader h;
    memcpy(&h, blk.get(), sizeof(h));
    const char* bad = CheckRecordHeader(h, id, off, size);
    if (bad == nullptr) {
      key.resize(h.key_len);
      uint64_t in_blk = std::min<uint64_t>(h.key_len, got - kHeaderBytes);
      memcpy(key.data(), blk.get() + kHeaderBytes, in_blk);
      if (in_blk < h.key_len &&
          PreadUpTo(fd, key.data() + in_blk, h.key_len - in_blk, off + kHeaderBytes + in_blk,
                    &got) != 0)
        bad = "key read";
      else if (Crc32c(key.data(), key.size()) != h.key_crc)
        bad = "key crc";
    }
    // Verify the value too where a torn write could hide: after a gap, and for a
    // record not directly followed by another valid header (a segment's tail).
    bool tail = true;
    if (bad == nullptr) {
      const uint64_t next = off + RecordBytes(h.key_len, h.value_len);
      RecordHeader nh;
      uint64_t ngot = 0;
      if (next + kHeaderBytes <= size && PreadUpTo(fd, &nh, sizeof(nh), next, &ngot) == 0 &&
          ngot == sizeof(nh) && CheckRecordHeader(nh, id, next, size) == nullptr)
        tail = false;
    }
    if (bad == nullptr && (resync || tail) && h.kind == kKindValue) {
      const char* why = "";
      RecordLocation e;
      e.key_len = h.key_len;
      e.value_len = h.value_len;
      e.generation = h.generation;
      e.crc32c = h.value_crc;
      if (!ReadVerified(fd, false, id, off, size, key, &e, nullptr, nullptr, nullptr, &why).ok())
        bad = why;
    }
    if (bad != nullptr) {
      if (!resync) MCXL_LOG(kWarn, "disk_tier", "%s offset %llu: skipping (%s)", path.c_str(),
                            (unsigned long long)off, bad);
      resync = true;
      skipped++;
      off += kBlockSize;
      continue;
    }
    resync = false;
    visit(h, std::string_view(key), off);
    off += RecordBytes(h.key_len, h.value_len);
  }
  if (skipped > 0)
    MCXL_LOG(kWarn, "disk_tier", "%s: %llu blocks were not records (torn or corrupt)",
             path.c_str(), (unsigned long long)skipped);
  return ErrorCode::OK;
}

}  // namespace

namespace {
// A record header with everything but value_crc (the caller sets it, then seals).
RecordHeader NewRecordHeader(uint16_t kind, std::string_view key, uint32_t seg, uint64_t off,
                             uint64_t value_len, uint64_t generation, uint64_t seq) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  h.version = kFormatVersion;
  h.kind = kind;
  h.key_len = uint32_t(key.size());
  h.segment_id = seg;
  h.offset = off;
  h.value_len = value_len;
  h.generation = generation;
  h.seq = seq;
  h.key_crc = Crc32c(key.data(), key.size());
  return h;
}

// The index side of a written tombstone of `bytes` at (seg, off): the key's
// live record turns dead (under mu).
void CommitTombstone(DiskTier::Impl& t, KeyState& st, uint32_t seg, uint64_t off, uint64_t bytes,
                     uint64_t generation) {
  if (st.live.segment_id != 0) {
    t.AddLive(st.live.segment_id, -int64_t(RecordBytes(st.live.key_len, st.live.value_len)));
    st.live = RecordLocation{};
    st.dead_values++;
    t.objects--;
  }
  if (st.tomb_seg != 0 && st.tomb_live) t.AddLive(st.tomb_seg, -int64_t(bytes));
  st.tomb_seg = seg;
  st.tomb_off = off;
  st.tomb_live = st.dead_values > 0;
  if (st.tomb_live) t.AddLive(seg, int64_t(bytes));
  st.tombs++;
  st.tomb_gen = std::max(st.tomb_gen, generation);
  t.max_gen = std::max(t.max_gen, generation);
}

// The index side of a written value record (under mu).
void CommitValue(DiskTier::Impl& t, std::string_view key, const RecordLocation& loc, uint64_t seq) {
  KeyState& st = t.keys[std::string(key)];
  if (st.live.segment_id != 0) {
    t.AddLive(st.live.segment_id, -int64_t(RecordBytes(st.live.key_len, st.live.value_len)));
    st.dead_values++;
  } else {
    t.objects++;
  }
  st.live = loc;
  st.live_seq = seq;
  t.AddLive(loc.segment_id, int64_t(RecordBytes(loc.key_len, loc.value_len)));
  t.Reaccount(st, key.size());
  t.max_gen = std::max(t.max_gen, loc.generation);
  t.appends++;
}
}  // namespace

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const Options& options) {
  if (options.root_dir.empty() || options.segment_bytes < 2 * kBlockSize ||
      options.capacity_bytes < kBlockSize) {
    MCXL_LOG(kError, "disk_tier", "bad options: root_dir '%s', segment_bytes %llu, capacity %llu",
             options.root_dir.c_str(), (unsigned long long)options.segment_bytes,
             (unsigned long long)options.capacity_bytes);
    return ErrorCode::INVALID_PARAMS;
  }
  std::error_code ec;
  std::filesystem::create_directories(options.root_dir, ec);
  if (ec) {
    MCXL_LOG(kError, "disk_tier", "create %s: %s", options.root_dir.c_str(), ec.message().c_str());
    return ErrorCode::FILE_OPEN_FAIL;
  }
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->opt.segment_bytes = AlignUp(options.segment_bytes);
  Impl& t = *impl;

  std::vector<uint32_t> ids;
  DIR* d = opendir(options.root_dir.c_str());
  if (d == nullptr) {
    MCXL_LOG(kError, "disk_tier", "open %s: %s", options.root_dir.c_str(), strerror(errno));
    return ErrorCode::FILE_OPEN_FAIL;
  }
  while (dirent* de = readdir(d)) {
    uint32_t id;
    if (ParseSegmentName(de->d_name, &id)) ids.push_back(id);
  }
  closedir(d);
  std::sort(ids.begin(), ids.end());
  if (!ids.empty()) t.next_seg_id = ids.back() + 1;

  std::unordered_map<std::string, uint32_t> value_count;
  uint32_t reuse_id = 0;
  for (uint32_t id : ids) {
    const std::string path = SegmentPath(options.root_dir, id);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      MCXL_LOG(kError, "disk_tier", "open %s: %s (skipped)", path.c_str(), strerror(errno));
      continue;
    }
    struct stat st;
    SegmentHeader sh{};
    uint64_t got = 0;
    const char* bad = nullptr;
    if (fstat(fd, &st) != 0 || PreadUpTo(fd, &sh, sizeof(sh), 0, &got) != 0 || got < sizeof(sh))
      bad = "short file";
    else
      bad = CheckSegmentHeader(sh, id);
    if (bad != nullptr) {
      MCXL_LOG(kWarn, "disk_tier", "%s: not a segment (%s); left alone", path.c_str(), bad);
      close(fd);
      continue;
    }
    const uint64_t size = uint64_t(st.st_size);
    t.segs[id] = SegmentState{AlignUp(size), 0};
    t.used += AlignUp(size);
    bool any = false;
    Status scanned = ScanSegment(fd, id, size, path, [&](const RecordHeader& h, std::string_view key, uint64_t off) {
      any = true;
      KeyState& ks = t.keys[std::string(key)];
      t.max_gen = std::max(t.max_gen, h.generation);
      t.next_seq = std::max(t.next_seq, h.seq + 1);
      if (h.kind == kKindValue) {
        value_count[std::string(key)]++;
        if (ks.live.segment_id == 0 ||
            std::tie(h.generation, h.seq) > std::tie(ks.live.generation, ks.live_seq)) {
          ks.live = RecordLocation{id, 0, off, h.value_len, h.value_crc, h.key_len, h.generation};
          ks.live_seq = h.seq;
        }
      } else {
        ks.tombs++;
        if (ks.tomb_seg == 0 || h.generation >= ks.tomb_gen) {
          ks.tomb_gen = h.generation;
          ks.tomb_seg = id;
          ks.tomb_off = off;
        }
      }
    });
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // the scan must not keep the tier cached
    close(fd);
    // A segment left out could hold a tombstone: better no tier than one
    // that brings removed keys back.
    if (!scanned.ok()) return scanned.error();
    if (!any && id == ids.back() && size <= kBlockSize) reuse_id = id;
  }
  for (auto it = t.keys.begin(); it != t.keys.end();) {
    KeyState& ks = it->second;
    uint32_t values = value_count[it->first];
    if (ks.live.segment_id != 0 && ks.tombs > 0 && ks.live.generation <= ks.tomb_gen)
      ks.live = RecordLocation{};
    ks.dead_values = values - (ks.live.segment_id != 0 ? 1 : 0);
    if (ks.live.segment_id != 0) {
      t.objects++;
      t.AddLive(ks.live.segment_id, int64_t(RecordBytes(ks.live.key_len, ks.live.value_len)));
    }
    ks.tomb_live = ks.tomb_seg != 0 && ks.dead_values > 0;
    if (ks.tomb_live) t.AddLive(ks.tomb_seg, int64_t(RecordBytes(it->first.size(), 0)));
    ++it;
  }
  if (reuse_id != 0) {  // the newest segment holds no record: append to it
    const std::string path = SegmentPath(options.root_dir, reuse_id);
    t.active_fd = OpenMaybeDirect(path, O_RDWR, options.direct_io, &t.active_direct);
    if (t.active_fd >= 0) {
      t.active_id = reuse_id;
      if (t.segs[reuse_id].end != kBlockSize) {  // a torn tail inside block 0's size
        t.used -= t.segs[reuse_id].end - kBlockSize;
        t.segs[reuse_id].end = kBlockSize;
      }
    }
  }
  t.reserve_bytes = options.reserve_bytes != ~0ull ? options.reserve_bytes
                                                   : std::min<uint64_t>(t.opt.segment_bytes, 64ull << 20);
  t.HoldReserve();
  MCXL_LOG(kInfo, "disk_tier", "opened %s: %zu segments, %llu objects, %llu bytes used",
           options.root_dir.c_str(), t.segs.size(), (unsigned long long)t.objects,
           (unsigned long long)t.used);
  return std::unique_ptr<DiskTier>(new DiskTier(std::move(impl)));
}

Result<RecordLocation> DiskTier::Append(std::string_view key, const void* value, uint64_t len,
                                        uint64_t generation) {
  Impl& t = *impl_;
  if (key.empty() || key.size() > kMaxTierKeyLength || len > kMaxTierValueLength ||
      (value == nullptr && len > 0)) {
    MCXL_LOG(kWarn, "disk_tier", "append: bad key length %zu or value length %llu", key.size(),
             (unsigned long long)len);
    return ErrorCode::INVALID_PARAMS;
  }
  std::lock_guard<std::mutex> wlock(t.wmu);
  auto it = t.keys.find(std::string(key));
  if (it != t.keys.end()) {
    const KeyState& st = it->second;
    if ((st.live.segment_id != 0 && generation < st.live.generation) ||
        (st.tombs > 0 && generation <= st.tomb_gen)) {
      MCXL_LOG(kWarn, "disk_tier", "append: generation %llu is stale for its key",
               (unsigned long long)generation);
      return ErrorCode::INVALID_VERSION;
    }
  }
  const uint64_t bytes = RecordBytes(key.size(), len);
  uint32_t seg = 0;
  uint64_t off = 0;
  Status s = t.Reserve(bytes, false, &seg, &off);
  if (!s.ok()) return s.error();

  RecordHeader h = NewRecordHeader(kKindValue, key, seg, off, len, generation, t.next_seq++);
  uint8_t* stage = ThreadBuffer(1, kChunkBytes);
  uint8_t* blk0 = ThreadBuffer(2, kBlockSize);
  if (stage == nullptr || blk0 == nullptr) {
    t.Unreserve(seg, off, bytes);
    return ErrorCode::INTERNAL_ERROR;
  }
  ImageWriter w{t.active_fd, off, bytes, blk0};
  uint32_t crc = 0;
  for (uint64_t pos = 0; pos < bytes && w.err == 0; pos += kChunkBytes) {
    uint64_t n = std::min(kChunkBytes, bytes - pos);
    FillImage(stage, pos, n, key, static_cast<const uint8_t*>(value), len, &crc);
    w.Put(pos, stage, n);
  }
  h.value_crc = crc;
  SealRecordHeader(&h);
  int e = w.Finish(h);
  if (e == 0 && t.opt.sync_each_append && fdatasync(t.active_fd) != 0) e = errno;
  if (e != 0) {
    MCXL_LOG(kError, "disk_tier", "append to segment %u at %llu: %s", seg,
             (unsigned long long)off, strerror(e));
    t.Unreserve(seg, off, bytes);
    return WriteErrorCode(e);
  }
  RecordLocation loc{seg, 0, off, len, crc, uint32_t(key.size()), generation};
  std::lock_guard<std::mutex> lock(t.mu);
  CommitValue(t, key, loc, h.seq);
  return loc;
}

namespace {
// Append's checks on one item (under wmu).
ErrorCode CheckAppend(const DiskTier::Impl& t, const DiskTier::BatchItem& it) {
  if (it.key.empty() || it.key.size() > kMaxTierKeyLength || it.len > kMaxTierValueLength ||
      (it.value == nullptr && it.len > 0)) {
    MCXL_LOG(kWarn, "disk_tier", "append: bad key length %zu or value length %llu", it.key.size(),
             (unsigned long long)it.len);
    return ErrorCode::INVALID_PARAMS;
  }
  auto k = t.keys.find(std::string(it.key));
  if (k != t.keys.end()) {
    const KeyState& st = k->second;
    if ((st.live.segment_id != 0 && it.generation < st.live.generation) ||
        (st.tombs > 0 && it.generation <= st.tomb_gen)) {
      MCXL_LOG(kWarn, "disk_tier", "append: generation %llu is stale for its key",
               (unsigned long long)it.generation);
      return ErrorCode::INVALID_VERSION;
    }
  }
  return ErrorCode::OK;
}
constexpr uint64_t kBatchItemMax = 1ull << 20;  // larger records: one write each anyway
}  // namespace

std::vector<Result<RecordLocation>> DiskTier::AppendBatch(const std::vector<BatchItem>& items) {
  Impl& t = *impl_;
  std::vector<Result<RecordLocation>> out(items.size(), Result<RecordLocation>(ErrorCode::INTERNAL_ERROR));
  std::vector<size_t> single;  // indexes written one by one (after the batches)
  {
    std::lock_guard<std::mutex> wlock(t.wmu);
    uint8_t* buf = ThreadBuffer(1, kChunkBytes);
    std::unordered_set<std::string_view> seen;
    std::vector<size_t> group;
    uint64_t group_bytes = 0;
    bool group_new_seg = false;  // the group starts a new segment (Reserve rolls)
    // Would Reserve(group_bytes + extra) not roll (Reserve's rule), the group
    // starting where it will start?
    auto fits = [&](uint64_t extra) {
      uint64_t end = 0;
      if (group_new_seg) end = kBlockSize;
      else if (t.active_id != 0 && t.active_fd >= 0) end = t.segs[t.active_id].end;
      else return false;
      return end + group_bytes + extra <= t.opt.segment_bytes || end + group_bytes <= kBlockSize;
    };
    // Writes `group` as one pwrite at a freshly reserved offset.
    auto flush = [&]() {
      if (group.empty()) return;
      uint32_t seg = 0;
      uint64_t off = 0;
      Status s = buf == nullptr ? Status(ErrorCode::INTERNAL_ERROR) : t.Reserve(group_bytes, false, &seg, &off);
      if (!s.ok()) {  // e.g. the capacity holds some but not all: one by one decides
        single.insert(single.end(), group.begin(), group.end());
        group.clear();
        group_bytes = 0;
        group_new_seg = false;
        return;
      }
      std::vector<std::pair<RecordLocation, uint64_t>> locs;  // (location, seq)
      uint64_t rel = 0;
      for (size_t i : group) {
        const BatchItem& it = items[i];
        const uint64_t rb = RecordBytes(it.key.size(), it.len);
        uint32_t crc = 0;
        FillImage(buf + rel, 0, rb, it.key, static_cast<const uint8_t*>(it.value), it.len, &crc);
        RecordHeader h = NewRecordHeader(kKindValue, it.key, seg, off + rel, it.len, it.generation,
                                         t.next_seq++);
        h.value_crc = crc;
        SealRecordHeader(&h);
        memcpy(buf + rel, &h, sizeof(h));
        locs.push_back({RecordLocation{seg, 0, off + rel, it.len, crc, uint32_t(it.key.size()), it.generation}, h.seq});
        rel += rb;
      }
      int e = PwriteFull(t.active_fd, buf, group_bytes, off);
      if (e == 0 && t.opt.sync_each_append && fdatasync(t.active_fd) != 0) e = errno;
      if (e != 0) {
        MCXL_LOG(kError, "disk_tier", "batch of %zu records to segment %u at %llu: %s", group.size(), seg,
                 (unsigned long long)off, strerror(e));
        t.Unreserve(seg, off, group_bytes);
        for (size_t i : group) out[i] = WriteErrorCode(e);
      } else {
        std::lock_guard<std::mutex> lock(t.mu);
        for (size_t j = 0; j < group.size(); ++j) {
          CommitValue(t, items[group[j]].key, locs[j].first, locs[j].second);
          out[group[j]] = locs[j].first;
        }
      }
      group.clear();
      group_bytes = 0;
      group_new_seg = false;
    };
    for (size_t i = 0; i < items.size(); ++i) {
      const BatchItem& it = items[i];
      ErrorCode c = CheckAppend(t, it);
      if (c != ErrorCode::OK) {
        out[i] = c;
        continue;
      }
      const uint64_t rb = RecordBytes(it.key.size(), it.len);
      if (it.len > kBatchItemMax || !seen.insert(it.key).second) {
        single.push_back(i);  // a repeated key is checked against the first one's result
        continue;
      }
      if (!group.empty() && (group_bytes + rb > kChunkBytes || !fits(rb))) flush();
      if (group.empty()) group_new_seg = !fits(rb);  // Reserve will roll for this group
      group.push_back(i);
      group_bytes += rb;
    }
    flush();
  }
  std::sort(single.begin(), single.end());
  for (size_t i : single) out[i] = Append(items[i].key, items[i].value, items[i].len, items[i].generation);
  return out;
}

Status DiskTier::Remove(std::string_view key, uint64_t generation) {
  Impl& t = *impl_;
  if (key.empty() || key.size() > kMaxTierKeyLength) return ErrorCode::INVALID_PARAMS;
  std::lock_guard<std::mutex> wlock(t.wmu);
  auto it = t.keys.find(std::string(key));
  if (it == t.keys.end() || it->second.live.segment_id == 0 ||
      it->second.live.generation > generation)
    return ErrorCode::OK;  // nothing live that this tombstone would hide
  const uint64_t bytes = RecordBytes(key.size(), 0);
  uint32_t seg = 0;
  uint64_t off = 0;
  // A full filesystem: the reserve file gives way once so removes still work.
  for (int attempt = 0;; attempt++) {
  auto retry = [&](ErrorCode code) {
    return code == ErrorCode::NO_AVAILABLE_HANDLE && attempt == 0 && t.ReleaseReserve();
  };
  // A tombstone frees space (its record turns dead): it may use the capacity headroom.
  Status s = t.Reserve(bytes, true, &seg, &off);
  if (!s.ok() && retry(s.error())) continue;
  if (!s.ok()) return s;
  RecordHeader h = NewRecordHeader(kKindTombstone, key, seg, off, 0, generation, t.next_seq++);
  h.value_crc = Crc32c(nullptr, 0);
  SealRecordHeader(&h);
  uint8_t* stage = ThreadBuffer(1, kChunkBytes);
  uint8_t* blk0 = ThreadBuffer(2, kBlockSize);
  if (stage == nullptr || blk0 == nullptr) {  // as in Append
    t.Unreserve(seg, off, bytes);
    return ErrorCode::INTERNAL_ERROR;
  }
  ImageWriter w{t.active_fd, off, bytes, blk0};
  uint32_t crc = 0;
  for (uint64_t pos = 0; pos < bytes && w.err == 0; pos += kChunkBytes) {
    uint64_t n = std::min(kChunkBytes, bytes - pos);
    FillImage(stage, pos, n, key, nullptr, 0, &crc);
    w.Put(pos, stage, n);
  }
  int e = w.Finish(h);
  if (e == 0 && t.opt.sync_each_append && fdatasync(t.active_fd) != 0) e = errno;
  if (e != 0) {
    MCXL_LOG(kError, "disk_tier", "tombstone to segment %u at %llu: %s", seg,
             (unsigned long long)off, strerror(e));
    t.Unreserve(seg, off, bytes);
    if (retry(WriteErrorCode(e))) continue;
    return WriteErrorCode(e);
  }
  break;
  }
  std::lock_guard<std::mutex> lock(t.mu);
  CommitTombstone(t, it->second, seg, off, bytes, generation);
  return ErrorCode::OK;
}

std::vector<Status> DiskTier::RemoveBatch(const std::vector<std::pair<std::string_view, uint64_t>>& items) {
  Impl& t = *impl_;
  std::vector<Status> out(items.size(), Status(ErrorCode::OK));
  std::vector<size_t> single;  // written one by one (Remove) after the packed writes
  {
    std::lock_guard<std::mutex> wlock(t.wmu);
    uint8_t* buf = ThreadBuffer(1, kChunkBytes);
    std::unordered_set<std::string_view> seen;
    std::vector<size_t> group;
    uint64_t group_bytes = 0;
    // One pwrite for the group at a fresh place (tombstones may use the
    // capacity headroom, as in Remove); any failure: Remove one by one decides.
    auto flush = [&]() {
      if (group.empty()) return;
      uint32_t seg = 0;
      uint64_t off = 0;
      Status s = buf == nullptr ? Status(ErrorCode::INTERNAL_ERROR) : t.Reserve(group_bytes, true, &seg, &off);
      int e = 0;
      if (s.ok()) {
        uint64_t rel = 0;
        for (size_t i : group) {
          std::string_view key = items[i].first;
          const uint64_t rb = RecordBytes(key.size(), 0);
          uint32_t crc = 0;
          FillImage(buf + rel, 0, rb, key, nullptr, 0, &crc);
          RecordHeader h = NewRecordHeader(kKindTombstone, key, seg, off + rel, 0, items[i].second, t.next_seq++);
          h.value_crc = Crc32c(nullptr, 0);
          SealRecordHeader(&h);
          memcpy(buf + rel, &h, sizeof(h));
          rel += rb;
        }
        e = PwriteFull(t.active_fd, buf, group_bytes, off);
        if (e == 0 && t.opt.sync_each_append && fdatasync(t.active_fd) != 0) e = errno;
        if (e != 0) {
          MCXL_LOG(kError, "disk_tier", "batch of %zu tombstones to segment %u at %llu: %s", group.size(), seg,
                   (unsigned long long)off, strerror(e));
          t.Unreserve(seg, off, group_bytes);
        }
      }
      if (!s.ok() || e != 0) {
        single.insert(single.end(), group.begin(), group.end());
      } else {
        std::lock_guard<std::mutex> lock(t.mu);
        uint64_t rel = 0;
        for (size_t i : group) {
          const uint64_t rb = RecordBytes(items[i].first.size(), 0);
          auto it = t.keys.find(std::string(items[i].first));
          if (it != t.keys.end()) CommitTombstone(t, it->second, seg, off + rel, rb, items[i].second);
          rel += rb;
        }
      }
      group.clear();
      group_bytes = 0;
    };
    for (size_t i = 0; i < items.size(); ++i) {
      std::string_view key = items[i].first;
      if (key.empty() || key.size() > kMaxTierKeyLength) {
        out[i] = ErrorCode::INVALID_PARAMS;
        continue;
      }
      if (!seen.insert(key).second) {  // a repeated key: after the first one's write
        single.push_back(i);
        continue;
      }
      auto it = t.keys.find(std::string(key));
      if (it == t.keys.end() || it->second.live.segment_id == 0 || it->second.live.generation > items[i].second)
        continue;  // nothing live that it would hide (as Remove)
      const uint64_t rb = RecordBytes(key.size(), 0);
      if (!group.empty() && group_bytes + rb > kChunkBytes) flush();
      group.push_back(i);
      group_bytes += rb;
    }
    flush();
  }
  std::sort(single.begin(), single.end());
  for (size_t i : single) out[i] = Remove(items[i].first, items[i].second);
  return out;
}

void DiskTier::ForEachLive(
    const std::function<void(std::string_view key, const RecordLocation&)>& fn) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [key, st] : impl_->keys)
    if (st.live.segment_id != 0) fn(key, st.live);
}

Result<RecordLocation> DiskTier::Lookup(std::string_view key) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->keys.find(std::string(key));
  if (it == impl_->keys.end() || it->second.live.segment_id == 0) return ErrorCode::OBJECT_NOT_FOUND;
  return it->second.live;
}

uint64_t DiskTier::MaxGeneration() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->max_gen;
}

void DiskTier::SetRelocationCallback(RelocationCallback cb) {
  std::lock_guard<std::mutex> lock(impl_->cmu);
  impl_->reloc_cb = std::move(cb);
}

void DiskTier::SetTestHook(std::function<void(const char* point)> hook) {
  std::lock_guard<std::mutex> c(impl_->cmu);
  std::lock_guard<std::mutex> w(impl_->wmu);
  impl_->hook = std::move(hook);
}

const std::string& DiskTier::root_dir() const { return impl_->opt.root_dir; }

Stats DiskTier::stats() const {
  const Impl& t = *impl_;
  Stats s;
  ReaderCounters rc = GetReaderCounters();
  std::lock_guard<std::mutex> lock(t.mu);
  s.capacity = t.opt.capacity_bytes;
  s.used_bytes = t.used;
  for (const auto& [id, seg] : t.segs) s.live_bytes += seg.live;
  s.objects = t.objects;
  s.segments = t.segs.size();
  s.appends = t.appends;
  s.reads = rc.reads;
  s.checksum_failures = rc.checksum_failures;
  s.compactions = t.compactions;
  s.relocations = t.relocations;
  s.direct_io = t.active_id != 0 ? t.active_direct : false;
  return s;
}

}  // namespace mcxl::tier
