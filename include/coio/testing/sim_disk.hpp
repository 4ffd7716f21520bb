#pragma once
// The simulated disk: coio::Disk on a coio::sim::SimReactor. Needs liburing
// (the Disk layer's types): link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/detail/disk_ring.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>

namespace coio::detail {

/// The ring of a Disk on a SimReactor: each operation is done at once, on
/// the real file (a pread, a pwrite, an fsync...: so data written is read
/// back, and what a test prepared on disk is there; reads of a File's file
/// copy from the bytes SimFiles keeps in memory), and completes after a
/// latency drawn from the seed, in virtual time, unless a fault drawn from
/// the seed (SimReactor::setDiskFaults) makes it fail, fall short or hang.
/// Nothing is registered: the Disk's fixed buffers and files decline
/// (EOPNOTSUPP) and it works with plain reads and writes, as it does when
/// registration fails.
class SimDiskRing final : public DiskRing {
 public:
  explicit SimDiskRing(sim::SimReactor& reactor) noexcept : reactor_(reactor) {}
  ~SimDiskRing() override { close(); }

  io_uring& ring() noexcept override {
    COIO_ASSERT(false, "a simulated Disk has no io_uring");
    std::abort();  // asserts may be compiled out: still never a ring that is not there
  }
  int registerBuffers(const std::vector<iovec>&) noexcept override { return -EOPNOTSUPP; }
  void unregisterBuffers() noexcept override {}
  int registerFiles(unsigned) noexcept override { return -EOPNOTSUPP; }
  int updateFile(unsigned, int) noexcept override { return -EOPNOTSUPP; }
  void unregisterFiles() noexcept override {}

  void submit(DiskOp& op, const DiskRequest& request) override {
    COIO_ASSERT(!request.fixedFile, "a simulated Disk registers no file");
    SimWorld& b = reactor_.backend_.world();
    const sim::DiskFaults& faults = b.diskFaults();
    const OpKind kind = opKindOf(request.opcode);
    op.counter = static_cast<std::uint8_t>(kind);
    reactor_.backend_.core().meter().submitted(op.counter);
    op.state = DiskOp::State::inFlight;
    const bool transfer = kind == OpKind::diskRead || kind == OpKind::diskWrite;
    if (transfer && b.chance(faults.hang)) {
      b.trace(0x4A96);
      b.defer(this, &op, &SimDiskRing::fire, 0, std::nullopt);  // until cancelled
      return;
    }
    long result;
    if ((transfer || kind == OpKind::diskSync) && b.chance(faults.eio)) {
      result = -EIO;
    } else if (kind == OpKind::diskWrite && b.chance(faults.enospc)) {
      result = -ENOSPC;
    } else {
      DiskRequest r = request;
      const bool plainRead = request.opcode == IORING_OP_READ || request.opcode == IORING_OP_READ_FIXED;
      if (plainRead && r.length > 1 && b.chance(faults.shortRead)) r.length = 1 + b.random().below(r.length - 1);
      result = perform(b.files(), r);
    }
    const auto span = faults.maxLatency - faults.minLatency;
    const auto latency =
        faults.minLatency +
        std::chrono::steady_clock::duration(span.count() > 0 ? static_cast<std::chrono::steady_clock::rep>(
                                                                   b.random().below(static_cast<std::uint64_t>(span.count()) + 1))
                                                             : 0);
    b.trace(static_cast<std::uint64_t>(result));
    b.defer(this, &op, &SimDiskRing::fire, static_cast<int>(result), b.now() + latency);
  }

  void fileOpened(int fd, bool direct) noexcept override { reactor_.backend_.world().files().opened(fd, direct); }
  void fileClosing(int fd) noexcept override {
    if (!closed_) reactor_.backend_.world().files().closing(fd);  // (closed: the reactor may be gone)
  }

  void cancel(DiskOp& op) noexcept override { (void)reactor_.backend_.world().cancelDeferred(&op); }
  void openBatch() override {}  // each operation completes at its own time
  void closeBatch() override {}
  LoopCore& loop() noexcept override { return reactor_; }
  /// The Disk is going away: its pending operations never complete.
  void close() noexcept override {
    if (std::exchange(closed_, true)) return;
    reactor_.backend_.world().dropDeferredOf(this);
  }

 private:
  static void fire(const void* owner, void* p, int result) noexcept {
    auto* op = static_cast<DiskOp*>(p);
    static_cast<const SimDiskRing*>(owner)->reactor_.backend_.core().meter().completed(op->counter);
    op->complete(op, result, 0);
  }

  // The request as the kernel would do it: its result, or -errno. Files'
  // bytes kept in memory (SimFiles) are read from there, and written there
  // too.
  static long perform(SimFiles& files, const DiskRequest& r) {
    const int fd = r.fd;
    const auto offset = static_cast<off_t>(r.offset);
    const auto parts = static_cast<const iovec*>(r.address);
    const int count = static_cast<int>(r.length);
    switch (r.opcode) {
      case IORING_OP_READ: case IORING_OP_READ_FIXED: {
        const iovec whole{r.address, r.length};
        if (const std::optional<long> copied = files.read(fd, &whole, 1, r.offset)) return *copied;
        return retryOnEintr([&] { return ::pread(fd, r.address, r.length, offset); });
      }
      case IORING_OP_WRITE: case IORING_OP_WRITE_FIXED: {
        const long n = retryOnEintr([&] { return ::pwrite(fd, r.address, r.length, offset); });
        if (n > 0) files.wrote(fd, static_cast<std::size_t>(n), r.offset);
        return n;
      }
      case IORING_OP_READV:
        if (const std::optional<long> copied = files.read(fd, parts, count, r.offset)) return *copied;
        return retryOnEintr([&] { return ::preadv(fd, parts, count, offset); });
      case IORING_OP_WRITEV: {
        const long n = retryOnEintr([&] { return ::pwritev(fd, parts, count, offset); });
        if (n > 0) files.wrote(fd, static_cast<std::size_t>(n), r.offset);
        return n;
      }
      case IORING_OP_FSYNC:
        return retryOnEintr([&] { return (r.opFlags & IORING_FSYNC_DATASYNC) ? ::fdatasync(fd) : ::fsync(fd); });
      case IORING_OP_FALLOCATE:
        files.changed(fd);
        return retryOnEintr(
            [&] { return ::fallocate(fd, static_cast<int>(r.opFlags), offset, static_cast<off_t>(r.length)); });
      case IORING_OP_OPENAT:
        return retryOnEintr([&] {
          return ::openat(fd, static_cast<const char*>(r.address), static_cast<int>(r.opFlags),
                          static_cast<mode_t>(r.length));
        });
      case IORING_OP_STATX:
        return retryOnEintr([&] {
          return ::statx(fd, "", static_cast<int>(r.opFlags), static_cast<unsigned>(r.length),
                         static_cast<struct statx*>(r.address));
        });
      case IORING_OP_CLOSE:
        files.closing(fd);  // (File::closeAsync's: its File::close() does not run)
        return ::close(fd) == 0 ? 0 : -errno;
      case IORING_OP_NOP: return 0;
      default: return -EOPNOTSUPP;
    }
  }

  sim::SimReactor& reactor_;
  bool closed_ = false;  // close() ran: the reactor is not to be touched
};

}  // namespace coio::detail

namespace coio::sim {

/// Disk's ring on a SimReactor: `coio::Disk disk(simReactor)` finds it
/// (see Disk's constructor for other reactors). The simulated disk:
/// - every operation (File's and ReadBatch / WriteBatch's reads and
///   writes, fsync, fallocate, openAsync, stat, closeAsync) is done at once
///   on the real file (a read of a File not opened O_DIRECT: from the
///   file's bytes in memory, read as first needed while a File has it
///   open; see SimFiles for what it sees), then completes, on the loop
///   thread, after a latency drawn from the seed
///   (DiskFaults::minLatency..maxLatency) in virtual time: data written is
///   read back, files a test prepared are there, and a run is the same for
///   the same seed (the files' contents being the same);
/// - faults drawn from the seed per operation (SimReactor::setDiskFaults):
///   EIO, a short read, an operation that hangs until cancelled (a
///   withTimeout or a stop ends it with ECANCELED), ENOSPC on writes; bit
///   flips in stored data are a test's to make, in the files, before they
///   are opened (or in parts not read yet);
/// - O_DIRECT's alignment rules are the file system's: a file opened with
///   O_DIRECT on one that supports it (not tmpfs) refuses misaligned IO as
///   it would under a real reactor;
/// - nothing is registered (Disk::registerBuffers and File::registerFile
///   decline with EOPNOTSUPP: the Disk then works as when registration
///   fails), and Disk::ring() must not be called.
inline std::shared_ptr<detail::DiskRing> makeDiskRing(SimReactor& reactor, const Disk::Options&) {
  return std::make_shared<detail::SimDiskRing>(reactor);
}

}  // namespace coio::sim
