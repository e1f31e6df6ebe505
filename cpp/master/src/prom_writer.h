// PromWriter: Prometheus text exposition (HELP, TYPE, samples) for the
// master's /metrics page (master_http.cc) and the tier's part of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mcxl {

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
