#include "promptcache/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "promptcache/error.hpp"

namespace promptcache {
namespace {

[[noreturn]] void io_error(const std::string& what, const std::string& path, int err) {
  throw Error(ErrorKind::kIo, what + ": " + std::strerror(err), SourceLocation{path, 0, 0, {}});
}

// A name no other writer (another process, another thread of this one, an earlier call of this
// thread) picks: pid, thread, a process-wide counter and random bits.
std::string temp_name(const std::filesystem::path& target) {
  static std::atomic<unsigned long long> counter{0};
  thread_local std::mt19937_64 random{std::random_device{}() ^
                                      std::hash<std::thread::id>{}(std::this_thread::get_id())};
  char suffix[96];
  std::snprintf(suffix, sizeof suffix, ".tmp-%ld-%zx-%llu-%016llx", static_cast<long>(::getpid()),
                std::hash<std::thread::id>{}(std::this_thread::get_id()), ++counter,
                static_cast<unsigned long long>(random()));
  return (target.parent_path() / ("." + target.filename().string() + suffix)).string();
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace

void write_file_atomically(const std::string& path,
                           const std::function<void(const FileSink&)>& fill) {
  const std::filesystem::path target(path);
  if (target.filename().empty()) {
    throw Error(ErrorKind::kIo, "not a file name", SourceLocation{path, 0, 0, {}});
  }
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = temp_name(target);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt == 8)) {
      io_error("cannot create a temporary file beside it", path, errno);
    }
  }
  Fd file(fd);
  try {
    const FileSink sink = [&](const void* data, std::size_t size) {
      const char* p = static_cast<const char*>(data);
      while (size > 0) {
        const ssize_t n = ::write(file.get(), p, size);
        if (n < 0 && errno == EINTR) continue;
        // A full disk, a file size limit (EFBIG: SIGXFSZ ignored), an I/O error.
        if (n <= 0) io_error("cannot write", path, n < 0 ? errno : ENOSPC);
        p += n;
        size -= static_cast<std::size_t>(n);
      }
    };
    fill(sink);
    // On disk before it is renamed: a crash after the rename finds the new bytes, not a hole.
    if (::fsync(file.get()) != 0) io_error("cannot flush to disk", path, errno);
    if (file.close() != 0) io_error("cannot write", path, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_error("cannot move into place", path, errno);
  } catch (...) {
    file.close();
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename itself on disk (best effort: some file systems refuse to sync a folder).
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  Fd folder(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (folder.get() >= 0) (void)::fsync(folder.get());
}

}  // namespace promptcache
