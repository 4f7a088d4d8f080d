// promptcache/pml/src_files.hpp — what a module's src="..." may read: a capability the caller
// of the schema parser hands it, never a decision made on the schema's text.
//
//   NoSrcFiles               refuses every src (schemas from strings, from a network client)
//   RootedSrcFiles(dir)      reads files inside dir only: relative paths, resolved against dir,
//                            whose real path (every symbolic link followed) lies inside dir's
//                            real path; the file is opened, checked to be a regular file, and
//                            its opened path checked again, so a link swapped in after the check
//                            cannot lead outside
//   RootedSrcFiles(dir, kAnywhere)  also absolute paths and paths leaving dir (the CLI's
//                            --allow-src-outside; `promptcache qa`, whose documents the user
//                            names one by one)
//
// The schema parser asks the resolver once per module with a src attribute, after the XML is
// parsed: the attribute's value as the parser decoded it (entities, character references) is
// what is resolved. Header-only, no LibTorch.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "promptcache/error.hpp"
#include "promptcache/pml/limits.hpp"
#include "promptcache/pml/source.hpp"

namespace promptcache::pml {

class SrcResolver {
 public:
  virtual ~SrcResolver() = default;
  // The text of the file `src` names (as written in the module at `where`). Error naming
  // `where`: kSchema when the path is refused, kIo when the file cannot be read.
  virtual std::string read(const std::string& src, const SourceLocation& where) const = 0;
};

// Refuses every src attribute with `reason` (what to do instead).
class NoSrcFiles final : public SrcResolver {
 public:
  explicit NoSrcFiles(std::string reason =
                          "this schema was given as text, so it may not read files; put the text "
                          "in the module, or load the schema from a file")
      : reason_(std::move(reason)) {}
  std::string read(const std::string& src, const SourceLocation& where) const override {
    throw Error(ErrorKind::kSchema, "module src \"" + src + "\" is not read: " + reason_, where);
  }

 private:
  std::string reason_;
};

class RootedSrcFiles final : public SrcResolver {
 public:
  enum class Scope {
    kInsideRoot,  // relative paths that stay inside the root, symbolic links included
    kAnywhere,    // any path the process can read; relative ones resolve against the root
  };
  // `root` "" is the current directory. `hint` is appended to refusals (how to allow more,
  // e.g. " (pass --allow-src-outside to read files elsewhere)").
  explicit RootedSrcFiles(std::string root, Scope scope = Scope::kInsideRoot, std::string hint = "")
      : root_(root.empty() ? std::string(".") : std::move(root)),
        scope_(scope),
        hint_(std::move(hint)) {}

  const std::string& root() const { return root_; }
  Scope scope() const { return scope_; }

  std::string read(const std::string& src, const SourceLocation& where) const override {
    namespace fs = std::filesystem;
    if (src.empty()) throw Error(ErrorKind::kSchema, "empty src attribute", where);
    if (src.find('\0') != std::string::npos) {
      throw Error(ErrorKind::kSchema, "src contains a NUL character", where);
    }
    const fs::path given(src);
    const fs::path joined = given.is_absolute() ? given : fs::path(root_) / given;
    if (scope_ == Scope::kAnywhere) {
      return read_file(joined.string(), src, where, /*inside=*/nullptr);
    }
    if (given.is_absolute()) {
      throw refused(src, "is an absolute path; src must name a file inside " + root_, where);
    }
    // Lexically first ("a/../../x" leaves the root before any file is looked at)...
    const fs::path normal = given.lexically_normal();
    if (!normal.empty() && *normal.begin() == "..") {
      throw refused(src, "leaves " + root_ + " (src must name a file inside it)", where);
    }
    // ...then by the real paths, every symbolic link followed.
    std::error_code ec;
    const fs::path real_root = fs::canonical(root_, ec);
    if (ec) {
      throw Error(ErrorKind::kIo,
                  "cannot read src file '" + src + "': its folder " + root_ +
                      " cannot be opened (" + ec.message() + ")",
                  where);
    }
    const fs::path real = fs::canonical(joined, ec);
    if (ec) {
      throw Error(ErrorKind::kIo,
                  "cannot read src file '" + src + "' (looked for " + joined.string() + ": " +
                      ec.message() + ")",
                  where);
    }
    if (!is_inside(real, real_root)) {
      throw refused(src, "leads outside " + root_ + " (to " + real.string() + ")", where);
    }
    return read_file(real.string(), src, where, &real_root);
  }

  // True when `path` is `root` or lies below it (both absolute and normal, e.g. canonical).
  static bool is_inside(const std::filesystem::path& path, const std::filesystem::path& root) {
    auto p = path.begin();
    for (auto r = root.begin(); r != root.end(); ++r, ++p) {
      if (r->empty() && std::next(r) == root.end()) break;  // a trailing "/" of the root
      if (p == path.end() || *p != *r) return false;
    }
    return true;
  }

 private:
  Error refused(const std::string& src, const std::string& why, const SourceLocation& where) const {
    return Error(ErrorKind::kSchema, "module src \"" + src + "\" " + why + hint_, where);
  }

  // Opens `path` without following a last symbolic link and without blocking on a FIFO, refuses
  // anything but a regular file, and (when `inside` is given) checks the path the kernel opened
  // against it before reading: a link swapped in after the canonical check is caught here.
  static std::string read_file(const std::string& path, const std::string& src,
                               const SourceLocation& where, const std::filesystem::path* inside) {
    const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (inside ? O_NOFOLLOW : 0);
    const int fd = ::open(path.c_str(), flags);
    if (fd < 0) {
      throw Error(ErrorKind::kIo,
                  "cannot read src file '" + src + "' (looked for " + path + ": " +
                      std::strerror(errno) + ")",
                  where);
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      throw Error(ErrorKind::kSchema,
                  "module src \"" + src + "\" is not a regular file (" + path + ")", where);
    }
    if (inside) {
      std::error_code ec;
      const auto opened = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
      if (!ec && !is_inside(opened, *inside)) {
        throw Error(
            ErrorKind::kSchema,
            "module src \"" + src + "\" leads outside its folder (to " + opened.string() + ")",
            where);
      }
    }
    if (static_cast<std::uint64_t>(st.st_size) > kMaxSourceFileBytes) {
      throw Error(ErrorKind::kInvalidArgument,
                  "src file '" + src + "' is " + std::to_string(st.st_size) +
                      " bytes, more than the " + std::to_string(kMaxSourceFileBytes >> 20) +
                      " MiB a PML input may have",
                  where);
    }
    std::string text;
    char chunk[1 << 16];
    for (;;) {
      const ssize_t got = ::read(fd, chunk, sizeof chunk);
      if (got < 0) {
        if (errno == EINTR) continue;
        throw Error(
            ErrorKind::kIo,
            "cannot read src file '" + src + "' (" + path + ": " + std::strerror(errno) + ")",
            where);
      }
      if (got == 0) break;
      if (text.size() + static_cast<std::size_t>(got) > kMaxSourceFileBytes) {
        throw Error(ErrorKind::kInvalidArgument,
                    "src file '" + src + "' grew past the " +
                        std::to_string(kMaxSourceFileBytes >> 20) + " MiB a PML input may have",
                    where);
      }
      text.append(chunk, static_cast<std::size_t>(got));
    }
    return text;
  }

  std::string root_;
  Scope scope_;
  std::string hint_;
};

}  // namespace promptcache::pml
