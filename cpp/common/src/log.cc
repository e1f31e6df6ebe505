#include "mooncake_cxl/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace mcxl {
namespace {
// Relaxed: the level is a filter; a thread seeing the old level briefly is fine.
std::atomic<int> g_level{int(LogLevel::kInfo)};
const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(int(level), std::memory_order_relaxed); }

void InitLogLevelFromEnv(LogLevel fallback) {
  const char* env = getenv("MC_CXL_LOG_LEVEL");
  LogLevel level = fallback;
  if (env != nullptr) {
    if (!strcasecmp(env, "debug")) level = LogLevel::kDebug;
    else if (!strcasecmp(env, "info")) level = LogLevel::kInfo;
    else if (!strcasecmp(env, "warn") || !strcasecmp(env, "warning")) level = LogLevel::kWarn;
    else if (!strcasecmp(env, "error")) level = LogLevel::kError;
  }
  SetLogLevel(level);
}

bool LogEnabled(LogLevel level) {
  return int(level) >= g_level.load(std::memory_order_relaxed);
}

void LogLine(LogLevel level, const char* component, const char* fmt, ...) {
  char buf[2048];
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tmv;
  localtime_r(&ts.tv_sec, &tmv);
  int n = snprintf(buf, sizeof(buf), "%s %02d:%02d:%02d.%06ld [%s] ", kNames[int(level)],
                   tmv.tm_hour, tmv.tm_min, tmv.tm_sec, ts.tv_nsec / 1000, component);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && size_t(n) < sizeof(buf)) n += vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (size_t(n) >= sizeof(buf) - 1) n = sizeof(buf) - 2;
  buf[n++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, buf, size_t(n));  // one write: lines never interleave
  (void)ignored;
}

}  // namespace mcxl
