// Uses coio through whichever route provided it: a Task that awaits a Baton
// posted from another thread, run with blockingWait; a timer on an
// EpollReactor; and, when built with the uring component
// (COIO_CONSUMER_URING), a disk read through coio::Disk on that reactor.
// Found as a package, its version must be the headers' COIO_VERSION.
#ifdef COIO_CONSUMER_URING
#include <coio/uring.hpp>
#else
#include <coio/coio.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>
#include <vector>

#ifdef COIO_CONSUMER_PACKAGE_VERSION
static_assert(std::string_view(COIO_VERSION) == COIO_CONSUMER_PACKAGE_VERSION,
              "the package's version differs from the headers' COIO_VERSION");
#endif

namespace {

coio::Task<int> answerWhenPosted(const coio::Baton& posted) {
  co_await posted;
  co_return 42;
}

coio::Task<bool> sleepOnReactor(coio::EpollReactor& reactor) {
  const auto start = std::chrono::steady_clock::now();
  co_await reactor.sleepFor(std::chrono::milliseconds(5));
  co_return std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(5) && reactor.isInLoopThread();
}

#ifdef COIO_CONSUMER_URING
// Reads this program's own first bytes: an ELF file starts with 0x7f 'E' 'L' 'F'.
coio::Task<bool> readOwnElfHeader(coio::Disk& disk) {
  coio::Result<coio::File> file = coio::File::open(disk, "/proc/self/exe");
  if (!file) co_return false;
  std::vector<std::byte> head(4);
  coio::Result<std::size_t> n = co_await file->read(0, head);
  co_return n && *n == 4 && head[0] == std::byte{0x7f} && head[1] == std::byte{'E'} && head[2] == std::byte{'L'} &&
      head[3] == std::byte{'F'};
}
#endif

int fail(const char* what) {
  std::fprintf(stderr, "coio_consumer: %s failed\n", what);
  return 1;
}

}  // namespace

int main() {
  coio::Baton posted;
  std::thread poster([&] { posted.post(); });
  const int answer = coio::blockingWait(answerWhenPosted(posted));
  poster.join();
  if (answer != 42) return fail("Task + Baton");

  coio::EpollReactor reactor;
  if (!reactor.runUntil(sleepOnReactor(reactor))) return fail("reactor timer");
#ifdef COIO_CONSUMER_URING
  coio::Disk disk(reactor);
  if (!reactor.runUntil(readOwnElfHeader(disk))) return fail("disk read");
  std::puts("coio_consumer: coio " COIO_VERSION " ok (Task, Baton, reactor, disk read)");
#else
  std::puts("coio_consumer: coio " COIO_VERSION " ok (Task, Baton, reactor)");
#endif
  return 0;
}
