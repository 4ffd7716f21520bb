#pragma once
// What the storage end-to-end suites share: a dataset in a temporary
// directory, and a storage server in a forked child process that the test
// kills (or stops) at will.
#include "store/chunk_store.hpp"
#include "server/storage_server.hpp"
#if COIO_E2E_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/net/tcp_listener.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

namespace storage::testing {

/// A reactor kind and a transport: what a suite's cases are instantiated for.
template <typename Reactor, bool Rdma>
struct Setup {
  using R = Reactor;
  static constexpr bool rdma = Rdma;
};
/// Both reactors, over TCP, or over RDMA in a suite built with COIO_E2E_RDMA.
#if COIO_E2E_RDMA
using Setups = std::tuple<Setup<coio::EpollReactor, true>, Setup<coio::UringReactor, true>>;
#else
using Setups = std::tuple<Setup<coio::EpollReactor, false>, Setup<coio::UringReactor, false>>;
#endif

/// Flips the bits of `mask` in the byte at `offset` of `file`: a disk that
/// corrupted a replica.
inline void flipBits(const std::filesystem::path& file, std::uint64_t offset, std::byte mask) {
  const int fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::byte b{};
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b ^= mask;
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

/// A chunk store in a fresh temporary directory, removed at the end.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(storage::ChunkStoreLayout layout) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coio-storage-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
    REQUIRE(storage::createChunkStore(path, layout));
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

#if COIO_E2E_RDMA
/// The RDMA device the suite uses ($COIO_RDMA_DEVICE, else the first).
inline std::string rdmaDeviceName() {
  const char* name = std::getenv("COIO_RDMA_DEVICE");
  return name ? name : "";
}
#endif

/// In a forked child, with its own reactor (and RDMA device): serves
/// `targets` with `options` on 127.0.0.1:`port` (0: any) over TCP, or RDMA
/// if `rdma`, with the chain versions of `routing` (if given), writes the
/// port it bound to `ready`, then serves until killed. Never returns; no
/// Catch2 here (exit codes say where it failed).
template <typename R>
[[noreturn]] void serveInChild(const std::vector<storage::TargetSpec>& targets, storage::ServerOptions options,
                               std::uint16_t port, bool rdma, const storage::ChainTable* routing, int ready,
                               pid_t parent) {
  // Dies with the test, however the test ends (a timeout's SIGTERM included).
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(1);
#if COIO_E2E_RDMA
  auto device = coio::rdma::Device::open({.name = rdmaDeviceName()});
  if (rdma && !device) ::_exit(2);
#else
  if (rdma) ::_exit(2);
#endif
  R reactor;
  auto server = storage::StorageServer<R>::open(reactor, targets, options);
  if (!server) ::_exit(3);
  if (routing != nullptr) (*server)->updateRouting(*routing);
#if COIO_E2E_RDMA
  if (rdma) {
    auto transport = storage::RdmaTransport<R>::create(reactor, **device, (*server)->bufferMemory(), 256);
    if (!transport) ::_exit(4);
    (*server)->useTransport(std::move(*transport));
  }
#endif
  auto listener = coio::TcpListener<R>::bind(reactor, coio::SocketAddress::loopbackV4(port));
  if (!listener) ::_exit(5);
  (*server)->serve(*listener);
  const std::uint16_t bound = listener->localAddress()->port();
  if (::write(ready, &bound, sizeof bound) != sizeof bound) ::_exit(6);
  reactor.runUntil([](R& r) -> coio::Task<void> {
    for (;;) co_await r.sleepFor(std::chrono::hours(1));  // serving, until SIGKILL
  }(reactor));
  ::_exit(7);
}

/// A server process (serveInChild), SIGKILLed and reaped at the latest
/// when this is destroyed.
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { kill(); }

  /// Starts it (with `routing`'s chain versions, if given) and waits
  /// (blocking, up to 10 s) until it listens; the test fails if it does not.
  template <typename R>
  void start(const std::vector<storage::TargetSpec>& targets, storage::ServerOptions options, std::uint16_t port,
             bool rdma, const storage::ChainTable* routing = nullptr) {
    REQUIRE(pid_ == 0);
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    const pid_t parent = ::getpid();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(fds[0]);
      serveInChild<R>(targets, options, port, rdma, routing, fds[1], parent);
    }
    ::close(fds[1]);
    pollfd ready{fds[0], POLLIN, 0};
    const bool listening = ::poll(&ready, 1, 10000) == 1 && ::read(fds[0], &port_, sizeof port_) == sizeof port_;
    ::close(fds[0]);
    pid_ = child;
    if (!listening) {
      const int status = kill();
      INFO("the server process ended with exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
      REQUIRE(listening);
    }
  }
  /// SIGKILL, then reaps it (nothing if not running); its wait status.
  int kill() {
    if (pid_ == 0) return 0;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
    return status;
  }
  void signal(int number) const {
    REQUIRE(pid_ != 0);
    REQUIRE(::kill(pid_, number) == 0);
  }
  std::uint16_t port() const noexcept { return port_; }
  bool running() const noexcept { return pid_ != 0; }

 private:
  pid_t pid_ = 0;
  std::uint16_t port_ = 0;
};

}  // namespace storage::testing
