// The API reference's examples that need io_uring (coio::uring): see
// api_examples.cpp.
#include <coio/uring.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstddef>
#include <span>
#include <string>

namespace uring_reactor_example {

//! [UringReactor]
// The reactor's operations take any socket: here the two ends of a socket pair.
coio::Task<std::string> pingThrough(coio::UringReactor& reactor, int a, int b) {
  // send() tries a non-blocking send(2) first: an SQE only if the socket is full.
  coio::Result<std::size_t> sent = co_await reactor.send(a, std::as_bytes(std::span("ping", 4)));
  char got[16];
  // recv() resumes on the loop thread once data is there.
  coio::Result<std::size_t> n = co_await reactor.recv(b, std::as_writable_bytes(std::span(got)));
  co_return sent && n ? std::string(got, *n) : "failed";
}

std::string pingOverUring() {
  std::string why;
  if (!coio::UringReactor::probe(&why)) return why;  // io_uring is not usable here, and why
  coio::UringReactor reactor;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return "no socket pair";
  std::string reply = reactor.runUntil(pingThrough(reactor, fds[0], fds[1]));  // "ping"
  for (int fd : fds) {
    reactor.forget(fd);  // the reactor may keep a receiver per socket: forget it before closing
    ::close(fd);
  }
  return reply;
}
//! [UringReactor]

}  // namespace uring_reactor_example

TEST_CASE("api example: UringReactor", "[api-example]") { CHECK(uring_reactor_example::pingOverUring() == "ping"); }

namespace read_batch_example {

//! [ReadBatch]
// Writes a file, then reads three pieces of it back with one submission.
coio::Task<std::string> readPieces(coio::UringReactor& reactor, const std::string& path) {
  coio::Disk disk(reactor);  // the ring file I/O goes through; outlives the File
  coio::Result<coio::File> file = coio::File::open(disk, path.c_str(), {.write = true, .create = true, .truncate = true});
  if (!file) co_return file.error().message();
  const std::string text = "io_uring reads in batches";
  // One io_uring write; resumes on the loop thread with the bytes written.
  coio::Result<std::size_t> written = co_await file->write(0, std::as_bytes(std::span(text)));
  if (!written) co_return written.error().message();

  char first[8], second[5], last[7];
  coio::ReadBatch batch(disk);
  batch.add(*file, 0, std::as_writable_bytes(std::span(first)));
  batch.add(*file, 9, std::as_writable_bytes(std::span(second)));
  batch.add(*file, 18, std::as_writable_bytes(std::span(last)));
  co_await batch;  // one io_uring_enter; resumes once all three reads are done
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!batch.result(i)) co_return batch.result(i).error().message();  // each read has its own result
  }
  file->close();
  co_return std::string(first, 8) + "|" + std::string(second, 5) + "|" + std::string(last, 7);
  // "io_uring|reads|batches"
}
//! [ReadBatch]

}  // namespace read_batch_example

TEST_CASE("api example: File and ReadBatch", "[api-example]") {
  const std::string path = "coio_api_example_" + std::to_string(::getpid()) + ".bin";
  coio::UringReactor reactor;
  CHECK(reactor.runUntil(read_batch_example::readPieces(reactor, path)) == "io_uring|reads|batches");
  ::unlink(path.c_str());
}
