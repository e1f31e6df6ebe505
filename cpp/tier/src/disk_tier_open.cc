// SSD tier rebuild: DiskTier::Open scans every segment file of the root
// directory and rebuilds the key index from the records it finds (torn and
// corrupt blocks skipped; a key's newest value wins unless a tombstone of
// that generation or newer hides it). Format and policy: disk_tier.h.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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

bool AllZero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// Scans one segment's records. visit(h, key, off) for each valid record.
// Blocks that are not valid headers count as garbage; a header found after such
// a gap must pass its value crc too. damaged(off): a block where a header must
// be is neither a record, nor zeros (a header not written yet), nor a readable
// value header (a torn or damaged value): it may have been a tombstone.
// INTERNAL_ERROR when no buffer could be allocated (nothing visited: a
// segment half scanned could miss a tombstone).
template <typename Visit, typename Damaged>
Status ScanSegment(int fd, uint32_t id, uint64_t size, const std::string& path, Visit visit, Damaged damaged) {
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
      if (!resync) {
        MCXL_LOG(kWarn, "disk_tier", "%s offset %llu: skipping (%s)", path.c_str(), (unsigned long long)off, bad);
        const bool sealed = h.magic == kRecordMagic && h.header_crc == Crc32c(&h, offsetof(RecordHeader, header_crc));
        const bool torn = sealed && (h.kind == kKindValue || strcmp(bad, "extends past end of file") == 0);
        if (!torn && !AllZero(blk.get(), got)) damaged(off);
      }
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

// The tier directory: created with the files' mode plus x bits, exactly,
// in their group; an existing one other users may enter or list is refused.
Status OpenRootDir(const Options& o) {
  std::error_code ec;
  const bool created = std::filesystem::create_directories(o.root_dir, ec);
  if (ec) {
    MCXL_LOG(kError, "disk_tier", "create %s: %s", o.root_dir.c_str(), ec.message().c_str());
    return ErrorCode::FILE_OPEN_FAIL;
  }
  const mode_t dmode = mode_t(o.file_mode | ((o.file_mode & 0444) >> 2));
  if (created && ((o.group >= 0 && chown(o.root_dir.c_str(), uid_t(-1), gid_t(o.group)) != 0) ||
                  chmod(o.root_dir.c_str(), dmode) != 0)) {
    MCXL_LOG(kError, "disk_tier", "set mode %04o of %s: %s", unsigned(dmode), o.root_dir.c_str(), strerror(errno));
    return ErrorCode::FILE_OPEN_FAIL;
  }
  struct stat st;
  if (stat(o.root_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    MCXL_LOG(kError, "disk_tier", "%s is not a directory", o.root_dir.c_str());
    return ErrorCode::FILE_OPEN_FAIL;
  }
  if ((st.st_mode & S_IRWXO) != 0 && !o.allow_world_readable) {
    MCXL_LOG(kError, "disk_tier", "refusing the SSD tier directory %s: mode %04o lets every local user reach the "
             "stored values; chmod o-rwx it (or pass --allow_world_readable_pool)", o.root_dir.c_str(),
             unsigned(st.st_mode & 07777));
    return ErrorCode::INVALID_PARAMS;
  }
  return ErrorCode::OK;
}

// The exclusive lock of the directory (lock.mcxl, flock): one master per
// tier, else both would append to and compact the same segments. -1 when
// another holds it (named in the log line) or the file cannot be made.
int LockRootDir(const Options& o) {
  const std::string path = o.root_dir + "/lock.mcxl";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode_t(o.file_mode));
  if (fd < 0) {
    MCXL_LOG(kError, "disk_tier", "open %s: %s", path.c_str(), strerror(errno));
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char holder[200] = {};
    uint64_t got = 0;
    PreadUpTo(fd, holder, sizeof(holder) - 1, 0, &got);
    for (uint64_t i = 0; i < got; ++i)  // what another process wrote: printable only
      if (holder[i] < 0x20 || holder[i] > 0x7e) holder[i] = i + 1 == got ? '\0' : '?';
    if (e == EWOULDBLOCK)
      MCXL_LOG(kError, "disk_tier", "SSD tier directory %s is in use by another master (%s); refusing to share it",
               o.root_dir.c_str(), got ? holder : "holder unknown");
    else
      MCXL_LOG(kError, "disk_tier", "lock %s: %s", path.c_str(), strerror(e));
    close(fd);
    return -1;
  }
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  char text[256];
  int n = snprintf(text, sizeof(text), "pid %d on %s, pool %s\n", int(getpid()), host,
                   o.owner.empty() ? "-" : o.owner.c_str());
  // The mode and group every tier file gets: failing here (a group this
  // user may not give files to) beats failing at the first segment.
  if (int e = SetFileMode(fd, o.file_mode, o.group); e != 0) {
    MCXL_LOG(kError, "disk_tier", "%s: cannot set mode %04o and group %lld: %s", path.c_str(), o.file_mode,
             (long long)o.group, strerror(e));
    close(fd);
    return -1;
  }
  if (ftruncate(fd, 0) != 0 || PwriteFull(fd, text, uint64_t(std::clamp(n, 0, int(sizeof(text)) - 1)), 0) != 0)
    MCXL_LOG(kWarn, "disk_tier", "%s: cannot record the holder: %s", path.c_str(), strerror(errno));
  return fd;
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
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->opt.segment_bytes = AlignUp(options.segment_bytes);
  Impl& t = *impl;
  if (Status s = OpenRootDir(options); !s.ok()) return s.error();
  t.lock_fd = LockRootDir(options);
  if (t.lock_fd < 0) return ErrorCode::FILE_OPEN_FAIL;
  // Several segments even on a small filesystem: only sealed segments are
  // compacted, so a segment as large as the filesystem could never be reclaimed.
  struct statvfs sv;
  if (statvfs(options.root_dir.c_str(), &sv) == 0) {
    const uint64_t fs_bytes = uint64_t(sv.f_blocks) * sv.f_frsize;
    const uint64_t cap = std::max<uint64_t>(1ull << 20, AlignUp(fs_bytes / 8));
    if (t.opt.segment_bytes > cap) t.opt.segment_bytes = cap;
  }

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
  // Damaged blocks (possibly tombstones): every value record appended before
  // one is dropped. Fresh appends are in seq order along (segment, offset),
  // so the first fresh record after a damaged block bounds its seq.
  uint64_t cutoff = 0, damaged = 0;
  bool damage_open = false;
  auto on_damage = [&](const std::string& path, uint64_t off) {
    MCXL_LOG(kError, "disk_tier", "%s offset %llu: a damaged block where a record header must be (it may have "
             "been a tombstone): the records written before it will be dropped", path.c_str(), (unsigned long long)off);
    damaged++;
    damage_open = true;
  };
  for (uint32_t id : ids) {
    const std::string path = SegmentPath(options.root_dir, id);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      MCXL_LOG(kError, "disk_tier", "open %s: %s (skipped)", path.c_str(), strerror(errno));
      on_damage(path, 0);
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
      // A segment created but not initialized is empty or zeros; else its
      // records (tombstones among them) are unknown.
      uint8_t b0[sizeof(SegmentHeader)] = {};
      memcpy(b0, &sh, std::min<uint64_t>(got, sizeof(b0)));
      if (!AllZero(b0, sizeof(b0))) on_damage(path, 0);
      close(fd);
      continue;
    }
    if ((st.st_mode & 07777) != options.file_mode && SetFileMode(fd, options.file_mode, options.group) != 0)
      MCXL_LOG(kWarn, "disk_tier", "%s: mode %04o, cannot set %04o: %s", path.c_str(), unsigned(st.st_mode & 07777),
               options.file_mode, strerror(errno));
    const uint64_t size = uint64_t(st.st_size);
    t.segs[id] = SegmentState{AlignUp(size), 0};
    t.used += AlignUp(size);
    bool any = false;
    Status scanned = ScanSegment(fd, id, size, path, [&](const RecordHeader& h, std::string_view key, uint64_t off) {
      any = true;
      if (damage_open && (h.reserved & kRecordCopy) == 0) {
        cutoff = std::max(cutoff, h.seq);
        damage_open = false;
      }
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
    }, [&](uint64_t off) { on_damage(path, off); });
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // the scan must not keep the tier cached
    close(fd);
    // A segment left out could hold a tombstone: better no tier than one
    // that brings removed keys back.
    if (!scanned.ok()) return scanned.error();
    if (!any && id == ids.back() && size <= kBlockSize) reuse_id = id;
  }
  if (damage_open) cutoff = ~0ull;  // nothing fresh after the last damaged block: all may be hidden
  std::vector<std::pair<std::string, uint64_t>> drop;  // (key, generation): tombstoned below
  for (auto it = t.keys.begin(); it != t.keys.end();) {
    KeyState& ks = it->second;
    uint32_t values = value_count[it->first];
    if (ks.live.segment_id != 0 && ks.tombs > 0 && ks.live.generation <= ks.tomb_gen)
      ks.live = RecordLocation{};
    if (ks.live.segment_id != 0 && ks.live_seq < cutoff) drop.emplace_back(it->first, ks.live.generation);
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
  t.RefreshSpace();
  std::unique_ptr<DiskTier> tier(new DiskTier(std::move(impl)));
  if (!drop.empty()) tier->DropDamaged(drop, damaged);
  MCXL_LOG(kInfo, "disk_tier", "opened %s: %zu segments, %llu objects, %llu bytes used",
           options.root_dir.c_str(), t.segs.size(), (unsigned long long)t.objects,
           (unsigned long long)t.used);
  return tier;
}

void DiskTier::DropDamaged(const std::vector<std::pair<std::string, uint64_t>>& drop, uint64_t blocks) {
  Impl& t = *impl_;
  // Tombstones make the drop durable: compaction may delete the damaged
  // block's segment, and the dropped records must not come back then.
  std::vector<std::pair<std::string_view, uint64_t>> items(drop.begin(), drop.end());
  std::vector<Status> st = RemoveBatch(items);
  uint64_t unwritten = 0;
  std::lock_guard<std::mutex> lock(t.mu);
  for (size_t i = 0; i < drop.size(); ++i) {
    if (st[i].ok()) continue;
    unwritten++;  // dropped from the index only (a later rebuild drops it again: the block is still there)
    auto it = t.keys.find(drop[i].first);
    if (it == t.keys.end() || it->second.live.segment_id == 0) continue;
    KeyState& ks = it->second;
    t.AddLive(ks.live.segment_id, -int64_t(RecordBytes(ks.live.key_len, ks.live.value_len)));
    ks.live = RecordLocation{};
    ks.dead_values++;
    t.objects--;
  }
  t.damage_dropped = drop.size();
  MCXL_LOG(kError, "disk_tier", "%s: %llu damaged blocks: dropped %llu records written before them (%llu without a "
           "tombstone: %s)", t.opt.root_dir.c_str(), (unsigned long long)blocks, (unsigned long long)drop.size(),
           (unsigned long long)unwritten, unwritten ? "no room" : "none");
}

}  // namespace mcxl::tier
