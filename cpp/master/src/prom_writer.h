// PromWriter: Prometheus text exposition (HELP, TYPE, samples) for the
// master's /metrics page (master_http.cc) and the tier's part of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace mcxl {

// A Prometheus label value: quotes and backslashes escaped, control bytes
// (a client's local_hostname may hold any) dropped.
inline std::string LabelEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) continue;
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

class PromWriter {
 public:
  void Metric(const char* name, const char* type, const char* help, uint64_t value) {
    Header(name, type, help);
    Sample(name, "", double(value));
  }
  void Header(const char* name, const char* type, const char* help) {
    Appendf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  }
  void Sample(const char* name, const char* labels, double value) {
    Appendf("%s%s %.17g\n", name, labels, value);
  }
  std::string& text() { return out_; }

 private:
  template <typename... A>
  void Appendf(const char* fmt, A... a) {
    char buf[512];
    int n = snprintf(buf, sizeof(buf), fmt, a...);
    if (n > 0) out_.append(buf, std::min<size_t>(size_t(n), sizeof(buf) - 1));
  }
  std::string out_;
};

}  // namespace mcxl
