// promptcache/atomic_file.hpp — publishing a file so that readers see the old one or the new
// one, never a part of either.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace promptcache {

// Hands bytes to the file being written; Error(kIo) naming the file when they cannot be written
// (a full disk, a file size limit).
using FileSink = std::function<void(const void* data, std::size_t size)>;

// Writes `path` through a temporary file beside it: created with O_EXCL under a name no other
// writer uses (".<name>.tmp-<pid>-<thread>-<counter>-<random>"), filled by `fill`, flushed to
// disk (fsync), then renamed over `path` and the folder flushed. When anything fails (the
// folder, `fill` throwing, a full disk, fsync, rename) the temporary file is removed, `path` is
// left as it was (the old file, byte for byte, or none) and the error goes to the caller:
// Error(kIo) naming `path` for the file system's failures, `fill`'s own exceptions as they are.
void write_file_atomically(const std::string& path,
                           const std::function<void(const FileSink&)>& fill);

}  // namespace promptcache
