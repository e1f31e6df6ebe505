// ShmDir: a fresh directory under /dev/shm for one test's pool files,
// removed with everything in it when the object goes.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cctype>

#include <filesystem>
#include <string>

namespace mcxl {
namespace testutil {

class ShmDir {
 public:
  // `tag` names the directory (/dev/shm/mcxl_<tag>.XXXXXX, other than
  // letters and digits as '_'), so that a leftover tells who left it.
  explicit ShmDir(std::string tag) {
    for (char& ch : tag)
      if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';  // a suite name may hold '/'
    std::string tmpl = "/dev/shm/mcxl_" + tag + ".XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl;
      return;
    }
    path_ = tmpl;
  }
  ~ShmDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ShmDir(const ShmDir&) = delete;
  ShmDir& operator=(const ShmDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace testutil
}  // namespace mcxl
