// SSD tier reader: ReadRecord (cached read-only fds) and the verified
// streaming read shared with compaction.
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {
namespace {

// Relaxed: statistics only, no ordering with the data they count.
std::atomic<uint64_t> g_reads{0}, g_bytes{0}, g_csum{0}, g_errors{0}, g_direct{0};

struct CachedFd {
  int fd = -1;
  bool direct = false;
  ~CachedFd() {
    if (fd >= 0) close(fd);
  }
};
constexpr size_t kMaxCachedFds = 256;
std::mutex g_fd_mu;
std::unordered_map<std::string, std::shared_ptr<CachedFd>>* g_fds =
    new std::unordered_map<std::string, std::shared_ptr<CachedFd>>();  // leaked: outlives statics

uint64_t g_swept_ns = 0;  // under g_fd_mu

// Closes the cached fds of segments compaction deleted: an open fd keeps a
// deleted file's space, which a small or full filesystem needs back. Under
// g_fd_mu; on a cache miss (a new segment: compaction ran) or once a second.
void SweepDeleted() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  g_swept_ns = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  for (auto it = g_fds->begin(); it != g_fds->end();) {
    struct stat st;
    if (fstat(it->second->fd, &st) != 0 || st.st_nlink == 0) it = g_fds->erase(it);
    else ++it;
  }
}

std::shared_ptr<CachedFd> GetFd(const std::string& path, bool fresh, int* err) {
  std::lock_guard<std::mutex> lock(g_fd_mu);
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const uint64_t now_ns = uint64_t(now.tv_sec) * 1000000000ull + uint64_t(now.tv_nsec);
  auto it = g_fds->find(path);
  if (it == g_fds->end() || now_ns - g_swept_ns > 1000000000ull) {
    SweepDeleted();
    it = g_fds->find(path);
  }
  if (it != g_fds->end() && !fresh) return it->second;
  if (it != g_fds->end()) g_fds->erase(it);
  auto c = std::make_shared<CachedFd>();
  c->fd = OpenMaybeDirect(path, O_RDONLY, true, &c->direct);
  if (c->fd < 0) {
    *err = errno;
    return nullptr;
  }
  if (g_fds->size() >= kMaxCachedFds) g_fds->erase(g_fds->begin());
  (*g_fds)[path] = c;
  return c;
}

void DropFd(const std::string& path, const std::shared_ptr<CachedFd>& c) {
  std::lock_guard<std::mutex> lock(g_fd_mu);
  auto it = g_fds->find(path);
  if (it != g_fds->end() && it->second == c) g_fds->erase(it);
}

// Streams [begin, end) of the record image (record-relative positions) from
// `data` at record position pos: compares key bytes, copies + crcs value bytes.
struct Verifier {
  std::string_view key;
  uint64_t key_begin = kHeaderBytes, value_begin = 0, value_end = 0;
  uint8_t* dst = nullptr;
  uint32_t key_crc = 0, value_crc = 0;
  bool key_equal = true;
  void Feed(uint64_t pos, const uint8_t* data, uint64_t n) {
    uint64_t end = pos + n;
    // key part
    uint64_t a = std::max(pos, key_begin), b = std::min(end, value_begin);
    if (a < b) {
      key_crc = Crc32c(data + (a - pos), b - a, key_crc);
      if (key_equal && memcmp(data + (a - pos), key.data() + (a - key_begin), b - a) != 0)
        key_equal = false;
    }
    a = std::max(pos, value_begin);
    b = std::min(end, value_end);
    if (a < b) {
      value_crc = Crc32c(data + (a - pos), b - a, value_crc);
      if (dst != nullptr) memcpy(dst + (a - value_begin), data + (a - pos), b - a);
    }
  }
};

// io_uring reads (liburing): a large O_DIRECT record is read as kUringChunk
// pieces, kUringDepth in flight, verified and copied in order as they land, so
// the device sees a queue instead of one request at a time (measured: the
// bench in the report). MCXL_TIER_IO_URING=0 turns it off.
constexpr uint64_t kUringChunk = 1ull << 20;
constexpr unsigned kUringDepth = 8;
constexpr uint64_t kUringMinRecord = 2 * kUringChunk;
static_assert(kUringChunk <= kChunkBytes, "ReadVerified reads its first chunk into the kChunkBytes buffer");

struct ThreadRing {
  io_uring ring;
  bool ok = false;
  ThreadRing() {
    const char* env = getenv("MCXL_TIER_IO_URING");
    if (env != nullptr && strcmp(env, "0") == 0) return;
    int rc = io_uring_queue_init(kUringDepth, &ring, 0);
    ok = rc == 0;
    static std::atomic<bool> logged{false};  // relaxed: only gates one log line
    if (!ok && !logged.exchange(true, std::memory_order_relaxed))
      MCXL_LOG(kInfo, "disk_tier", "io_uring unavailable (%s); reads use pread", strerror(-rc));
  }
  ~ThreadRing() {
    if (ok) io_uring_queue_exit(&ring);
  }
};

io_uring* GetThreadRing() {
  thread_local ThreadRing r;
  return r.ok ? &r.ring : nullptr;
}

std::atomic<uint64_t> g_uring_reads{0};

}  // namespace

void CloseDeletedReaderFds() {
  std::lock_guard<std::mutex> lock(g_fd_mu);
  if (!g_fds->empty()) SweepDeleted();
}

ReaderCounters GetReaderCounters() {
  ReaderCounters c;
  c.reads = g_reads.load(std::memory_order_relaxed);
  c.bytes = g_bytes.load(std::memory_order_relaxed);
  c.checksum_failures = g_csum.load(std::memory_order_relaxed);
  c.errors = g_errors.load(std::memory_order_relaxed);
  c.direct_reads = g_direct.load(std::memory_order_relaxed);
  c.uring_reads = g_uring_reads.load(std::memory_order_relaxed);
  return c;
}

void CountChecksumFailure() { g_csum.fetch_add(1, std::memory_order_relaxed); }

void ForgetReaderFd(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_fd_mu);
  g_fds->erase(path);
}

namespace {

// Record bytes [pos, total) of the record at `offset` through the ring, fed to
// v in order. Every submitted read is reaped before returning (the buffers
// are the thread's).
Status PipelinedRead(io_uring* ring, int fd, uint64_t offset, uint64_t pos, uint64_t total,
                     uint64_t data_end, Verifier* v, const char** why) {
  uint8_t* win = ThreadBuffer(3, kUringChunk * kUringDepth);
  if (win == nullptr) return ErrorCode::INTERNAL_ERROR;
  const uint64_t pieces = (total - pos + kUringChunk - 1) / kUringChunk;
  int32_t res[kUringDepth];
  bool done[kUringDepth] = {};
  uint64_t submitted = 0, reaped = 0, processed = 0;
  auto piece_len = [&](uint64_t i) { return std::min(kUringChunk, total - pos - i * kUringChunk); };
  auto reap_one = [&]() -> bool {
    io_uring_cqe* cqe = nullptr;
    int rc;
    do rc = io_uring_wait_cqe(ring, &cqe); while (rc == -EINTR);
    if (rc < 0) return false;
    const uint64_t i = io_uring_cqe_get_data64(cqe);
    res[i % kUringDepth] = cqe->res;
    done[i % kUringDepth] = true;
    io_uring_cqe_seen(ring, cqe);
    reaped++;
    return true;
  };
  auto fail = [&](ErrorCode code, const char* what) -> Status {
    *why = what;
    while (reaped < submitted && reap_one()) {
    }
    return code;
  };
  while (processed < pieces) {
    while (submitted < pieces && submitted - processed < kUringDepth) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      const uint64_t i = submitted++;
      io_uring_prep_read(sqe, fd, win + (i % kUringDepth) * kUringChunk, unsigned(piece_len(i)),
                         offset + pos + i * kUringChunk);
      io_uring_sqe_set_data64(sqe, i);
    }
    int rc = io_uring_submit(ring);
    if (rc < 0) return fail(ErrorCode::INVALID_READ, strerror(-rc));
    const unsigned slot = unsigned(processed % kUringDepth);
    while (!done[slot])
      if (!reap_one()) return fail(ErrorCode::INVALID_READ, "io_uring wait");
    done[slot] = false;
    const uint64_t at = pos + processed * kUringChunk, n = piece_len(processed);
    uint8_t* data = win + uint64_t(slot) * kUringChunk;
    const int32_t r = res[slot];
    if (r < 0) return fail(ErrorCode::INVALID_READ, strerror(-r));
    uint64_t got = uint64_t(r);
    if (got < n) {  // short (end of file or a partial read): finish synchronously
      uint64_t more = 0;
      if (PreadUpTo(fd, data + got, AlignUp(n) - got, offset + at + got, &more) == 0) got += more;
    }
    const uint64_t need = data_end > at ? std::min(n, data_end - at) : 0;
    if (got < need) return fail(ErrorCode::CHECKSUM_MISMATCH, "short file");
    if (got < n) memset(data + got, 0, n - got);
    v->Feed(at, data, n);
    processed++;
  }
  return ErrorCode::OK;
}

}  // namespace

Status ReadVerified(int fd, bool aligned, uint32_t segment_id, uint64_t offset, uint64_t file_size,
                    std::string_view key, const RecordLocation* expect, void* dst, RawSink* raw,
                    RecordHeader* hdr_out, const char** why) {
  *why = "";
  if (offset % kBlockSize != 0 || offset < kBlockSize || offset >= file_size) {
    *why = "offset outside the file";
    return ErrorCode::CHECKSUM_MISMATCH;
  }
  uint8_t* buf = ThreadBuffer(0, kChunkBytes);
  if (buf == nullptr) return ErrorCode::INTERNAL_ERROR;
  // Reads record bytes [pos, pos + n) into buf (n <= kChunkBytes); aligned
  // fds read whole blocks. Stops at end of file: *got says how many.
  auto read_at = [&](uint64_t pos, uint64_t n, uint64_t* got) -> int {
    return PreadUpTo(fd, buf, aligned ? AlignUp(n) : n, offset + pos, got);
  };
  io_uring* ring = nullptr;
  if (aligned && raw == nullptr && expect != nullptr &&
      RecordBytes(expect->key_len, expect->value_len) >= kUringMinRecord)
    ring = GetThreadRing();
  const uint64_t chunk = ring != nullptr ? kUringChunk : kChunkBytes;
  uint64_t first = std::min<uint64_t>(chunk, file_size - offset);
  if (expect != nullptr)
    first = std::min(first, RecordBytes(expect->key_len, expect->value_len));
  first = std::max<uint64_t>(first, kHeaderBytes);
  uint64_t got = 0;
  int e = read_at(0, first, &got);
  if (e != 0) {
    *why = strerror(e);
    return ErrorCode::INVALID_READ;
  }
  if (got < kHeaderBytes) {
    *why = "short file";
    return ErrorCode::CHECKSUM_MISMATCH;
  }
  RecordHeader h;
  memcpy(&h, buf, sizeof(h));
  if (const char* bad = CheckRecordHeader(h, segment_id, offset, file_size)) {
    *why = bad;
    return ErrorCode::CHECKSUM_MISMATCH;
  }
  if (hdr_out != nullptr) *hdr_out = h;
  if (h.kind != kKindValue && expect != nullptr) {
    *why = "not a value record";
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  if (expect != nullptr &&
      (h.key_len != expect->key_len || h.value_len != expect->value_len ||
       h.generation != expect->generation || h.value_crc != expect->crc32c)) {
    *why = "record names another length/generation/crc than the location";
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  if (h.key_len != key.size()) {
    *why = "key length differs";
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  const uint64_t total = RecordBytes(h.key_len, h.value_len);  // <= file_size - offset (checked)
  const uint64_t data_end = kHeaderBytes + h.key_len + h.value_len;  // the rest is padding
  // Bytes [pos, pos + n) read into buf with `got` from the file: the data part
  // must be there; missing padding (a cut file) reads as zeros.
  auto complete = [&](uint64_t pos, uint64_t n, uint64_t got) {
    uint64_t need = data_end > pos ? std::min(n, data_end - pos) : 0;
    if (got < need) return false;
    if (got < n) memset(buf + got, 0, n - got);
    return true;
  };
  if (!complete(0, std::min(total, chunk), got)) {
    *why = "short file";
    return ErrorCode::CHECKSUM_MISMATCH;
  }
  Verifier v;
  v.key = key;
  v.value_begin = kHeaderBytes + h.key_len;
  v.value_end = v.value_begin + h.value_len;
  v.dst = static_cast<uint8_t*>(dst);
  uint64_t pos = 0;
  uint64_t have = std::min(total, chunk);
  if (ring != nullptr && total > have) {
    v.Feed(0, buf, have);
    Status rs = PipelinedRead(ring, fd, offset, have, total, data_end, &v, why);
    if (!rs.ok()) return rs;
    g_uring_reads.fetch_add(1, std::memory_order_relaxed);
    pos = total;
  }
  while (pos < total) {
    v.Feed(pos, buf, have);
    if (raw != nullptr && !raw->Chunk(pos, buf, have)) {
      *why = "copy aborted";
      return ErrorCode::WRITE_FAIL;
    }
    pos += have;
    if (pos >= total) break;
    // One bounce path for both fd kinds: the copy is cheap next to the I/O.
    uint64_t n = std::min(kChunkBytes, total - pos);
    e = read_at(pos, n, &got);
    if (e != 0) {
      *why = strerror(e);
      return ErrorCode::INVALID_READ;
    }
    if (!complete(pos, n, got)) {
      *why = "short file";
      return ErrorCode::CHECKSUM_MISMATCH;
    }
    have = n;
  }
  if (v.key_crc != h.key_crc) {
    *why = "key crc";
    return ErrorCode::CHECKSUM_MISMATCH;
  }
  if (!v.key_equal) {
    *why = "record of another key";
    return ErrorCode::OBJECT_NOT_FOUND;
  }
  if (v.value_crc != h.value_crc) {
    *why = "value crc";
    return ErrorCode::CHECKSUM_MISMATCH;
  }
  return ErrorCode::OK;
}

Status ReadRecord(const std::string& root_dir, const RecordLocation& loc, std::string_view key,
                  void* dst, uint64_t dst_len) {
  g_reads.fetch_add(1, std::memory_order_relaxed);
  auto fail = [&](ErrorCode code, const char* what) -> Status {
    if (code == ErrorCode::CHECKSUM_MISMATCH) g_csum.fetch_add(1, std::memory_order_relaxed);
    else g_errors.fetch_add(1, std::memory_order_relaxed);
    MCXL_LOG(kWarn, "disk_tier", "read of segment %u offset %llu (key_len %u): %s: %s",
             loc.segment_id, (unsigned long long)loc.offset, loc.key_len, ErrorCodeName(code), what);
    return code;
  };
  if (loc.segment_id == 0 || loc.offset % kBlockSize != 0 || loc.key_len == 0 ||
      loc.key_len > kMaxTierKeyLength || loc.value_len > kMaxTierValueLength ||
      key.size() != loc.key_len)
    return fail(ErrorCode::INVALID_PARAMS, "location or key out of bounds");
  if (dst_len < loc.value_len || (dst == nullptr && loc.value_len > 0))
    return fail(ErrorCode::BUFFER_OVERFLOW, "destination smaller than the value");
  const std::string path = SegmentPath(root_dir, loc.segment_id);
  for (int attempt = 0;; attempt++) {
    int err = 0;
    auto c = GetFd(path, attempt > 0, &err);
    if (c == nullptr)
      return fail(err == ENOENT ? ErrorCode::FILE_NOT_FOUND : ErrorCode::FILE_OPEN_FAIL,
                  strerror(err));
    struct stat st;
    if (fstat(c->fd, &st) != 0) return fail(ErrorCode::INVALID_READ, strerror(errno));
    if (st.st_nlink == 0) {  // deleted by compaction: a cached fd must not pin the space
      DropFd(path, c);
      if (attempt == 0) continue;
      return fail(ErrorCode::FILE_NOT_FOUND, "segment deleted");
    }
    const char* why = "";
    Status s = ReadVerified(c->fd, c->direct, loc.segment_id, loc.offset, uint64_t(st.st_size), key,
                            &loc, dst, nullptr, nullptr, &why);
    if (s.error() == ErrorCode::INVALID_READ && c->direct && attempt == 0) {
      // An fs that accepted O_DIRECT at open but not our alignment: retry buffered.
      DropFd(path, c);
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return fail(ErrorCode::FILE_OPEN_FAIL, strerror(errno));
      CachedFd plain;  // closes fd
      plain.fd = fd;
      s = ReadVerified(fd, false, loc.segment_id, loc.offset, uint64_t(st.st_size), key, &loc, dst,
                       nullptr, nullptr, &why);
    } else if (c->direct) {
      g_direct.fetch_add(1, std::memory_order_relaxed);
    }
    if (!s.ok()) return fail(s.error(), why);
    g_bytes.fetch_add(loc.value_len, std::memory_order_relaxed);
    return ErrorCode::OK;
  }
}

}  // namespace mcxl::tier
