// SSD tier rebuild: DiskTier::Open scans every segment file of the root
// directory and rebuilds the key index from the records it finds (torn and
// corrupt blocks skipped; a key's newest value wins unless a tombstone of
// that generation or newer hides it). Format and policy: disk_tier.h.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <unordered_map>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {
namespace {

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

}  // namespace mcxl::tier
