#include "mooncake_cxl/pool.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "mooncake_cxl/access.h"
#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/log.h"
#include "mooncake_cxl/publish.h"

namespace mcxl {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t NextPow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Size of a device-DAX character device, from sysfs; 0 when unknown.
uint64_t DaxDeviceSize(const struct stat& st) {
  char path[128];
  snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/size", major(st.st_rdev), minor(st.st_rdev));
  FILE* f = fopen(path, "r");
  if (f == nullptr) return 0;
  unsigned long long v = 0;
  if (fscanf(f, "%llu", &v) != 1) v = 0;
  fclose(f);
  return v;
}

}  // namespace

uint64_t DefaultIndexCapacity(uint64_t pool_size) {
  uint64_t want = pool_size / 4096;
  return NextPow2(want < 1024 ? 1024 : want);
}

std::string UuidToString(const uint8_t* u) {
  char s[37];
  snprintf(s, sizeof(s), "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
           u[13], u[14], u[15]);
  return s;
}

Pool::~Pool() {
  if (base_ != nullptr) munmap(base_, size_);
}

Result<std::unique_ptr<Pool>> Pool::Open(const std::string& path, uint64_t size, bool create,
                                         const PoolFileOptions& file) {
  if (path.empty()) {
    MCXL_LOG(kError, "pool", "no pool path given (set --cxl_path or MC_CXL_DEV_PATH)");
    return ErrorCode::INVALID_PARAMS;
  }
  if (size != 0 && size < kMinPoolSize) {
    MCXL_LOG(kError, "pool", "pool %s: size %llu is below the minimum of %llu bytes", path.c_str(),
             (unsigned long long)size, (unsigned long long)kMinPoolSize);
    return ErrorCode::INVALID_PARAMS;
  }
  gid_t group = gid_t(-1);
  if (create && !file.group.empty()) {
    std::vector<char> buf(16384);
    struct group gr, *found = nullptr;
    if (getgrnam_r(file.group.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
      MCXL_LOG(kError, "pool", "--pool_group '%s' is not a group on this host", file.group.c_str());
      return ErrorCode::INVALID_PARAMS;
    }
    group = gr.gr_gid;
  }
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  bool created = false;
  if (fd < 0 && errno == ENOENT && create) {
    // O_EXCL: we know the file is ours to set the mode of; 0600 so that no
    // other user can read it even for the moment before fchmod.
    fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_CREAT | O_EXCL, 0600);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = open(path.c_str(), O_RDWR | O_CLOEXEC);  // lost a race
  }
  if (fd < 0) {
    MCXL_LOG(kError, "pool", "cannot open pool %s: %s", path.c_str(), strerror(errno));
    return ErrorCode::INVALID_PARAMS;
  }
  if (created) {
    // Exact mode, whatever the umask: 0600, or 0660 for the pool's group.
    bool ok = group == gid_t(-1) ? fchmod(fd, 0600) == 0 : fchown(fd, uid_t(-1), group) == 0 && fchmod(fd, 0660) == 0;
    if (!ok) {
      MCXL_LOG(kError, "pool", "cannot set the mode of new pool %s: %s", path.c_str(), strerror(errno));
      close(fd);
      unlink(path.c_str());
      return ErrorCode::INVALID_PARAMS;
    }
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  uint64_t have = 0;
  if (S_ISCHR(st.st_mode)) {
    have = DaxDeviceSize(st);
  } else if (S_ISREG(st.st_mode)) {
    have = uint64_t(st.st_size);
    if (create && have == 0 && size > 0) {
      if (ftruncate(fd, off_t(size)) != 0) {
        MCXL_LOG(kError, "pool", "cannot size pool %s to %llu bytes: %s", path.c_str(),
                 (unsigned long long)size, strerror(errno));
        close(fd);
        return ErrorCode::INVALID_PARAMS;
      }
      have = size;
    }
  } else {
    MCXL_LOG(kError, "pool", "pool %s is neither a device-DAX node nor a regular file", path.c_str());
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  if (size == 0) size = have;
  if (have != 0 && have < size) {
    MCXL_LOG(kError, "pool", "pool %s holds %llu bytes, less than the requested size %llu",
             path.c_str(), (unsigned long long)have, (unsigned long long)size);
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  if (size < kMinPoolSize) {
    MCXL_LOG(kError, "pool", "pool %s is %llu bytes; the minimum is %llu", path.c_str(),
             (unsigned long long)size, (unsigned long long)kMinPoolSize);
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    MCXL_LOG(kError, "pool", "cannot map pool %s (%llu bytes): %s", path.c_str(),
             (unsigned long long)size, strerror(errno));
    return ErrorCode::INVALID_PARAMS;
  }
  return std::unique_ptr<Pool>(new Pool(path, static_cast<char*>(base), size, st.st_mode));
}

bool Pool::IsFormatted() const {
  return reinterpret_cast<const std::atomic<uint64_t>*>(base_)->load(std::memory_order_acquire) ==
         kPoolMagic;
}

Status Pool::Format(const FormatOptions& options) {
  std::string why;
  if (!PoolModeAcceptable(mode_, options.allow_world_readable, &why)) {
    MCXL_LOG(kError, "pool",
             "refusing to format %s: %s; chmod o-rw it (or chmod 0600), or pass --allow_world_readable_pool",
             path_.c_str(), why.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  uint8_t token[kAuthTokenBytes];
  if (getrandom(token, sizeof(token), 0) != ssize_t(sizeof(token))) {
    // No fallback: a credential derived from the clock could be guessed.
    MCXL_LOG(kError, "pool", "cannot format %s: getrandom for the pool's credential failed: %s",
             path_.c_str(), strerror(errno));
    return ErrorCode::INTERNAL_ERROR;
  }
  Superblock* sb = superblock();
  // Retract the magic first: a crash below leaves an unformatted pool.
  reinterpret_cast<std::atomic<uint64_t>*>(&sb->magic)->store(0, std::memory_order_release);
  PublishRange(sb, sizeof(uint64_t));

  uint64_t capacity = options.index_capacity ? NextPow2(options.index_capacity)
                                             : DefaultIndexCapacity(size_);
  uint64_t off = kSuperblockSize;
  uint64_t client_table = off;
  off = RoundUp(off + uint64_t(options.client_slots) * sizeof(ClientSlot), kPage);
  uint64_t pins = off;
  off = RoundUp(off + uint64_t(options.client_slots) * options.pins_per_client * sizeof(PinRecord), kPage);
  uint64_t rings = off;
  uint64_t ring_size = uint64_t(options.client_slots) * 2 * options.ring_bytes_per_client;
  off = RoundUp(off + ring_size, kPage);
  uint64_t index = off;
  off = RoundUp(off + capacity * sizeof(IndexEntry), kPage);
  if (off + kPage > size_) {
    MCXL_LOG(kError, "pool", "pool of %llu bytes cannot hold an index of %llu entries",
             (unsigned long long)size_, (unsigned long long)capacity);
    return ErrorCode::INVALID_PARAMS;
  }
  memset(base_ + kSuperblockSize, 0, off - kSuperblockSize);  // tables, rings, index
  memset(static_cast<void*>(sb), 0, kSuperblockSize);
  sb->layout_version = kLayoutVersion;
  sb->coherence_mode = uint32_t(options.coherence);
  if (getrandom(sb->uuid, sizeof(sb->uuid), 0) != ssize_t(sizeof(sb->uuid))) {
    uint64_t t = MonoNs() ^ (uint64_t(getpid()) << 32);
    memcpy(sb->uuid, &t, 8);
    t = NowNs();
    memcpy(sb->uuid + 8, &t, 8);
  }
  sb->uuid[6] = (sb->uuid[6] & 0x0f) | 0x40;  // RFC 4122 version 4
  sb->uuid[8] = (sb->uuid[8] & 0x3f) | 0x80;
  static_assert(sizeof(sb->auth_token) == kAuthTokenBytes);
  memcpy(sb->auth_token, token, sizeof(token));
  sb->pool_size = size_;
  sb->format_time_ns = NowNs();
  sb->client_table_offset = client_table;
  sb->client_slot_count = options.client_slots;
  sb->client_slot_size = sizeof(ClientSlot);
  sb->pin_table_offset = pins;
  sb->pins_per_client = options.pins_per_client;
  sb->ring_bytes = uint32_t(options.ring_bytes_per_client);
  sb->ring_region_offset = rings;
  sb->ring_region_size = ring_size;
  sb->index_offset = index;
  sb->index_capacity = capacity;
  sb->data_offset = off;
  sb->data_size = (size_ - off) / kCacheLine * kCacheLine;
  PublishRange(base_, off);
  // Release: every field above is visible before the magic that validates them.
  reinterpret_cast<std::atomic<uint64_t>*>(&sb->magic)->store(kPoolMagic, std::memory_order_release);
  PublishRange(sb, sizeof(uint64_t));
  MCXL_LOG(kInfo, "pool", "formatted %s: %llu bytes, uuid %s, index %llu entries, data %llu bytes",
           path_.c_str(), (unsigned long long)size_, UuidString().c_str(),
           (unsigned long long)capacity, (unsigned long long)sb->data_size);
  return ErrorCode::OK;
}

Status Pool::Verify(const uint8_t* expected_uuid) const {
  const Superblock* sb = superblock();
  ObserveRange(sb, kSuperblockSize);
  if (!IsFormatted()) {
    MCXL_LOG(kError, "pool", "%s is not a formatted mooncake_cxl pool (bad magic)", path_.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  if (sb->layout_version != kLayoutVersion) {
    MCXL_LOG(kError, "pool", "%s has layout version %u, this build reads version %u",
             path_.c_str(), sb->layout_version, kLayoutVersion);
    return ErrorCode::INVALID_PARAMS;
  }
  if (sb->pool_size > size_ || sb->pool_size < kMinPoolSize) {
    MCXL_LOG(kError, "pool", "%s was formatted for %llu bytes but %llu are mapped",
             path_.c_str(), (unsigned long long)sb->pool_size, (unsigned long long)size_);
    return ErrorCode::INVALID_PARAMS;
  }
  uint64_t cap = sb->index_capacity;
  bool sane = sb->client_table_offset >= kSuperblockSize &&
              sb->client_slot_size == sizeof(ClientSlot) &&
              sb->client_table_offset + uint64_t(sb->client_slot_count) * sizeof(ClientSlot) <=
                  sb->pin_table_offset &&
              sb->pin_table_offset + uint64_t(sb->client_slot_count) * sb->pins_per_client *
                      sizeof(PinRecord) <= sb->ring_region_offset &&
              sb->ring_region_offset + sb->ring_region_size <= sb->index_offset && cap != 0 &&
              uint64_t(sb->ring_bytes) * 2 * sb->client_slot_count == sb->ring_region_size &&
              sb->ring_bytes >= 4096 && sb->ring_bytes % kCacheLine == 0 &&
              (cap & (cap - 1)) == 0 && sb->index_offset + cap * sizeof(IndexEntry) <= sb->data_offset &&
              sb->data_offset + sb->data_size <= sb->pool_size;
  if (!sane) {
    MCXL_LOG(kError, "pool", "%s has an inconsistent region table", path_.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  if (expected_uuid != nullptr && memcmp(expected_uuid, sb->uuid, 16) != 0) {
    MCXL_LOG(kError, "pool", "%s has uuid %s, the master serves pool %s", path_.c_str(),
             UuidString().c_str(), UuidToString(expected_uuid).c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  return ErrorCode::OK;
}

bool Pool::InDataRegion(uint64_t offset, uint64_t len) const {
  const Superblock* sb = superblock();
  return offset >= sb->data_offset && len <= sb->data_size &&
         offset - sb->data_offset <= sb->data_size - len;
}

std::string Pool::UuidString() const { return UuidToString(superblock()->uuid); }

}  // namespace mcxl
