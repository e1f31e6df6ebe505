#include "mooncake_cxl/common/flags.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace mcxl {
namespace {
template <typename T>
std::string Text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

void FlagSet::Add(const char* name, bool* v, const char* help) {
  flags_.push_back({name, help, *v ? "true" : "false", v});
}
void FlagSet::Add(const char* name, int64_t* v, const char* help) {
  flags_.push_back({name, help, Text(*v), v});
}
void FlagSet::Add(const char* name, uint64_t* v, const char* help) {
  flags_.push_back({name, help, Text(*v), v});
}
void FlagSet::Add(const char* name, double* v, const char* help) {
  flags_.push_back({name, help, Text(*v), v});
}
void FlagSet::Add(const char* name, std::string* v, const char* help) {
  flags_.push_back({name, help, "\"" + *v + "\"", v});
}
void FlagSet::Ignore(const char* name) { ignored_.push_back(name); }

bool FlagSet::WasSet(const std::string& name) const {
  for (const auto& f : flags_)
    if (f.name == name) return f.set;
  return false;
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (auto& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

bool FlagSet::Set(Flag& f, const std::string& value, std::string* error) {
  errno = 0;
  char* end = nullptr;
  bool ok = true;
  // Parse into a temporary: a rejected value leaves the flag unchanged.
  if (auto* b = std::get_if<bool*>(&f.target)) {
    if (value == "true" || value == "1" || value == "yes") **b = true;
    else if (value == "false" || value == "0" || value == "no") **b = false;
    else ok = false;
  } else if (auto* i = std::get_if<int64_t*>(&f.target)) {
    long long v = strtoll(value.c_str(), &end, 10);
    ok = !value.empty() && *end == '\0' && errno == 0;
    if (ok) **i = v;
  } else if (auto* u = std::get_if<uint64_t*>(&f.target)) {
    unsigned long long v = strtoull(value.c_str(), &end, 10);
    ok = !value.empty() && value[0] != '-' && *end == '\0' && errno == 0;
    if (ok) **u = v;
  } else if (auto* d = std::get_if<double*>(&f.target)) {
    double v = strtod(value.c_str(), &end);
    ok = !value.empty() && *end == '\0' && errno == 0;
    if (ok) **d = v;
  } else {
    *std::get<std::string*>(f.target) = value;
  }
  if (!ok) *error = "invalid value '" + value + "' for --" + f.name;
  return ok;
}

bool FlagSet::Parse(int argc, char** argv, std::string* error, bool* help_requested) {
  *help_requested = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 && arg.rfind("-", 0) == 0 && arg.size() > 1) arg = "-" + arg;
    if (arg.rfind("--", 0) != 0) {
      *error = "unexpected argument '" + arg + "'";
      return false;
    }
    std::string body = arg.substr(2), name = body, value;
    bool has_value = false;
    size_t eq = body.find('=');
    if (eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    if (name == "help" || name == "helpfull") {
      *help_requested = true;
      continue;
    }
    bool is_ignored = false;
    for (const auto& ig : ignored_) is_ignored |= (ig == name);
    if (is_ignored) {
      ignored_seen_.push_back(name);
      if (!has_value && i + 1 < argc && argv[i + 1][0] != '-') ++i;
      continue;
    }
    Flag* f = Find(name);
    if (f == nullptr && name.rfind("no", 0) == 0 && !has_value) {
      Flag* nf = Find(name.substr(2));
      if (nf != nullptr && std::holds_alternative<bool*>(nf->target)) {
        *std::get<bool*>(nf->target) = false;
        nf->set = true;
        continue;
      }
    }
    if (f == nullptr) {
      *error = "unknown flag --" + name + " (see --help)";
      return false;
    }
    if (!has_value) {
      if (std::holds_alternative<bool*>(f->target)) {
        bool next_is_bool = i + 1 < argc && (std::string(argv[i + 1]) == "true" || std::string(argv[i + 1]) == "false");
        value = next_is_bool ? argv[++i] : "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        *error = "flag --" + name + " needs a value";
        return false;
      }
    }
    if (!Set(*f, value, error)) return false;
    f->set = true;
  }
  return true;
}

std::string FlagSet::Usage(const char* program) const {
  std::ostringstream os;
  os << "Usage: " << program << " [--flag=value ...]\n\nFlags:\n";
  for (const auto& f : flags_)
    os << "  --" << f.name << " (" << f.help << ") default: " << f.default_text << "\n";
  if (!ignored_.empty()) {
    os << "\nAccepted for Mooncake compatibility, no effect on a CXL pool:\n ";
    for (const auto& n : ignored_) os << " --" << n;
    os << "\n";
  }
  return os.str();
}

}  // namespace mcxl
