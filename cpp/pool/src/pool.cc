#include "mooncake_cxl/pool/pool.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "mooncake_cxl/common/access.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/coherence_sim.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t NextPow2(uint64_t v) {  // REQUIRES: v <= 2^63
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// *end = off + len, true when that neither overflows nor passes `limit`.
bool EndWithin(uint64_t off, uint64_t len, uint64_t limit, uint64_t* end) {
  return !__builtin_add_overflow(off, len, end) && *end <= limit;
}

// ---- SIGBUS in a pool mapping (see InstallPoolFaultHandler) ----
// Open pools, for the handler: a slot is claimed, filled, then published by
// a release store of `pool`; the handler acquires `pool` before reading the
// rest. Lock-free so that the handler never waits.
struct MappingSlot {
  std::atomic<bool> claimed{false};
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> size{0};
  std::atomic<const char*> path{nullptr};
  std::atomic<int> fd{-1};
  std::atomic<Pool*> pool{nullptr};
};
constexpr int kMaxMappings = 64;
MappingSlot g_mappings[kMaxMappings];
std::atomic<int> g_fault_action{-1};  // -1: no handler installed
struct sigaction g_prev_sigbus;
uintptr_t g_page_size = 4096;

void RegisterMapping(Pool* p) {
  for (MappingSlot& m : g_mappings) {
    bool expected = false;
    // Relaxed stores + release publish: the handler acquires `pool` first.
    if (!m.claimed.compare_exchange_strong(expected, true, std::memory_order_relaxed)) continue;
    m.base.store(reinterpret_cast<uintptr_t>(p->base()), std::memory_order_relaxed);
    m.size.store(p->size(), std::memory_order_relaxed);
    m.path.store(p->path().c_str(), std::memory_order_relaxed);
    m.fd.store(p->fd(), std::memory_order_relaxed);
    m.pool.store(p, std::memory_order_release);
    return;
  }
  // More pools than slots: a fault in this one takes the default action.
}

void UnregisterMapping(Pool* p) {
  for (MappingSlot& m : g_mappings) {
    if (m.pool.load(std::memory_order_acquire) != p) continue;
    m.pool.store(nullptr, std::memory_order_release);
    m.claimed.store(false, std::memory_order_release);
    return;
  }
}

// Async-signal-safe decimal formatting and write(2).
size_t AppendStr(char* buf, size_t at, size_t cap, const char* s) {
  while (s != nullptr && *s != 0 && at + 1 < cap) buf[at++] = *s++;
  return at;
}
size_t AppendU64(char* buf, size_t at, size_t cap, uint64_t v) {
  char digits[20];
  int n = 0;
  do digits[n++] = char('0' + v % 10), v /= 10;
  while (v != 0);
  while (n > 0 && at + 1 < cap) buf[at++] = digits[--n];
  return at;
}

void OnSigbus(int sig, siginfo_t* info, void* uctx) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (MappingSlot& m : g_mappings) {
    Pool* p = m.pool.load(std::memory_order_acquire);
    if (p == nullptr) continue;
    uintptr_t base = m.base.load(std::memory_order_relaxed);
    uint64_t size = m.size.load(std::memory_order_relaxed);
    if (addr < base || addr - base >= size) continue;
    p->MarkFailed();  // before the remap: see Pool::failed_
    bool exit = g_fault_action.load(std::memory_order_relaxed) == int(PoolFaultAction::kExit);
    // fstat is async-signal-safe: say how far a file shrank when it did.
    struct stat st;
    bool shrank = fstat(m.fd.load(std::memory_order_relaxed), &st) == 0 && S_ISREG(st.st_mode) &&
                  uint64_t(st.st_size) < size;
    char line[512];
    size_t n = AppendStr(line, 0, sizeof(line), "mooncake_cxl: SIGBUS at offset ");
    n = AppendU64(line, n, sizeof(line), addr - base);
    n = AppendStr(line, n, sizeof(line), " of pool ");
    n = AppendStr(line, n, sizeof(line), m.path.load(std::memory_order_relaxed));
    if (shrank) {
      n = AppendStr(line, n, sizeof(line), ": pool device shrank from ");
      n = AppendU64(line, n, sizeof(line), size);
      n = AppendStr(line, n, sizeof(line), " to ");
      n = AppendU64(line, n, sizeof(line), uint64_t(st.st_size));
      n = AppendStr(line, n, sizeof(line), " bytes");
    } else {
      n = AppendStr(line, n, sizeof(line), ": the pool device failed");
    }
    n = AppendStr(line, n, sizeof(line), exit ? "; the master exits\n" : "; this client's pool is unusable\n");
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
    if (exit) _exit(kPoolLostExitCode);
    // Replace the lost pages (this one to the end) by anonymous zeros and
    // retry the access; failed() tells every caller not to trust them.
    uintptr_t page = addr & ~(g_page_size - 1);
    void* r = mmap(reinterpret_cast<void*>(page), base + size - page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (r == MAP_FAILED) _exit(kPoolLostExitCode);
    return;
  }
  // Not our mapping: what would have happened without us.
  if (g_prev_sigbus.sa_flags & SA_SIGINFO) {
    if (g_prev_sigbus.sa_sigaction != nullptr) g_prev_sigbus.sa_sigaction(sig, info, uctx);
    return;
  }
  if (g_prev_sigbus.sa_handler != SIG_DFL && g_prev_sigbus.sa_handler != SIG_IGN) {
    g_prev_sigbus.sa_handler(sig);
    return;
  }
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGBUS, &dfl, nullptr);
  // A fault re-executes and now takes the default action; a sent signal is
  // raised again.
  if (info->si_code <= 0) raise(SIGBUS);
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

uint32_t DefaultAnnounceChannels(uint32_t client_slots, uint64_t pool_size, uint32_t announce_slots) {
  uint64_t fit = pool_size / 16 / AnnounceChannelBytes(announce_slots ? announce_slots : 1);
  uint64_t n = std::min<uint64_t>(uint64_t(client_slots) * 2, std::max<uint64_t>(fit, 8));
  return uint32_t(std::clamp<uint64_t>(n, 1, kMaxAnnounceChannels));
}

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

void InstallPoolFaultHandler(PoolFaultAction action) {
  int none = -1;
  if (!g_fault_action.compare_exchange_strong(none, int(action), std::memory_order_relaxed)) return;
  g_page_size = uintptr_t(sysconf(_SC_PAGESIZE));
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;  // NODEFER: a chained handler may re-raise
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_prev_sigbus);
}

Pool::Pool(std::string path, int fd, char* base, uint64_t size, mode_t mode, std::unique_ptr<SimHost> sim)
    : path_(std::move(path)), fd_(fd), base_(base), size_(size), mode_(mode), sim_(std::move(sim)) {}

Pool::~Pool() {
  UnregisterMapping(this);
  if (base_ != nullptr && !sim_) munmap(base_, size_);
  sim_.reset();  // unmaps the host copy
  if (fd_ >= 0) close(fd_);
}

void Pool::WriteBackOwn(const void* p, size_t n, CoherenceMode mode) const {
  if (sim_) sim_->WriteBack(p, n);
  else if (mode == CoherenceMode::kNonCoherent) CacheLineWriteBack(p, n);
  PublishRange(p, n);  // the process's own build (a fence when it is still unset)
}

void Pool::InvalidateOwn(const void* p, size_t n) const {
  if (sim_) sim_->Invalidate(p, n);
  else CacheLineEvict(p, n);  // the mode is not known yet; cheap for one superblock
  ObserveRange(p, n);
}

void Pool::NameSimRegions() const {
  if (!sim_) return;
  const PoolGeometry& g = geo_;
  uint64_t announce = AnnounceChannelBytes(g.announce_slots);
  sim_->SetRegions({
      {"superblock", 0, kSuperblockSize, 1},
      {"client slot", g.client_table_offset, sizeof(ClientSlot), g.client_slot_count},
      {"pin table of client", g.pin_table_offset, uint64_t(g.pins_per_client) * sizeof(PinRecord),
       g.client_slot_count},
      {"ring (client*2+dir)", g.ring_region_offset, g.ring_bytes, uint64_t(g.client_slot_count) * 2},
      {"announce channel", g.announce_offset, announce, g.announce_channels},
      {"index entry", g.index_offset, sizeof(IndexEntry), g.index_capacity},
      {"data region", g.data_offset, g.data_size, 1},
  });
}

Status Pool::CheckSimMode(CoherenceMode mode) const {
  if (!sim_ || mode == CoherenceMode::kNonCoherent) return ErrorCode::OK;
  MCXL_LOG(kError, "pool", "MC_CXL_SIM_HOST=%d simulates a host without coherence, but pool %s is %s coherent: "
           "format it with --coherence=noncoherent (or unset MC_CXL_SIM_HOST)", sim_->host(), path_.c_str(),
           IsFormatted() ? "formatted" : "being formatted");
  return ErrorCode::INVALID_PARAMS;
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
  int sim_host = SimHost::HostFromEnv();
  if (sim_host == -2) {
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  std::unique_ptr<SimHost> sim;
  if (sim_host >= 0) {
    auto attached = SimHost::Attach(path, fd, size, st.st_mode, sim_host);
    if (!attached) {
      close(fd);
      return attached.error();
    }
    sim = std::move(attached.value());
  }
  void* base = sim ? sim->base() : mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    MCXL_LOG(kError, "pool", "cannot map pool %s (%llu bytes): %s", path.c_str(),
             (unsigned long long)size, strerror(errno));
    close(fd);
    return ErrorCode::INVALID_PARAMS;
  }
  // A tmpfs mounted huge=advise then backs the pool with 2 MiB pages (fewer
  // TLB misses on large reads: README, "The pool on 2 MiB pages");
  // elsewhere (huge=never, device-DAX, disk files) a no-op or refused.
  (void)madvise(base, size, MADV_HUGEPAGE);
  std::unique_ptr<Pool> pool(new Pool(path, fd, static_cast<char*>(base), size, st.st_mode, std::move(sim)));
  RegisterMapping(pool.get());
  return pool;
}

std::string Pool::TmpfsHugePolicy() const {
  constexpr long kTmpfsMagic = 0x01021994;
  struct statfs fs {};
  if (statfs(path_.c_str(), &fs) != 0 || fs.f_type != kTmpfsMagic) return "";
  // The mount whose directory is the longest prefix of the pool's path.
  char* real = realpath(path_.c_str(), nullptr);
  std::string file = real ? real : path_;
  free(real);
  std::ifstream mounts("/proc/self/mounts");
  std::string line, best_dir, best_opts;
  while (std::getline(mounts, line)) {
    std::istringstream in(line);
    std::string dev, dir, type, opts;
    if (!(in >> dev >> dir >> type >> opts) || type != "tmpfs") continue;
    bool under = dir == "/" || (file.compare(0, dir.size(), dir) == 0 && file.size() > dir.size() &&
                                file[dir.size()] == '/');
    if (under && dir.size() >= best_dir.size()) best_dir = dir, best_opts = opts;
  }
  std::istringstream opts(best_opts);
  for (std::string opt; std::getline(opts, opt, ',');)
    if (opt.rfind("huge=", 0) == 0) return opt.substr(5);
  return "never";
}

bool Pool::IsFormatted() const {
  if (sim_) sim_->Invalidate(base_, sizeof(uint64_t));  // the host's copy may hold an older superblock
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
  if (Status s = CheckSimMode(options.coherence); !s.ok()) return s;
  Superblock* sb = superblock();
  // Retract the magic first: a crash below leaves an unformatted pool.
  reinterpret_cast<std::atomic<uint64_t>*>(&sb->magic)->store(0, std::memory_order_release);
  WriteBackOwn(sb, sizeof(uint64_t), options.coherence);

  FormatOptions o = options;
  if (o.announce_channels == 0) o.announce_channels = DefaultAnnounceChannels(o.client_slots, size_, o.announce_slots);
  const FormatOptions& opts = o;
  if (options.client_slots == 0 || options.client_slots > kMaxClientSlots ||
      options.pins_per_client == 0 || options.pins_per_client > kMaxPinsPerClient ||
      options.ring_bytes_per_client < 4096 || options.ring_bytes_per_client > kMaxRingBytes ||
      options.ring_bytes_per_client % kCacheLine != 0 || options.index_capacity > size_ / sizeof(IndexEntry) ||
      opts.announce_channels == 0 || opts.announce_channels > kMaxAnnounceChannels ||
      options.announce_slots == 0 || options.announce_slots > kMaxAnnounceSlots ||
      (options.announce_slots & (options.announce_slots - 1)) != 0) {
    MCXL_LOG(kError, "pool", "cannot format %s: client slots %u (1..%u), pins per client %u (1..%u), ring "
             "bytes %llu (4096..%llu, 64-aligned), index capacity %llu (fits %llu bytes) or announce channels "
             "%u (1..%u) x slots %u (a power of two, 1..%u) out of range",
             path_.c_str(), options.client_slots, kMaxClientSlots, options.pins_per_client, kMaxPinsPerClient,
             (unsigned long long)options.ring_bytes_per_client, (unsigned long long)kMaxRingBytes,
             (unsigned long long)options.index_capacity, (unsigned long long)size_, opts.announce_channels,
             kMaxAnnounceChannels, options.announce_slots, kMaxAnnounceSlots);
    return ErrorCode::INVALID_PARAMS;
  }
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
  uint64_t announce = off;
  off = RoundUp(off + uint64_t(opts.announce_channels) * AnnounceChannelBytes(options.announce_slots), kPage);
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
  sb->announce_offset = announce;
  sb->announce_channels = opts.announce_channels;
  sb->announce_slots = options.announce_slots;
  sb->index_offset = index;
  sb->index_capacity = capacity;
  sb->data_offset = off;
  sb->data_size = (size_ - off) / kCacheLine * kCacheLine;
  WriteBackOwn(base_, off, options.coherence);
  geo_ = PoolGeometry{size_, client_table, options.client_slots, pins, options.pins_per_client,
                      uint32_t(options.ring_bytes_per_client), rings, index, capacity, off, sb->data_size,
                      options.coherence, {}};
  memcpy(geo_.uuid, sb->uuid, 16);
  geo_.announce_offset = announce;
  geo_.announce_channels = opts.announce_channels;
  geo_.announce_slots = options.announce_slots;
  geo_set_ = true;
  // Release: every field above is visible before the magic that validates them.
  reinterpret_cast<std::atomic<uint64_t>*>(&sb->magic)->store(kPoolMagic, std::memory_order_release);
  WriteBackOwn(sb, sizeof(uint64_t), options.coherence);
  if (sim_) sim_->SetHotBytes(off);
  NameSimRegions();
  MCXL_LOG(kInfo, "pool", "formatted %s: %llu bytes, uuid %s, index %llu entries, data %llu bytes",
           path_.c_str(), (unsigned long long)size_, UuidString().c_str(),
           (unsigned long long)capacity, (unsigned long long)sb->data_size);
  return ErrorCode::OK;
}

Status Pool::Verify(const uint8_t* expected_uuid) const {
  const Superblock* sb = superblock();
  InvalidateOwn(sb, kSuperblockSize);
  if (!IsFormatted()) {
    MCXL_LOG(kError, "pool", "%s is not a formatted mooncake_cxl pool (bad magic)", path_.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  if (sb->layout_version != kLayoutVersion) {
    MCXL_LOG(kError, "pool", "%s has layout version %u, this build reads version %u",
             path_.c_str(), sb->layout_version, kLayoutVersion);
    return ErrorCode::INVALID_PARAMS;
  }
  // Each field is read once into `g` (another process may write the
  // superblock meanwhile) and only `g` is checked and kept.
  PoolGeometry g;
  g.pool_size = sb->pool_size;
  g.client_table_offset = sb->client_table_offset;
  g.client_slot_count = sb->client_slot_count;
  uint32_t slot_size = sb->client_slot_size;
  g.pin_table_offset = sb->pin_table_offset;
  g.pins_per_client = sb->pins_per_client;
  g.ring_bytes = sb->ring_bytes;
  g.ring_region_offset = sb->ring_region_offset;
  uint64_t ring_region_size = sb->ring_region_size;
  g.index_offset = sb->index_offset;
  g.index_capacity = sb->index_capacity;
  g.data_offset = sb->data_offset;
  g.data_size = sb->data_size;
  uint32_t coherence = sb->coherence_mode;
  memcpy(g.uuid, sb->uuid, 16);
  g.announce_offset = sb->announce_offset;
  g.announce_channels = sb->announce_channels;
  g.announce_slots = sb->announce_slots;
  auto bad = [&](const char* field, uint64_t value, const char* why, uint64_t bound) {
    MCXL_LOG(kError, "pool", "%s: superblock field %s = %llu %s %llu; the pool is corrupt or not ours",
             path_.c_str(), field, (unsigned long long)value, why, (unsigned long long)bound);
    return Status(ErrorCode::INVALID_PARAMS);
  };
  if (g.pool_size < kMinPoolSize) return bad("pool_size", g.pool_size, "is below the minimum of", kMinPoolSize);
  if (g.pool_size > size_)
    return bad("pool_size", g.pool_size, "is larger than the bytes mapped (the device is smaller):", size_);
  if (coherence > uint32_t(CoherenceMode::kNonCoherent))
    return bad("coherence_mode", coherence, "is not a mode; the largest is", uint32_t(CoherenceMode::kNonCoherent));
  g.coherence = CoherenceMode(coherence);
  if (Status s = CheckSimMode(g.coherence); !s.ok()) return s;
  if (slot_size != sizeof(ClientSlot)) return bad("client_slot_size", slot_size, "is not", sizeof(ClientSlot));
  if (g.client_slot_count == 0 || g.client_slot_count > kMaxClientSlots)
    return bad("client_slot_count", g.client_slot_count, "is outside 1 ..", kMaxClientSlots);
  if (g.pins_per_client == 0 || g.pins_per_client > kMaxPinsPerClient)
    return bad("pins_per_client", g.pins_per_client, "is outside 1 ..", kMaxPinsPerClient);
  if (g.ring_bytes < 4096 || g.ring_bytes > kMaxRingBytes || g.ring_bytes % kCacheLine != 0)
    return bad("ring_bytes", g.ring_bytes, "is not a multiple of 64 in 4096 ..", kMaxRingBytes);
  // Counts are bounded above, so these products cannot overflow.
  uint64_t want_rings = uint64_t(g.ring_bytes) * 2 * g.client_slot_count;
  if (ring_region_size != want_rings)
    return bad("ring_region_size", ring_region_size, "is not 2 * ring_bytes * client_slot_count =", want_rings);
  if (g.announce_channels == 0 || g.announce_channels > kMaxAnnounceChannels)
    return bad("announce_channels", g.announce_channels, "is outside 1 ..", kMaxAnnounceChannels);
  if (g.announce_slots == 0 || g.announce_slots > kMaxAnnounceSlots ||
      (g.announce_slots & (g.announce_slots - 1)) != 0)
    return bad("announce_slots", g.announce_slots, "is not a power of two in 1 ..", kMaxAnnounceSlots);
  // Both counts are bounded above: the product cannot overflow.
  uint64_t announce_bytes = uint64_t(g.announce_channels) * AnnounceChannelBytes(g.announce_slots);
  if (g.index_capacity == 0 || (g.index_capacity & (g.index_capacity - 1)) != 0)
    return bad("index_capacity", g.index_capacity, "is not a power of two; pool size", g.pool_size);
  uint64_t index_bytes = 0;
  if (__builtin_mul_overflow(g.index_capacity, uint64_t(sizeof(IndexEntry)), &index_bytes))
    return bad("index_capacity", g.index_capacity, "entries overflow 64-bit bytes; pool size", g.pool_size);
  // Regions in order, 64-byte aligned, each within pool_size and after the
  // previous one: [superblock][clients][pins][rings][announce][index][data].
  struct Region {
    const char* name;       // the offset field
    const char* size_name;  // the field its length derives from
    uint64_t offset, bytes;
  } regions[] = {
      {"client_table_offset", "client_slot_count", g.client_table_offset,
       uint64_t(g.client_slot_count) * sizeof(ClientSlot)},
      {"pin_table_offset", "pins_per_client", g.pin_table_offset,
       uint64_t(g.client_slot_count) * g.pins_per_client * sizeof(PinRecord)},
      {"ring_region_offset", "ring_bytes", g.ring_region_offset, want_rings},
      {"announce_offset", "announce_slots", g.announce_offset, announce_bytes},
      {"index_offset", "index_capacity", g.index_offset, index_bytes},
      {"data_offset", "data_size", g.data_offset, g.data_size},
  };
  uint64_t prev_end = kSuperblockSize;
  const char* prev = "the superblock";
  const char* prev_size = "4096 bytes";
  for (const Region& r : regions) {
    if (r.offset % kCacheLine != 0) return bad(r.name, r.offset, "is not 64-byte aligned; pool size", g.pool_size);
    if (r.offset < prev_end) {
      MCXL_LOG(kError, "pool", "%s: superblock field %s = %llu overlaps the region before it (%s + %s ends "
               "at %llu); the pool is corrupt or not ours", path_.c_str(), r.name, (unsigned long long)r.offset,
               prev, prev_size, (unsigned long long)prev_end);
      return ErrorCode::INVALID_PARAMS;
    }
    uint64_t end = 0;
    if (!EndWithin(r.offset, r.bytes, g.pool_size, &end)) {
      MCXL_LOG(kError, "pool", "%s: superblock fields %s = %llu and %s put the region (%llu bytes) past "
               "pool_size %llu; the pool is corrupt or not ours", path_.c_str(), r.name,
               (unsigned long long)r.offset, r.size_name, (unsigned long long)r.bytes,
               (unsigned long long)g.pool_size);
      return ErrorCode::INVALID_PARAMS;
    }
    prev_end = end;
    prev = r.name;
    prev_size = r.size_name;
  }
  if (g.data_size < kCacheLine || g.data_size % kCacheLine != 0)
    return bad("data_size", g.data_size, "is not a non-zero multiple of", kCacheLine);
  if (expected_uuid != nullptr && memcmp(expected_uuid, g.uuid, 16) != 0) {
    MCXL_LOG(kError, "pool", "%s has uuid %s, the master serves pool %s", path_.c_str(),
             UuidToString(g.uuid).c_str(), UuidToString(expected_uuid).c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  if (geo_set_ && !(geo_ == g)) {
    MCXL_LOG(kError, "pool", "%s: the superblock's region table changed since this process mapped it",
             path_.c_str());
    return ErrorCode::INVALID_PARAMS;
  }
  geo_ = g;
  geo_set_ = true;
  if (sim_) sim_->SetHotBytes(g.data_offset);
  NameSimRegions();
  return ErrorCode::OK;
}

uint64_t Pool::DeviceSize() const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return kUnknownSize;
  if (S_ISREG(st.st_mode)) return uint64_t(st.st_size);
  uint64_t dax = S_ISCHR(st.st_mode) ? DaxDeviceSize(st) : 0;
  return dax != 0 ? dax : kUnknownSize;
}

bool Pool::CheckSize() {
  if (failed()) return false;
  uint64_t now = DeviceSize();
  if (now >= size_) return true;  // also kUnknownSize
  if (!failed_.exchange(true, std::memory_order_seq_cst))
    MCXL_LOG(kError, "pool", "pool device shrank from %llu to %llu bytes: %s is unusable",
             (unsigned long long)size_, (unsigned long long)now, path_.c_str());
  return false;
}

std::string Pool::UuidString() const { return UuidToString(geo_.uuid); }

}  // namespace mcxl
