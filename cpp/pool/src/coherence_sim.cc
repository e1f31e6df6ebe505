#include "mooncake_cxl/pool/coherence_sim.h"

#include <fcntl.h>
#include <immintrin.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/layout.h"

namespace mcxl {
namespace {

constexpr uint64_t kLine = 64;
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kStripes = 1u << 16;
constexpr uint64_t kGlobalMagic = 0x6d63786c53494d47ull;  // "mcxlSIMG"
constexpr uint64_t kHostMagic = 0x6d63786c53494d48ull;    // "mcxlSIMH"
constexpr uint64_t kVersionMask = (1ull << 48) - 1;
constexpr uint64_t kMaxFlagLogs = 20;

// `<pool>.simlines` header. The counters come first so that tests can read
// them at fixed offsets (struct SimCounters).
struct GlobalHeader {
  uint64_t conflicts, lost_updates, false_sharing;  // atomic_ref
  uint64_t magic, pool_size, pool_dev, pool_ino;
};
struct HostHeader {
  uint64_t magic, pool_size, pool_dev, pool_ino;
  uint64_t attach_count;  // atomic_ref: the next process's ordinal
};

std::atomic_ref<uint64_t> Word(uint64_t& w) { return std::atomic_ref<uint64_t>(w); }

uint64_t SplitMix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t EnvU64(const char* name, uint64_t fallback, bool* set = nullptr) {
  const char* v = getenv(name);
  if (set) *set = v != nullptr && *v != 0;
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  unsigned long long x = strtoull(v, &end, 0);
  if (end == v || *end != 0) {
    MCXL_LOG(kError, "sim", "%s=%s is not a number; using %llu", name, v, (unsigned long long)fallback);
    return fallback;
  }
  return x;
}

// Opens (creating, mode `mode`) `path` and holds an exclusive flock on it
// (CloseUnlocked drops it: a mapping keeps the open file, and its flock,
// alive past close). -1 on failure (logged).
int OpenLocked(const std::string& path, mode_t mode) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    MCXL_LOG(kError, "sim", "cannot open %s: %s", path.c_str(), strerror(errno));
    return -1;
  }
  (void)fchmod(fd, mode & 0666);  // the pool's mode: the same users reach it
  if (flock(fd, LOCK_EX) != 0) {
    MCXL_LOG(kError, "sim", "cannot lock %s: %s", path.c_str(), strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

void CloseUnlocked(int fd) {
  (void)flock(fd, LOCK_UN);
  close(fd);
}

char* MapFile(int fd, uint64_t bytes, const std::string& path) {
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    MCXL_LOG(kError, "sim", "cannot map %s (%llu bytes): %s", path.c_str(), (unsigned long long)bytes,
             strerror(errno));
    return nullptr;
  }
  return static_cast<char*>(m);
}

// Sizes the file to `bytes` from empty (so that every byte reads zero).
bool Reset(int fd, uint64_t bytes, const std::string& path) {
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, off_t(bytes)) != 0) {
    MCXL_LOG(kError, "sim", "cannot size %s to %llu bytes: %s", path.c_str(), (unsigned long long)bytes,
             strerror(errno));
    return false;
  }
  return true;
}

bool AllZero(const char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    if (w != 0) return false;
  }
  return true;
}

// Registry of live simulated mappings, for SimHostOf. Claimed by CAS,
// cleared on destruction; acquire/release pair the pointer with its fields
// (process-local).
constexpr int kMaxSims = 16;
std::atomic<SimHost*> g_sims[kMaxSims];

std::string GlobalPath(const std::string& pool) { return pool + ".simlines"; }
std::string CopyPath(const std::string& pool, int host) { return pool + ".simhost-" + std::to_string(host); }
std::string StatePath(const std::string& pool, int host) { return CopyPath(pool, host) + ".state"; }

}  // namespace

ChurnSchedule::ChurnSchedule(uint64_t seed, int host, uint64_t ordinal) {
  uint64_t s = seed;
  state_ = SplitMix(&s) ^ (uint64_t(host) * 0x100000001b3ull) ^ (ordinal << 40);
}

uint64_t ChurnSchedule::Next(uint64_t lines, uint64_t hot_lines) {
  uint64_t r = SplitMix(&state_);
  uint64_t range = (hot_lines > 0 && hot_lines < lines && (r & 1)) ? hot_lines : lines;
  return (r >> 1) % range;
}

std::vector<std::string> SimFilePaths(const std::string& pool_path, int hosts) {
  std::vector<std::string> out{GlobalPath(pool_path)};
  for (int h = 0; h < hosts; ++h) {
    out.push_back(CopyPath(pool_path, h));
    out.push_back(StatePath(pool_path, h));
  }
  return out;
}

SimCounters ReadSimCounters(const std::string& pool_path) {
  SimCounters c;
  int fd = open(GlobalPath(pool_path).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return c;
  GlobalHeader h{};
  if (pread(fd, &h, sizeof(h), 0) == ssize_t(sizeof(h)) && h.magic == kGlobalMagic) {
    c.conflicts = h.conflicts, c.lost_updates = h.lost_updates, c.false_sharing = h.false_sharing;
  }
  close(fd);
  return c;
}

int SimHost::HostFromEnv() {
  const char* v = getenv("MC_CXL_SIM_HOST");
  if (v == nullptr || *v == 0) return -1;
  char* end = nullptr;
  long h = strtol(v, &end, 10);
  if (end == v || *end != 0 || h < 0 || h > kMaxSimHost) {
    MCXL_LOG(kError, "sim", "MC_CXL_SIM_HOST=%s is not a host id in 0..%d", v, kMaxSimHost);
    return -2;
  }
  return int(h);
}

Result<std::unique_ptr<SimHost>> SimHost::Attach(const std::string& pool_path, int pool_fd, uint64_t size,
                                                 mode_t mode, int host) {
  struct stat st {};
  if (fstat(pool_fd, &st) != 0 || size % kLine != 0) {
    MCXL_LOG(kError, "sim", "pool %s: cannot simulate a host on it (size %llu not a multiple of 64 or no fstat)",
             pool_path.c_str(), (unsigned long long)size);
    return ErrorCode::INVALID_PARAMS;
  }
  std::unique_ptr<SimHost> s(new SimHost());
  s->host_ = host;
  s->size_ = size;
  s->lines_ = size / kLine;
  s->copy_path_ = CopyPath(pool_path, host);
  bool seeded = false;
  uint64_t random_seed = 0;
  if (getrandom(&random_seed, sizeof(random_seed), 0) != ssize_t(sizeof(random_seed))) random_seed = uint64_t(getpid());
  s->seed_ = EnvU64("MC_CXL_SIM_SEED", random_seed, &seeded);
  uint64_t churn = EnvU64("MC_CXL_SIM_CHURN", 20000);

  s->pool_ = MapFile(pool_fd, size, pool_path);
  if (s->pool_ == nullptr) return ErrorCode::INVALID_PARAMS;

  // The global file: counters, stripe locks, a version word per line.
  std::string gpath = GlobalPath(pool_path);
  s->global_bytes_ = kHeaderBytes + kStripes * 8 + s->lines_ * 8;
  int gfd = OpenLocked(gpath, mode);
  if (gfd < 0) return ErrorCode::INVALID_PARAMS;
  GlobalHeader gh{};
  bool gok = pread(gfd, &gh, sizeof(gh), 0) == ssize_t(sizeof(gh)) && gh.magic == kGlobalMagic &&
             gh.pool_size == size && gh.pool_dev == uint64_t(st.st_dev) && gh.pool_ino == uint64_t(st.st_ino);
  if (!gok && !Reset(gfd, s->global_bytes_, gpath)) return CloseUnlocked(gfd), ErrorCode::INVALID_PARAMS;
  s->global_map_ = MapFile(gfd, s->global_bytes_, gpath);
  if (s->global_map_ == nullptr) return CloseUnlocked(gfd), ErrorCode::INVALID_PARAMS;
  auto* g = reinterpret_cast<GlobalHeader*>(s->global_map_);
  if (!gok) {
    g->pool_size = size, g->pool_dev = uint64_t(st.st_dev), g->pool_ino = uint64_t(st.st_ino);
    // Release: the fields before the magic; the next attacher also reads
    // them under the flock. Crosses simulated hosts (one real machine).
    Word(g->magic).store(kGlobalMagic, std::memory_order_release);
  }
  CloseUnlocked(gfd);  // the file is initialised
  s->locks_ = reinterpret_cast<uint64_t*>(s->global_map_ + kHeaderBytes);
  s->versions_ = s->locks_ + kStripes;

  // The host's files: the copy, and its state (header, bases, snapshot).
  std::string spath = StatePath(pool_path, host);
  uint64_t bases_bytes = RoundUp(s->lines_ * 8, kHeaderBytes);
  s->state_bytes_ = kHeaderBytes + bases_bytes + size;
  int sfd = OpenLocked(spath, mode);
  if (sfd < 0) return ErrorCode::INVALID_PARAMS;
  int cfd = open(s->copy_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (cfd < 0) {
    MCXL_LOG(kError, "sim", "cannot open %s: %s", s->copy_path_.c_str(), strerror(errno));
    CloseUnlocked(sfd);
    return ErrorCode::INVALID_PARAMS;
  }
  (void)fchmod(cfd, mode & 0666);
  HostHeader hh{};
  bool hok = pread(sfd, &hh, sizeof(hh), 0) == ssize_t(sizeof(hh)) && hh.magic == kHostMagic &&
             hh.pool_size == size && hh.pool_dev == uint64_t(st.st_dev) && hh.pool_ino == uint64_t(st.st_ino);
  if (!hok && (!Reset(sfd, s->state_bytes_, spath) || !Reset(cfd, size, s->copy_path_))) {
    close(cfd), CloseUnlocked(sfd);
    return ErrorCode::INVALID_PARAMS;
  }
  s->state_map_ = MapFile(sfd, s->state_bytes_, spath);
  s->copy_ = MapFile(cfd, size, s->copy_path_);
  close(cfd);
  if (s->state_map_ == nullptr || s->copy_ == nullptr) return CloseUnlocked(sfd), ErrorCode::INVALID_PARAMS;
  (void)madvise(s->copy_, size, MADV_HUGEPAGE);
  s->bases_ = reinterpret_cast<uint64_t*>(s->state_map_ + kHeaderBytes);
  s->snap_ = s->state_map_ + kHeaderBytes + bases_bytes;
  auto* hdr = reinterpret_cast<HostHeader*>(s->state_map_);
  if (!hok) {
    // A fresh host: every line fetched from the pool. Chunks nobody wrote
    // are left as the zeros they are; lines a simulated host wrote back are
    // taken under their lock with their version.
    constexpr uint64_t kChunk = 64 * 1024;
    for (uint64_t off = 0; off < size; off += kChunk) {
      uint64_t n = std::min(kChunk, size - off);
      if (!AllZero(s->pool_ + off, n)) {
        memcpy(s->copy_ + off, s->pool_ + off, n);
        memcpy(s->snap_ + off, s->pool_ + off, n);
      }
      for (uint64_t line = off / kLine; line < (off + n) / kLine; ++line) {
        if ((Word(s->versions_[line]).load(std::memory_order_relaxed) & kVersionMask) == 0) continue;
        s->LockLine(line);
        memcpy(s->copy_ + line * kLine, s->pool_ + line * kLine, kLine);
        memcpy(s->snap_ + line * kLine, s->pool_ + line * kLine, kLine);
        s->bases_[line] = Word(s->versions_[line]).load(std::memory_order_relaxed) & kVersionMask;
        s->UnlockLine(line);
      }
    }
    hdr->pool_size = size, hdr->pool_dev = uint64_t(st.st_dev), hdr->pool_ino = uint64_t(st.st_ino);
    Word(hdr->magic).store(kHostMagic, std::memory_order_release);  // as the global magic above
  }
  CloseUnlocked(sfd);
  // Relaxed: an ordinal only has to be unique among this host's processes.
  uint64_t ordinal = Word(hdr->attach_count).fetch_add(1, std::memory_order_relaxed);
  s->schedule_ = ChurnSchedule(s->seed_, host, ordinal);
  for (auto& slot : g_sims) {
    SimHost* expected = nullptr;
    if (slot.compare_exchange_strong(expected, s.get(), std::memory_order_release)) break;
  }
  MCXL_LOG(kWarn, "sim", "simulated host %d: pool %s through host copy %s (seed %llu%s, process %llu of this "
           "host, churn %llu lines/s)", host, pool_path.c_str(), s->copy_path_.c_str(),
           (unsigned long long)s->seed_, seeded ? "" : " random", (unsigned long long)ordinal,
           (unsigned long long)churn);
  if (churn > 0) s->churn_ = std::thread([p = s.get(), churn] { p->ChurnLoop(churn); });
  return s;
}

SimHost::~SimHost() {
  {
    std::lock_guard<std::mutex> lock(churn_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (churn_.joinable()) churn_.join();
  for (auto& slot : g_sims) {
    SimHost* expected = this;
    slot.compare_exchange_strong(expected, nullptr, std::memory_order_release);
  }
  if (copy_) munmap(copy_, size_);
  if (pool_) munmap(pool_, size_);
  if (state_map_) munmap(state_map_, state_bytes_);
  if (global_map_) munmap(global_map_, global_bytes_);
}

SimHost* SimHostOf(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (auto& slot : g_sims) {
    SimHost* s = slot.load(std::memory_order_acquire);
    if (s != nullptr && a >= uintptr_t(s->base()) && a - uintptr_t(s->base()) < s->size()) return s;
  }
  return nullptr;
}

void SimHost::LockLine(uint64_t line) {
  // The stripe word holds the holder's pid. Acquire/release order the line
  // copies between holders; the word crosses simulated hosts, which are
  // processes of one real, coherent machine.
  std::atomic_ref<uint64_t> w(locks_[line % kStripes]);
  const uint64_t me = uint64_t(getpid());
  for (uint64_t spins = 0;; ++spins) {
    uint64_t cur = 0;
    if (w.compare_exchange_weak(cur, me, std::memory_order_acquire, std::memory_order_relaxed)) return;
    if (spins >= (1u << 14)) {
      spins = 0;
      // A holder killed inside its few-instruction copy: take the lock over.
      if (cur != 0 && cur != me && kill(pid_t(cur), 0) != 0 && errno == ESRCH)
        w.compare_exchange_strong(cur, 0, std::memory_order_relaxed);
      sched_yield();
    }
    _mm_pause();
  }
}

void SimHost::UnlockLine(uint64_t line) {
  std::atomic_ref<uint64_t>(locks_[line % kStripes]).store(0, std::memory_order_release);
}

bool SimHost::WriteBackLocked(uint64_t line) {
  const uint64_t off = line * kLine;
  uint64_t mine[8];
  auto* host_words = reinterpret_cast<uint64_t*>(copy_ + off);
  // Relaxed: other threads of this host store into the line concurrently.
  for (int i = 0; i < 8; ++i) mine[i] = Word(host_words[i]).load(std::memory_order_relaxed);
  if (memcmp(mine, snap_ + off, kLine) == 0) return false;  // clean
  std::atomic_ref<uint64_t> vw(versions_[line]);
  uint64_t v = vw.load(std::memory_order_relaxed);
  if ((v & kVersionMask) != bases_[line]) Flag(line, int(v >> 48) - 1, mine);
  memcpy(pool_ + off, mine, kLine);
  memcpy(snap_ + off, mine, kLine);
  uint64_t next = (v & kVersionMask) + 1;
  vw.store((uint64_t(host_ + 1) << 48) | next, std::memory_order_relaxed);  // under the line lock
  bases_[line] = next;
  write_backs_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void SimHost::RefetchLocked(uint64_t line) {
  const uint64_t off = line * kLine;
  uint64_t now[8];
  memcpy(now, pool_ + off, kLine);
  bases_[line] = Word(versions_[line]).load(std::memory_order_relaxed) & kVersionMask;
  if (memcmp(now, snap_ + off, kLine) == 0) return;  // the host's copy is current
  auto* host_words = reinterpret_cast<uint64_t*>(copy_ + off);
  auto* snap_words = reinterpret_cast<uint64_t*>(snap_ + off);
  for (int i = 0; i < 8; ++i) {
    // A word stored locally since it was last clean keeps the local value.
    // Relaxed: the line lock orders the snapshot and pool copies; the local
    // stores it races are unordered relaxed stores of this host anyway.
    uint64_t expected = snap_words[i];
    Word(host_words[i]).compare_exchange_strong(expected, now[i], std::memory_order_relaxed);
  }
  memcpy(snap_ + off, now, kLine);
  fetches_.fetch_add(1, std::memory_order_relaxed);
}

void SimHost::Flag(uint64_t line, int other_host, const uint64_t* mine) {
  const uint64_t off = line * kLine;
  const auto* snap = reinterpret_cast<const uint8_t*>(snap_ + off);
  const auto* pool = reinterpret_cast<const uint8_t*>(pool_ + off);
  const auto* ours = reinterpret_cast<const uint8_t*>(mine);
  bool overlap = false;
  for (uint64_t i = 0; i < kLine && !overlap; ++i) overlap = ours[i] != snap[i] && pool[i] != snap[i];
  auto* g = reinterpret_cast<GlobalHeader*>(global_map_);
  // Relaxed: counters, read by tests after the processes are done.
  Word(g->conflicts).fetch_add(1, std::memory_order_relaxed);
  Word(overlap ? g->lost_updates : g->false_sharing).fetch_add(1, std::memory_order_relaxed);
  if (flags_logged_.fetch_add(1, std::memory_order_relaxed) >= kMaxFlagLogs) return;
  std::string where = "pool offset " + std::to_string(off);
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    for (const SimRegion& r : regions_) {
      if (off < r.offset || r.stride == 0 || (off - r.offset) / r.stride >= r.count) continue;
      where += " (" + r.name + " " + std::to_string((off - r.offset) / r.stride) + " +" +
               std::to_string((off - r.offset) % r.stride) + ")";
      break;
    }
  }
  MCXL_LOG(kError, "sim", "checker: host %d wrote back the line at %s over a write-back of host %d it had not "
           "observed (%s)", host_, where.c_str(), other_host,
           overlap ? "the same bytes: a lost update" : "other bytes of the line: false sharing");
}

void SimHost::SetRegions(std::vector<SimRegion> regions) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  regions_ = std::move(regions);
}

template <typename Fn>
void SimHost::ForEachLine(const void* p, size_t n, Fn fn) {
  uint64_t a = uint64_t(static_cast<const char*>(p) - copy_);
  if (n == 0 || a >= size_) return;
  uint64_t end = std::min<uint64_t>(size_, a + n);
  for (uint64_t line = a / kLine; line * kLine < end; ++line) {
    LockLine(line);
    fn(line);
    UnlockLine(line);
  }
}

void SimHost::WriteBack(const void* p, size_t n) {
  ForEachLine(p, n, [this](uint64_t line) { WriteBackLocked(line); });
}

void SimHost::Invalidate(const void* p, size_t n) {
  ForEachLine(p, n, [this](uint64_t line) {
    WriteBackLocked(line);
    if (before_refetch_ != nullptr) before_refetch_(before_refetch_arg_, line);
    RefetchLocked(line);
  });
}

void SimHost::ChurnSteps(uint64_t n) {
  std::lock_guard<std::mutex> lock(churn_mu_);
  uint64_t hot = hot_lines_.load(std::memory_order_relaxed);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t line = schedule_.Next(lines_, hot);
    LockLine(line);
    if (!WriteBackLocked(line)) RefetchLocked(line);  // evict a dirty line, prefetch a clean one
    UnlockLine(line);
  }
}

void SimHost::ChurnLoop(uint64_t per_second) {
  // The simulated cache's clock: a tick per millisecond, the rate spread
  // over the ticks (a remainder carried).
  uint64_t carry = 0;
  std::unique_lock<std::mutex> lock(churn_mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(1), [this] { return stop_; });
    if (stop_) break;
    carry += per_second;
    uint64_t steps = carry / 1000;
    carry %= 1000;
    lock.unlock();
    ChurnSteps(steps);
    lock.lock();
  }
}

}  // namespace mcxl
