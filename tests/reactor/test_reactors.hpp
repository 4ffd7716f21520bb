#pragma once
// The reactors every parameterised reactor/net test runs on, and helpers
// shared by those tests.
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#if COIO_TEST_URING
#include <coio/reactor/uring_reactor.hpp>
#endif

#include <catch2/catch.hpp>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cstddef>
#include <tuple>

namespace coio::testing {

#if COIO_TEST_URING
using TestReactors = std::tuple<EpollReactor, UringReactor>;

/// UringReactors with a fixed recv mode (the default, adaptive, switches
/// per socket): the TCP tests run on both besides the default.
template <RecvMode Mode>
class FixedRecvUringReactor : public UringReactor {
 public:
  FixedRecvUringReactor() : UringReactor(Options{.recvMode = Mode}) {}
};
using PlainUringReactor = FixedRecvUringReactor<RecvMode::plain>;
using MultishotUringReactor = FixedRecvUringReactor<RecvMode::multishot>;
using TcpTestReactors = std::tuple<EpollReactor, UringReactor, PlainUringReactor, MultishotUringReactor>;
#else
using TestReactors = std::tuple<EpollReactor>;
using TcpTestReactors = TestReactors;
#endif

/// Open file descriptors of this process (entries of /proc/self/fd).
inline std::size_t openFdCount() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    --n;  // the directory stream's own fd
  }
  return n;
}

/// A connected pair of non-blocking Unix stream sockets.
struct SocketPair {
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
  FileDescriptor a, b;
};

/// Lifts the soft fd limit to the hard one (tests open thousands of sockets).
inline void raiseFdLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace coio::testing
