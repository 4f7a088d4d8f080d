// Shared helpers for the test suites: temporary folders, tiny random models, fixture paths.
#pragma once

#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

namespace promptcache::test {

// A folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "promptcache") {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            (tag + "-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Defined in tests/catch_main.cpp, the one unit compiled with the checkout's absolute paths.
const char* source_dir_path();
const char* shared_dir_path();
inline std::string shared_dir() {
  return shared_dir_path();
}
inline std::string source_dir() {
  return source_dir_path();
}
// The trained stories260K model that ships in the repository (models/stories260K, MIT).
inline std::string stories260k_dir() {
  return source_dir() + "/models/stories260K";
}
// stories260k_dir(), once its files are there. They ship with the repository, so a missing one
// is a broken checkout: std::runtime_error naming it (the test fails), never a skip.
inline std::string checked_stories260k_dir() {
  const std::string dir = stories260k_dir();
  for (const char* file :
       {"config.json", "model.safetensors", "tokenizer.model", "reference.json"}) {
    if (!std::filesystem::exists(dir + "/" + file)) {
      throw std::runtime_error(dir + "/" + file +
                               " is missing; stories260K ships with the repository (restore it: "
                               "git checkout -- models/stories260K)");
    }
  }
  return dir;
}

}  // namespace promptcache::test
