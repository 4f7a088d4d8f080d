// Engine::BufferLease: a KV buffer of the engine's pool held by one request (engine.cpp, "The KV
// buffer pool"); shared by the units that define Engine's request functions (engine.cpp,
// scoring.cpp).
#pragma once

#include <memory>

#include "promptcache/engine.hpp"

namespace promptcache {

// Gives the buffer back to the pool when the request ends, emptied if the request did not finish
// (an exception may leave it half-written).
class Engine::BufferLease {
 public:
  BufferLease(Engine& engine, std::unique_ptr<PooledBuffer> buffer, bool batch)
      : engine_(engine), buffer_(std::move(buffer)), batch_(batch) {}
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { engine_.give_back(std::move(buffer_), batch_, finished_); }
  PooledBuffer& operator*() const { return *buffer_; }
  PooledBuffer* operator->() const { return buffer_.get(); }
  void finished() { finished_ = true; }

 private:
  Engine& engine_;
  std::unique_ptr<PooledBuffer> buffer_;
  bool batch_ = false;
  bool finished_ = false;
};

}  // namespace promptcache
