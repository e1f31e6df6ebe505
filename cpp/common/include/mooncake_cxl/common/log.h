// Logging: one line per event on stderr, "LEVEL time [component] message".
//
// Contract: printf-style, thread-safe (one write(2) per line), never throws.
// Level threshold comes from MC_CXL_LOG_LEVEL (debug|info|warn|error; default
// info for the master and warn for clients, see SetLogLevel callers).
#pragma once

#include <cstdarg>

namespace mcxl {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void SetLogLevel(LogLevel level);
// Reads MC_CXL_LOG_LEVEL if set, else uses `fallback`.
void InitLogLevelFromEnv(LogLevel fallback);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const char* component, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace mcxl

#define MCXL_LOG(level, component, ...)                                   \
  do {                                                                    \
    if (::mcxl::LogEnabled(::mcxl::LogLevel::level))                      \
      ::mcxl::LogLine(::mcxl::LogLevel::level, component, __VA_ARGS__);   \
  } while (0)
