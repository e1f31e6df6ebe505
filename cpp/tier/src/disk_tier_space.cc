// SSD tier space: the segment files records are placed in (the active one
// and its rolling), their accounting (bytes in use, live bytes per segment,
// the bytes a key's tombstone keeps live), and the reserve file that keeps
// filesystem room for tombstones and compaction. Format and policy: disk_tier.h.
#include <errno.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {

ErrorCode WriteErrorCode(int err) {
  return (err == ENOSPC || err == EDQUOT) ? ErrorCode::NO_AVAILABLE_HANDLE : ErrorCode::WRITE_FAIL;
}

DiskTier::Impl::~Impl() {
  if (active_fd >= 0) {
    fdatasync(active_fd);
    close(active_fd);
  }
  if (cc.fd >= 0) close(cc.fd);
  if (lock_fd >= 0) close(lock_fd);  // releases the directory's lock
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
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, mode_t(opt.file_mode));
  if (fd < 0) return;
  SetFileMode(fd, opt.file_mode, opt.group);
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
  int fd = OpenMaybeDirect(path, O_RDWR | O_CREAT | O_EXCL, opt.direct_io, &direct, opt.file_mode);
  if (fd < 0) {
    int e = errno;
    WriteFailed(e, "create segment", id, 0);
    return WriteErrorCode(e);
  }
  if (int e = SetFileMode(fd, opt.file_mode, opt.group); e != 0) {
    MCXL_LOG(kError, "disk_tier", "set mode %04o of %s: %s", opt.file_mode, path.c_str(), strerror(e));
    close(fd);
    unlink(path.c_str());
    return ErrorCode::WRITE_FAIL;
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
    if (fd >= 0) close(fd);
    unlink(path.c_str());
    WriteFailed(e, "initialize segment", id, 0);
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
  uint64_t cap = 0, avail = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    cap = cap_eff;
    avail = fs_avail;
  }
  if (!compaction && used + cost > cap) {
    if (!logged_full)
      MCXL_LOG(kWarn, "disk_tier", "tier full: %llu of %llu bytes used (%llu configured, the filesystem "
               "has %llu free), a record needs %llu", (unsigned long long)used, (unsigned long long)cap,
               (unsigned long long)opt.capacity_bytes, (unsigned long long)avail, (unsigned long long)cost);
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

void DiskTier::Impl::RefreshSpace() {  // under wmu (reserve_held)
  struct statvfs sv;
  const bool got = statvfs(opt.root_dir.c_str(), &sv) == 0;
  std::lock_guard<std::mutex> lock(mu);
  if (!got) {
    cap_eff = opt.capacity_bytes;
    return;
  }
  fs_avail = uint64_t(sv.f_bavail) * sv.f_frsize;
  // Headroom: 1/64 of the filesystem (other files, metadata) and half a
  // segment (the most one compaction copies before it deletes its victim).
  const uint64_t fs_bytes = uint64_t(sv.f_blocks) * sv.f_frsize;
  const uint64_t slack = fs_bytes / 64 + opt.segment_bytes / 2;
  // A reserve given up on ENOSPC is still set aside: it is for removes and
  // compaction, and returns after the next compaction.
  const uint64_t keep = slack + (reserve_held ? 0 : reserve_bytes);
  const uint64_t room = used + fs_avail > keep ? used + fs_avail - keep : 0;
  cap_eff = std::min(opt.capacity_bytes, room);
  fs_full = fs_avail < fs_bytes / 128;  // the tier itself stops above this: another writer took it
}

void DiskTier::Impl::SealActive() {
  if (active_fd < 0 || active_id == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (segs[active_id].end <= kBlockSize) return;  // nothing in it to compact
  }
  if (fdatasync(active_fd) != 0)
    MCXL_LOG(kError, "disk_tier", "fdatasync of segment %u: %s", active_id, strerror(errno));
  close(active_fd);
  active_fd = -1;
  std::lock_guard<std::mutex> lock(mu);
  active_id = 0;
}

void DiskTier::Impl::WriteFailed(int e, const char* what, uint32_t seg, uint64_t off) {
  const bool full = e == ENOSPC || e == EDQUOT;
  {
    std::lock_guard<std::mutex> lock(mu);
    write_errors++;
    if (full) enospc++;
  }
  uint64_t suppressed = 0;
  if (write_log.Allow(&suppressed))
    MCXL_LOG(kError, "disk_tier", "%s to segment %u at %llu: %s (%llu more failed writes in the last second not "
             "logged)", what, seg, (unsigned long long)off, strerror(e), (unsigned long long)suppressed);
  if (!full) return;
  RefreshSpace();  // appends now stop at what the filesystem has
  SealActive();    // so that compaction may take the segment
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

}  // namespace mcxl::tier
