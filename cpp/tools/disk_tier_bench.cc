// Micro-benchmark of the SSD tier's segment files (disk_tier.h): append MB/s
// and cold ReadRecord latency for 64 KiB, 1 MiB and 16 MiB values.
// Usage: mcxl_disk_tier_bench DIR [total_MiB_per_size=256] [buffered]
// Reads are cold: O_DIRECT where the filesystem supports it, else the file's
// page cache is dropped (posix_fadvise DONTNEED) before each read. One JSON
// line per size on stdout.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "mooncake_cxl/tier/disk_tier.h"
#include "mooncake_cxl/common/log.h"

using namespace mcxl;
using namespace mcxl::tier;
using Clock = std::chrono::steady_clock;

static double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [total_MiB_per_size] [buffered]\n", argv[0]);
    return 2;
  }
  SetLogLevel(LogLevel::kWarn);
  const std::string dir = std::string(argv[1]) + "/mcxl_disk_tier_bench";
  const uint64_t total = (argc > 2 ? strtoull(argv[2], nullptr, 10) : 256) << 20;
  const bool buffered = argc > 3 && std::string(argv[3]) == "buffered";
  if (buffered) setenv("MCXL_TIER_NO_ODIRECT", "1", 1);
  for (uint64_t size : {64ull << 10, 1ull << 20, 16ull << 20}) {
    std::filesystem::remove_all(dir);
    Options o;
    o.root_dir = dir;
    o.capacity_bytes = total * 2 + (64ull << 20);
    o.segment_bytes = 256ull << 20;
    auto r = DiskTier::Open(o);
    if (!r.ok()) {
      fprintf(stderr, "open %s: %s\n", dir.c_str(), ErrorCodeName(r.error()));
      return 1;
    }
    auto t = std::move(r).value();
    std::vector<uint8_t> value(size);
    std::mt19937_64 rng(1);
    for (auto& b : value) b = uint8_t(rng());
    const int n = int(std::max<uint64_t>(8, total / size));
    std::vector<RecordLocation> locs;
    auto t0 = Clock::now();
    for (int i = 0; i < n; i++) {
      value[0] = uint8_t(i);
      auto l = t->Append("bench-" + std::to_string(i), value.data(), size, i + 1);
      if (!l.ok()) {
        fprintf(stderr, "append: %s\n", ErrorCodeName(l.error()));
        return 1;
      }
      locs.push_back(l.value());
    }
    double append_s = Us(Clock::now() - t0) / 1e6;
    const bool direct = t->stats().direct_io;
    std::vector<double> lat;
    std::vector<uint8_t> dst(size);
    const int reads = std::min(n, 64);
    for (int k = 0; k < reads; k++) {
      int i = int(rng() % n);
      if (!direct) {  // drop this segment's cached pages so the read is cold
        int fd = open(SegmentPath(dir, locs[i].segment_id).c_str(), O_RDONLY);
        if (fd >= 0) {
          fdatasync(fd);
          posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          close(fd);
        }
      }
      auto s0 = Clock::now();
      Status s = ReadRecord(dir, locs[i], "bench-" + std::to_string(i), dst.data(), size);
      lat.push_back(Us(Clock::now() - s0));
      if (!s.ok()) {
        fprintf(stderr, "read: %s\n", ErrorCodeName(s.error()));
        return 1;
      }
    }
    std::sort(lat.begin(), lat.end());
    double mean = 0;
    for (double x : lat) mean += x;
    mean /= double(lat.size());
    printf("{\"value_bytes\": %llu, \"records\": %d, \"direct_io\": %s, \"append_MBps\": %.1f, "
           "\"read_p50_us\": %.1f, \"read_p99_us\": %.1f, \"read_mean_us\": %.1f, "
           "\"read_MBps\": %.1f}\n",
           (unsigned long long)size, n, direct ? "true" : "false",
           double(n) * double(size) / append_s / 1e6, lat[lat.size() / 2],
           lat[std::min(lat.size() - 1, lat.size() * 99 / 100)], mean,
           double(size) / mean);
    fflush(stdout);
    t.reset();
  }
  std::filesystem::remove_all(dir);
  return 0;
}
