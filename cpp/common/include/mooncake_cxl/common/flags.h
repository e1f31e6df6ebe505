// FlagSet: command-line flags written the way gflags writes them, so that
// mooncake_master command lines work unchanged: --name=value, --name value,
// --bool, --bool=true|false, --nobool; --help lists every flag.
//
// Contract: Parse returns false with a message on an unknown flag or a value
// of the wrong type. Flags registered with Ignore() are accepted and reported
// (Mooncake flags that have no meaning on a CXL pool).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace mcxl {

class FlagSet {
 public:
  void Add(const char* name, bool* v, const char* help);
  void Add(const char* name, int64_t* v, const char* help);
  void Add(const char* name, uint64_t* v, const char* help);
  void Add(const char* name, double* v, const char* help);
  void Add(const char* name, std::string* v, const char* help);
  void Ignore(const char* name);

  // False on error (message in *error). *help_requested when --help was seen.
  bool Parse(int argc, char** argv, std::string* error, bool* help_requested);
  std::string Usage(const char* program) const;
  const std::vector<std::string>& ignored_seen() const { return ignored_seen_; }
  // True when the command line gave flag `name` (a deliberate choice, even
  // if equal to the default).
  bool WasSet(const std::string& name) const;

 private:
  using Target = std::variant<bool*, int64_t*, uint64_t*, double*, std::string*>;
  struct Flag {
    std::string name, help, default_text;
    Target target;
    bool set = false;
  };
  Flag* Find(const std::string& name);
  static bool Set(Flag& f, const std::string& value, std::string* error);

  std::vector<Flag> flags_;
  std::vector<std::string> ignored_, ignored_seen_;
};

}  // namespace mcxl
