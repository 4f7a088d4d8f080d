// A real redis-server for a test: started on a free port of 127.0.0.1 (no persistence), killed
// when the object goes (or on kill()). Tests skip, with a WARN saying so, when the binary is
// missing (Debian: redis-server; scripts/install-deps.sh).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace promptcache::test {

inline std::string redis_server_binary() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// A port nothing listens on now (the kernel's choice for an ephemeral bind).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

inline bool port_accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

class RedisServer {
 public:
  RedisServer() {
    const std::string binary = redis_server_binary();
    if (binary.empty()) return;
    port_ = free_port();
    const std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);  // its start-up banner is noise here
      if (null >= 0) {
        ::dup2(null, 1);
        ::dup2(null, 2);
      }
      ::execl(binary.c_str(), binary.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1",
              "--save", "", "--appendonly", "no", "--loglevel", "warning", nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !port_accepts(port_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  ~RedisServer() { kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool running() const { return pid_ > 0 && port_accepts(port_); }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  // SIGKILL, as a crash would: no goodbye to the clients.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace promptcache::test

// In a Catch2 test: skips (WARN) when redis-server is not installed, else requires `server` to
// run.
#define REQUIRE_REDIS(server)                                                                 \
  if (promptcache::test::redis_server_binary().empty()) {                                     \
    WARN("SKIPPED: redis-server is not installed (Debian: redis-server); no Redis test ran"); \
    return;                                                                                   \
  }                                                                                           \
  REQUIRE((server).running())
