// Uses coio through whichever route provided it: a Task that awaits a Baton
// posted from another thread, run to completion with blockingWait.
#include <coio/coio.hpp>

#include <cstdio>
#include <thread>

namespace {

coio::Task<int> answerWhenPosted(const coio::Baton& posted) {
  co_await posted;
  co_return 42;
}

}  // namespace

int main() {
  coio::Baton posted;
  std::thread poster([&] { posted.post(); });
  const int answer = coio::blockingWait(answerWhenPosted(posted));
  poster.join();
  if (answer != 42) {
    std::fprintf(stderr, "coio_consumer: expected 42, got %d\n", answer);
    return 1;
  }
  std::puts("coio_consumer: ok");
  return 0;
}
