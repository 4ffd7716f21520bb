// uring_rr: the raw-liburing floor under coio's UringReactor in the
// request/response test. No coio: two threads (client, echo server), each
// with its own ring, one TCP connection over loopback, `size`-byte messages.
// Each side does what UringReactor does per message: send(2) at once, then
// one recv SQE, submitted with the wait for its completion (one
// io_uring_enter). --multishot 1 instead keeps one multishot recv armed over
// a provided-buffer ring (Linux 6.0), the known alternative to measure.
//
//   uring_rr [--taskrun immediate|cooperative|deferred] [--multishot 0|1]
//            [--size BYTES] [--seconds S]
//
// Prints `uring_rr taskrun=... multishot=... round_trips_per_s=N` (the last
// field as net_bench's). Pin it like net_bench (taskset) to compare.
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct Settings {
  std::string taskRun = "deferred";  // as UringReactor's default
  bool multishot = false;
  std::size_t size = 64;
  double seconds = 3;
};

[[noreturn]] void die(const char* what, int err) {
  std::fprintf(stderr, "uring_rr: %s: %s\n", what, std::strerror(err));
  std::exit(1);
}

// One side's ring and, with --multishot, its provided buffers.
class Side {
 public:
  Side(const Settings& s) : settings_(s), buffer_(std::max<std::size_t>(s.size, 4096)) {
    io_uring_params p{};
    if (s.taskRun == "cooperative") p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    if (s.taskRun == "deferred") p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    if (const int r = io_uring_queue_init_params(64, &ring_, &p); r < 0) die("io_uring_queue_init_params", -r);
    if (s.multishot) setUpBufferRing();
  }
  ~Side() {
    if (bufferRing_) munmap(bufferRing_, kBuffers * sizeof(io_uring_buf));
    io_uring_queue_exit(&ring_);
  }
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  // Receives exactly `want` bytes; false at EOF or on an error.
  bool receive(int fd, std::size_t want) {
    for (std::size_t got = 0; got < want;) {
      if (!settings_.multishot || !armed_) prepareRecv(fd);
      if (const int r = io_uring_submit_and_wait(&ring_, 1); r < 0 && r != -EINTR) die("io_uring_submit_and_wait", -r);
      io_uring_cqe* cqe = nullptr;
      if (io_uring_peek_cqe(&ring_, &cqe) != 0) continue;
      const int res = cqe->res;
      const unsigned flags = cqe->flags;
      io_uring_cqe_seen(&ring_, cqe);
      if (settings_.multishot && !(flags & IORING_CQE_F_MORE)) armed_ = false;
      if (res == -ENOBUFS) continue;  // multishot ran out of buffers: re-armed above
      if (res <= 0) return false;
      if (settings_.multishot) recycle(flags >> IORING_CQE_BUFFER_SHIFT, static_cast<std::size_t>(res));
      got += static_cast<std::size_t>(res);
    }
    return true;
  }

 private:
  static constexpr unsigned kBuffers = 64;
  static constexpr std::size_t kBufferSize = 4096;
  static constexpr int kGroup = 1;

  void prepareRecv(int fd) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!settings_.multishot) {
      io_uring_prep_recv(sqe, fd, buffer_.data(), buffer_.size(), 0);
      return;
    }
    io_uring_prep_recv_multishot(sqe, fd, nullptr, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = kGroup;
    armed_ = true;
  }

  void setUpBufferRing() {
    void* mem = mmap(nullptr, kBuffers * sizeof(io_uring_buf), PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (mem == MAP_FAILED) die("mmap", errno);
    bufferRing_ = static_cast<io_uring_buf_ring*>(mem);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<std::uintptr_t>(bufferRing_);
    reg.ring_entries = kBuffers;
    reg.bgid = kGroup;
    if (const int r = io_uring_register_buf_ring(&ring_, &reg, 0); r < 0) die("io_uring_register_buf_ring", -r);
    io_uring_buf_ring_init(bufferRing_);
    provided_.resize(kBuffers * kBufferSize);
    for (unsigned i = 0; i < kBuffers; ++i) add(i, static_cast<int>(i));
    io_uring_buf_ring_advance(bufferRing_, static_cast<int>(kBuffers));
  }

  void add(unsigned id, int offset) {
    io_uring_buf_ring_add(bufferRing_, provided_.data() + id * kBufferSize, kBufferSize, static_cast<unsigned short>(id),
                          io_uring_buf_ring_mask(kBuffers), offset);
  }

  // Copies the data out, as a stream API over provided buffers must, and
  // gives the buffer back.
  void recycle(unsigned id, std::size_t length) {
    std::memcpy(buffer_.data(), provided_.data() + id * kBufferSize, std::min(length, buffer_.size()));
    add(id, 0);
    io_uring_buf_ring_advance(bufferRing_, 1);
  }

  const Settings& settings_;
  io_uring ring_{};
  std::vector<char> buffer_;
  io_uring_buf_ring* bufferRing_ = nullptr;
  std::vector<char> provided_;
  bool armed_ = false;
};

bool sendAll(int fd, const std::vector<char>& message) {
  for (std::size_t sent = 0; sent < message.size();) {
    const ssize_t n = ::send(fd, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

[[noreturn]] void usage() {
  std::fputs("usage: uring_rr [--taskrun immediate|cooperative|deferred] [--multishot 0|1] [--size B] [--seconds S]\n",
             stderr);
  std::exit(2);
}

Settings parse(int argc, char** argv) {
  Settings s;
  if (argc % 2 == 0) usage();  // an option without its value
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--taskrun" && (value == "immediate" || value == "cooperative" || value == "deferred")) {
      s.taskRun = value;
    } else if (key == "--multishot" && (value == "0" || value == "1")) {
      s.multishot = value == "1";
    } else if (key == "--size" && std::atoll(value.c_str()) > 0) {
      s.size = static_cast<std::size_t>(std::atoll(value.c_str()));
    } else if (key == "--seconds" && std::atof(value.c_str()) > 0) {
      s.seconds = std::atof(value.c_str());
    } else {
      usage();
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse(argc, argv);
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    die("listen", errno);
  }
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (client < 0 || ::connect(client, reinterpret_cast<sockaddr*>(&address), length) != 0) die("connect", errno);
  const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (server < 0) die("accept", errno);
  const int one = 1;
  for (int fd : {client, server}) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  const std::vector<char> message(settings.size, 'x');
  std::thread echo([&] {
    Side side(settings);
    while (side.receive(server, settings.size) && sendAll(server, message)) {
    }
  });
  Side side(settings);
  long roundTrips = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration<double>(settings.seconds);
  while (std::chrono::steady_clock::now() < end && sendAll(client, message) && side.receive(client, settings.size)) {
    ++roundTrips;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::shutdown(client, SHUT_RDWR);  // the echo side sees EOF and ends
  echo.join();
  for (int fd : {client, server, listener}) ::close(fd);
  std::printf("uring_rr taskrun=%s multishot=%d size=%zu round_trips_per_s=%.0f\n", settings.taskRun.c_str(),
              settings.multishot ? 1 : 0, settings.size, static_cast<double>(roundTrips) / elapsed);
  return 0;
}
