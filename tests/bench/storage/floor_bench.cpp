// floor_bench: the floor under coio's storage read server over TCP, with no
// coio in the data path (only its I/O-priority helper): what any server that
// reads the dataset from the disk and sends it over loopback TCP spends here.
// One process, two threads, each with its own io_uring ring:
//   server  reads each requested IO from the dataset's data files in
//           --piece-size reads and sends each piece as soon as it is read
//           (an 8-byte header, then its bytes) on the IO's connection;
//   client  keeps --outstanding IOs of --io-size in flight over --connections
//           loopback connections, at random offsets that are multiples of the
//           IO size (fio's blockalign), receives each piece into the IO's
//           buffer and reissues the IO as soon as its last piece arrived.
// --send copy    O_DIRECT reads into huge-page buffers; one sendmsg per
//                connection copies every piece read meanwhile into the socket
//                (what coio's server does). With --apart 1 (the default) the
//                pieces of an IO alternate between two I/O priorities, so the
//                block layer keeps them apart, one request each, as coio's
//                server does (ReadBatch::keepApart; the same helper).
// --send splice  buffered reads spliced file -> pipe (IORING_OP_SPLICE, run by
//                io-wq workers), then pipe -> socket: the socket references
//                the page cache's pages and only the client copies. Readahead
//                is off (POSIX_FADV_RANDOM). An IO's range is evicted
//                (POSIX_FADV_DONTNEED) when its slot's next request arrives:
//                the client has received it by then, and a page the socket
//                still references is skipped, never freed under it. The files
//                are evicted at the start, so the data comes off the disk
//                (check with the disk's read counters).
//
//   floor_bench --dir D [--send copy|splice] [--io-size 512K] [--outstanding 32]
//               [--connections 2] [--piece-size 128K] [--apart 0|1] [--seconds 3]
//               [--tcp-congestion NAME]
//
// Prints one JSON line: gib_per_s, iops, bytes, seconds, and server_cpu,
// client_cpu, cpu_per_gib in core-seconds over the measured interval
// (server_cpu is the process's less the client thread's: the server thread,
// its io-wq workers and the idle main thread).
// One file, though long: its server, client and measuring are written
// without coio on purpose, so they share no header with the example's and
// have no other user.
#include <coio/disk/detail/io_priority.hpp>

#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct Settings {
  std::string dir;
  bool splice = false;
  std::size_t ioSize = 512 << 10;
  std::size_t pieceSize = 128 << 10;
  unsigned outstanding = 32;
  unsigned connections = 2;
  double seconds = 3;
  std::string congestion;
  bool apart = true;

  std::size_t piecesPerIo() const { return (ioSize + pieceSize - 1) / pieceSize; }
  std::size_t pieceLength(std::size_t offset) const { return std::min(pieceSize, ioSize - offset); }
};

struct Request {  // client -> server
  std::uint32_t slot;
  std::uint32_t file;
  std::uint64_t offset;
};
struct PieceHeader {  // server -> client, then the piece's bytes
  std::uint32_t slot;
  std::uint32_t offset;  // in the IO
};

[[noreturn]] void die(const char* what, int err) {
  std::fprintf(stderr, "floor_bench: %s: %s\n", what, std::strerror(err));
  std::exit(1);
}

std::byte* hugePageBuffer(std::size_t bytes) {
  constexpr std::size_t huge = 2 << 20;
  bytes = (bytes + huge - 1) / huge * huge;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap", errno);
  madvise(p, bytes, MADV_HUGEPAGE);  // as coio's BufferPool (and fio, run by the script)
  std::memset(p, 0, bytes);           // faulted in now, not in the measured interval
  return static_cast<std::byte*>(p);
}

// Ring operations are told apart by the top byte of their user data.
enum class Op : std::uint64_t { recv, read, send, poll };
std::uint64_t tag(Op op, std::size_t index) { return static_cast<std::uint64_t>(op) << 56 | index; }
Op opOf(std::uint64_t data) { return static_cast<Op>(data >> 56); }
std::size_t indexOf(std::uint64_t data) { return data & ((std::uint64_t{1} << 56) - 1); }

class Ring {
 public:
  explicit Ring(unsigned entries) {
    io_uring_params p{};
    // As UringReactor's default; the thread that calls start() is the ring's one submitter.
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED;
    if (const int r = io_uring_queue_init_params(entries, &ring_, &p); r < 0) die("io_uring_queue_init_params", -r);
  }
  ~Ring() { io_uring_queue_exit(&ring_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  void start() {
    // liburing 2.3 declares io_uring_enable_rings but does not export it.
    if (syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) != 0) {
      die("IORING_REGISTER_ENABLE_RINGS", errno);
    }
  }
  io_uring_sqe* sqe(Op op, std::size_t index) {
    io_uring_sqe* s = io_uring_get_sqe(&ring_);
    if (!s) {
      io_uring_submit(&ring_);
      s = io_uring_get_sqe(&ring_);
    }
    io_uring_sqe_set_data64(s, tag(op, index));
    return s;
  }
  // Submits what is queued, waits for one completion, calls f(user data, res) for each.
  template <typename F>
  void reap(F&& f) {
    if (const int r = io_uring_submit_and_wait(&ring_, 1); r < 0 && r != -EINTR) die("io_uring_submit_and_wait", -r);
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      f(cqe->user_data, cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring_, seen);
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_;
};

class Server {
 public:
  Server(const Settings& s, const std::vector<int>& files, const std::vector<int>& sockets)
      : s_(s), files_(files), ring_(1024), headers_(s.outstanding * s.piecesPerIo()) {
    for (int fd : sockets) connections_.emplace_back().fd = fd;
    if (s.splice) {
      pipes_.resize(headers_.size());
      left_.resize(headers_.size());
      lastRange_.resize(s.outstanding);
      for (Pipe& p : pipes_) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) die("pipe2", errno);
        p = {fds[0], fds[1]};
        // The header's page and the piece's pages.
        if (fcntl(p.in, F_SETPIPE_SZ, static_cast<int>(s.pieceSize + 4096)) < 0) die("F_SETPIPE_SZ", errno);
      }
    } else {
      buffer_ = hugePageBuffer(s.outstanding * s.ioSize);
    }
  }
  ~Server() {
    for (const Pipe& p : pipes_) close(p.in), close(p.out);
  }

  void run() {
    ring_.start();
    if (s_.splice) {
      // Every piece's file -> pipe splice may block in the disk at once.
      unsigned workers[2] = {static_cast<unsigned>(pipes_.size()), static_cast<unsigned>(pipes_.size())};
      if (const int r = io_uring_register_iowq_max_workers(ring_.get(), workers); r < 0) die("iowq_max_workers", -r);
    }
    for (std::size_t c = 0; c < connections_.size(); ++c) receive(c);
    std::size_t open = connections_.size();
    while (open > 0) {
      ring_.reap([&](std::uint64_t data, int res) {
        const std::size_t i = indexOf(data);
        switch (opOf(data)) {
          case Op::recv:
            if (res == 0) {
              --open;
            } else if (res == -EAGAIN) {
              receive(i);
            } else if (res < 0) {
              die("server recv", -res);
            } else {
              requests(i, static_cast<std::size_t>(res));
            }
            break;
          case Op::read: {
            const std::size_t length = s_.pieceLength(headers_[i].offset);
            if (res < 0) die("server read", -res);
            if (static_cast<std::size_t>(res) != length) die("server read: short", EIO);
            connections_[headers_[i].slot % connections_.size()].ready.push_back(i);
            break;
          }
          case Op::send:
            if (res < 0) die("server sendmsg", -res);
            sent(connections_[i], static_cast<std::size_t>(res));
            break;
          case Op::poll:
            if (res < 0) die("server poll", -res);
            connections_[i].sending = false;
            break;
        }
      });
      for (std::size_t c = 0; c < connections_.size(); ++c) flush(c);
    }
  }

 private:
  struct Connection {
    int fd = -1;
    std::vector<std::byte> in = std::vector<std::byte>(64 * sizeof(Request));
    std::size_t have = 0;          // bytes of a partial request at the front of `in`
    std::deque<std::size_t> ready;  // pieces read, not yet handed to the socket
    bool sending = false;           // copy: a sendmsg in flight; splice: waiting for POLLOUT
    std::vector<iovec> iov;
    std::size_t iovDone = 0;
    msghdr msg{};
  };
  struct Pipe {
    int out, in;  // read end, write end
  };
  struct Range {
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    bool valid = false;
  };

  void receive(std::size_t c) {
    Connection& conn = connections_[c];
    io_uring_prep_recv(ring_.sqe(Op::recv, c), conn.fd, conn.in.data() + conn.have, conn.in.size() - conn.have, 0);
  }

  void requests(std::size_t c, std::size_t received) {
    Connection& conn = connections_[c];
    conn.have += received;
    const std::size_t whole = conn.have / sizeof(Request);
    for (std::size_t r = 0; r < whole; ++r) {
      Request req;
      std::memcpy(&req, conn.in.data() + r * sizeof req, sizeof req);
      read(req);
    }
    conn.have -= whole * sizeof(Request);
    std::memmove(conn.in.data(), conn.in.data() + whole * sizeof(Request), conn.have);
    receive(c);
  }

  void read(const Request& req) {
    const int file = files_.at(req.file);
    if (s_.splice) {
      Range& last = lastRange_.at(req.slot);
      if (last.valid) posix_fadvise(files_[last.file], static_cast<off_t>(last.offset), static_cast<off_t>(s_.ioSize), POSIX_FADV_DONTNEED);
      last = {req.file, req.offset, true};
    }
    for (std::size_t k = 0; k < s_.piecesPerIo(); ++k) {
      const std::size_t piece = req.slot * s_.piecesPerIo() + k, at = k * s_.pieceSize, length = s_.pieceLength(at);
      headers_.at(piece) = {req.slot, static_cast<std::uint32_t>(at)};
      io_uring_sqe* sqe = ring_.sqe(Op::read, piece);
      if (s_.splice) {
        // The header goes into the pipe first: one pipe -> socket splice sends the whole piece.
        if (write(pipes_[piece].in, &headers_[piece], sizeof(PieceHeader)) != sizeof(PieceHeader)) die("pipe write", errno);
        left_[piece] = sizeof(PieceHeader) + length;
        io_uring_prep_splice(sqe, file, static_cast<std::int64_t>(req.offset + at), pipes_[piece].in, -1,
                             static_cast<unsigned>(length), 0);
      } else {
        io_uring_prep_read(sqe, file, buffer_ + req.slot * s_.ioSize + at, static_cast<unsigned>(length), req.offset + at);
        if (s_.apart) sqe->ioprio = coio::detail::apartIoprios()[k & 1];
      }
    }
  }

  void flush(std::size_t c) {
    Connection& conn = connections_[c];
    if (conn.sending || conn.ready.empty()) return;
    if (s_.splice) return spliceOut(c);
    // One sendmsg for every piece read meanwhile (IOV_MAX bounds it).
    conn.iov.clear();
    conn.iovDone = 0;
    while (!conn.ready.empty() && conn.iov.size() + 2 <= IOV_MAX) {
      const std::size_t piece = conn.ready.front();
      conn.ready.pop_front();
      const PieceHeader& h = headers_[piece];
      conn.iov.push_back({&headers_[piece], sizeof h});
      conn.iov.push_back({buffer_ + h.slot * s_.ioSize + h.offset, s_.pieceLength(h.offset)});
    }
    sendRest(c);
  }

  void sendRest(std::size_t c) {
    Connection& conn = connections_[c];
    conn.msg.msg_iov = conn.iov.data() + conn.iovDone;
    conn.msg.msg_iovlen = conn.iov.size() - conn.iovDone;
    io_uring_prep_sendmsg(ring_.sqe(Op::send, c), conn.fd, &conn.msg, MSG_WAITALL);
    conn.sending = true;
  }

  void sent(Connection& conn, std::size_t n) {
    while (n > 0) {
      iovec& v = conn.iov[conn.iovDone];
      const std::size_t take = std::min(n, v.iov_len);
      v.iov_base = static_cast<std::byte*>(v.iov_base) + take;
      v.iov_len -= take;
      n -= take;
      if (v.iov_len == 0) ++conn.iovDone;
    }
    if (conn.iovDone < conn.iov.size()) return sendRest(static_cast<std::size_t>(&conn - connections_.data()));
    conn.sending = false;
  }

  // Pipe -> socket, from the server thread (a non-blocking socket); POLLOUT when it is full.
  void spliceOut(std::size_t c) {
    Connection& conn = connections_[c];
    while (!conn.ready.empty()) {
      const std::size_t piece = conn.ready.front();
      const unsigned more = conn.ready.size() > 1 ? SPLICE_F_MORE : 0;
      const ssize_t n = splice(pipes_[piece].out, nullptr, conn.fd, nullptr, left_[piece], SPLICE_F_NONBLOCK | more);
      if (n < 0) {
        if (errno != EAGAIN) die("splice to the socket", errno);
        io_uring_prep_poll_add(ring_.sqe(Op::poll, c), conn.fd, POLLOUT);
        conn.sending = true;
        return;
      }
      left_[piece] -= static_cast<std::size_t>(n);
      if (left_[piece] == 0) conn.ready.pop_front();
    }
  }

  const Settings& s_;
  const std::vector<int>& files_;
  Ring ring_;
  std::vector<Connection> connections_;
  std::vector<PieceHeader> headers_;  // by piece: slot * piecesPerIo + k
  std::byte* buffer_ = nullptr;       // copy: ioSize per slot
  std::vector<Pipe> pipes_;           // splice: by piece
  std::vector<std::size_t> left_;     // splice: bytes of the piece still in its pipe
  std::vector<Range> lastRange_;      // splice: by slot, the range to evict
};

class Client {
 public:
  Client(const Settings& s, const std::vector<std::uint64_t>& fileSizes, const std::vector<int>& sockets)
      : s_(s), fileSizes_(fileSizes), ring_(256), buffer_(hugePageBuffer(s.outstanding * s.ioSize)),
        piecesLeft_(s.outstanding) {
    for (int fd : sockets) connections_.emplace_back().fd = fd;
  }

  std::atomic<std::uint64_t> bytes{0};
  std::atomic<bool> stop{false};

  void run() {
    ring_.start();
    for (std::uint32_t slot = 0; slot < s_.outstanding; ++slot) issue(slot);
    std::size_t active = s_.outstanding;
    for (std::size_t c = 0; c < connections_.size(); ++c) receive(c);
    while (active > 0) {
      sendRequests();
      ring_.reap([&](std::uint64_t data, int res) {
        if (res <= 0) die("client recv", res == 0 ? ECONNRESET : -res);
        Connection& conn = connections_[indexOf(data)];
        std::size_t n = static_cast<std::size_t>(res);
        if (conn.left > 0) {
          const std::size_t take = std::min(n, conn.left);
          conn.left -= take;
          n -= take;
          if (conn.left == 0 && --piecesLeft_[conn.piece.slot] == 0) {
            bytes.fetch_add(s_.ioSize, std::memory_order_relaxed);
            if (stop.load(std::memory_order_relaxed)) {
              --active;
            } else {
              issue(conn.piece.slot);
            }
          }
        }
        conn.headerHave += n;
        if (conn.headerHave == sizeof(PieceHeader)) {
          conn.piece = conn.header;
          conn.left = s_.pieceLength(conn.piece.offset);
          conn.headerHave = 0;
        }
        receive(indexOf(data));
      });
    }
    for (const Connection& conn : connections_) shutdown(conn.fd, SHUT_WR);
  }

 private:
  struct Connection {
    int fd = -1;
    PieceHeader header{};  // the next piece's, as it arrives
    std::size_t headerHave = 0;
    PieceHeader piece{};  // the piece being received
    std::size_t left = 0;  // its bytes still to come
    std::vector<Request> requests;
    iovec iov[2]{};
    msghdr msg{};
  };

  void issue(std::uint32_t slot) {
    const auto file = static_cast<std::uint32_t>(random_() % fileSizes_.size());
    const std::uint64_t offset = random_() % (fileSizes_[file] / s_.ioSize) * s_.ioSize;
    connections_[slot % connections_.size()].requests.push_back({slot, file, offset});
    piecesLeft_[slot] = s_.piecesPerIo();
  }

  void sendRequests() {
    for (Connection& conn : connections_) {
      const auto* p = reinterpret_cast<const std::byte*>(conn.requests.data());
      std::size_t n = conn.requests.size() * sizeof(Request);
      while (n > 0) {
        const ssize_t r = send(conn.fd, p, n, 0);
        if (r < 0) die("client send", errno);
        p += r;
        n -= static_cast<std::size_t>(r);
      }
      conn.requests.clear();
    }
  }

  // The rest of the current piece and the next header in one receive.
  void receive(std::size_t c) {
    Connection& conn = connections_[c];
    std::size_t n = 0;
    if (conn.left > 0) {
      const std::size_t at = conn.piece.offset + s_.pieceLength(conn.piece.offset) - conn.left;
      conn.iov[n++] = {buffer_ + conn.piece.slot * s_.ioSize + at, conn.left};
    }
    conn.iov[n++] = {reinterpret_cast<std::byte*>(&conn.header) + conn.headerHave, sizeof(PieceHeader) - conn.headerHave};
    conn.msg.msg_iov = conn.iov;
    conn.msg.msg_iovlen = n;
    io_uring_prep_recvmsg(ring_.sqe(Op::recv, c), conn.fd, &conn.msg, 0);
  }

  const Settings& s_;
  const std::vector<std::uint64_t>& fileSizes_;
  Ring ring_;
  std::byte* buffer_;
  std::vector<std::size_t> piecesLeft_;  // by slot
  std::vector<Connection> connections_;
  std::mt19937_64 random_{std::random_device{}()};
};

std::optional<std::size_t> parseSize(std::string_view text) {
  std::size_t value = 0, i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) value = value * 10 + static_cast<std::size_t>(text[i] - '0');
  if (i == 0) return std::nullopt;
  const std::string_view unit = text.substr(i);
  if (unit == "K") return value << 10;
  if (unit == "M") return value << 20;
  if (unit.empty()) return value;
  return std::nullopt;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: floor_bench --dir D [--send copy|splice] [--io-size 512K] [--outstanding 32] "
               "[--connections 2] [--piece-size 128K] [--apart 0|1] [--seconds 3] [--tcp-congestion NAME]\n");
  std::exit(2);
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage();
    const std::string_view name = argv[i], value = argv[i + 1];
    auto size = [&] { return parseSize(value).value_or(0); };
    if (name == "--dir") {
      s.dir = value;
    } else if (name == "--send" && (value == "copy" || value == "splice")) {
      s.splice = value == "splice";
    } else if (name == "--io-size") {
      s.ioSize = size();
    } else if (name == "--piece-size") {
      s.pieceSize = size();
    } else if (name == "--outstanding") {
      s.outstanding = static_cast<unsigned>(size());
    } else if (name == "--connections") {
      s.connections = static_cast<unsigned>(size());
    } else if (name == "--seconds") {
      s.seconds = std::atof(argv[i + 1]);
    } else if (name == "--apart" && (value == "0" || value == "1")) {
      s.apart = value == "1";
    } else if (name == "--tcp-congestion") {
      s.congestion = value;
    } else {
      usage();
    }
  }
  if (s.dir.empty() || s.ioSize == 0 || s.ioSize % 4096 != 0 || s.pieceSize == 0 || s.pieceSize % 4096 != 0 ||
      s.outstanding == 0 || s.connections == 0 || s.connections > s.outstanding || s.seconds <= 0) {
    usage();
  }
  return s;
}

double cpuSeconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse(argc, argv);

  // The dataset's data files: data-0, data-1, ... (ChunkStoreLayout).
  std::vector<int> files;
  std::vector<std::uint64_t> sizes;
  for (;;) {
    const std::string path = s.dir + "/data-" + std::to_string(files.size());
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (s.splice ? 0 : O_DIRECT));
    if (fd < 0) break;
    struct stat st{};
    if (fstat(fd, &st) != 0) die("fstat", errno);
    if (static_cast<std::uint64_t>(st.st_size) < s.ioSize) die(path.c_str(), EINVAL);
    if (s.splice) {
      posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    files.push_back(fd);
    sizes.push_back(static_cast<std::uint64_t>(st.st_size));
  }
  if (files.empty()) die((s.dir + "/data-0").c_str(), ENOENT);

  // Loopback connections: client end, server end.
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listener, 16) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    die("listen", errno);
  }
  std::vector<int> clientSockets, serverSockets;
  const int one = 1;
  for (unsigned c = 0; c < s.connections; ++c) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) die("connect", errno);
    const int accepted = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | (s.splice ? SOCK_NONBLOCK : 0));
    if (accepted < 0) die("accept", errno);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(accepted, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!s.congestion.empty() && setsockopt(accepted, IPPROTO_TCP, TCP_CONGESTION, s.congestion.data(),
                                            static_cast<socklen_t>(s.congestion.size())) != 0) {
      die("TCP_CONGESTION", errno);
    }
    clientSockets.push_back(fd);
    serverSockets.push_back(accepted);
  }
  close(listener);

  Server server(s, files, serverSockets);
  Client client(s, sizes, clientSockets);
  std::thread serverThread([&] { server.run(); });
  std::thread clientThread([&] { client.run(); });
  clockid_t clientClock;
  if (const int r = pthread_getcpuclockid(clientThread.native_handle(), &clientClock); r != 0) die("pthread_getcpuclockid", r);

  const auto t0 = std::chrono::steady_clock::now();
  const double process0 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID), client0 = cpuSeconds(clientClock);
  const std::uint64_t bytes0 = client.bytes.load();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.seconds));
  const double process1 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID), client1 = cpuSeconds(clientClock);
  const std::uint64_t bytes = client.bytes.load() - bytes0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  client.stop = true;
  clientThread.join();
  serverThread.join();
  for (int fd : clientSockets) close(fd);
  for (int fd : serverSockets) close(fd);
  for (int fd : files) {
    if (s.splice) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }

  const double gib = static_cast<double>(bytes) / (1 << 30), clientCpu = client1 - client0,
               serverCpu = (process1 - process0) - clientCpu;
  std::printf(
      "{\"send\": \"%s\", \"io_size\": %zu, \"outstanding\": %u, \"connections\": %u, \"piece_size\": %zu, "
      "\"seconds\": %.3f, \"bytes\": %llu, \"gib_per_s\": %.4f, \"iops\": %.1f, \"server_cpu\": %.4f, "
      "\"client_cpu\": %.4f, \"cpu_per_gib\": %.4f}\n",
      s.splice ? "splice" : "copy", s.ioSize, s.outstanding, s.connections, s.pieceSize, wall,
      static_cast<unsigned long long>(bytes), gib / wall, static_cast<double>(bytes / s.ioSize) / wall, serverCpu,
      clientCpu, gib > 0 ? (serverCpu + clientCpu) / gib : 0.0);
}
