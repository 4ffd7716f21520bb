#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/detail/disk_ring.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace coio {

class File;
class DiskBatch;

/// The disk I/O context of one reactor: the io_uring every File, BufferPool,
/// ReadBatch and WriteBatch built on it submits to.
///
/// Guarantees:
/// - Under UringReactor the reactor's own ring is used (its completions are
///   posted as UringReactor::Options::taskRun says: by default when the
///   loop thread next enters the kernel);
///   under EpollReactor a dedicated ring, whose completions an eventfd
///   (io_uring_register_eventfd) signals to a pump task spawned on the reactor.
/// - Every disk awaitable resumes its coroutine on the reactor's loop thread
///   and must be awaited there; a Disk is used from that thread only (or
///   while no loop runs).
/// - Submission adapts to the depth: a batch (ReadBatch, WriteBatch) always reaches the kernel
///   in one io_uring_enter; a single operation goes in at once while few are
///   in flight (at queue depth 32, one enter per read beats one per batch on
///   a virtual disk), together with others when many are (at depth 128,
///   batching wins): see Options::eagerBelow. Under an eager UringReactor
///   every single operation goes in at once.
/// - Destroy the Disk before its reactor, when nothing awaits it or after the
///   reactor stopped: pending operations are then cancelled, the kernel lets
///   go of their buffers before the destructor returns, and their coroutines
///   never resume. Files and BufferPools may outlive it (they lose their
///   registration), so they may live in frames the reactor destroys later.
class Disk {
 public:
  /// Ring sizes and submission tuning.
  struct Options {
    unsigned entries = 256;                             ///< SQ size of a dedicated ring (EpollReactor)
    unsigned cqEntries = 4096;                          ///< CQ size of a dedicated ring
    /// Single operations go to the kernel at once (one io_uring_enter each)
    /// while at most this many operations are in flight on the ring, else
    /// with the next enter (the reactor's loop iteration, or the end of the
    /// dispatch round). 0: always together; UINT_MAX: always at once.
    unsigned eagerBelow = 64;
    unsigned maxRegisteredFiles = 256;                  ///< slots of the registered-file table
  };

  /// Uses the reactor's ring, default options.
  explicit Disk(UringReactor& reactor) : Disk(reactor, Options{}) {}
  /// Sets up a dedicated ring with default options; throws std::system_error if io_uring is unusable.
  explicit Disk(EpollReactor& reactor) : Disk(reactor, Options{}) {}

  /// Uses the reactor's ring.
  Disk(UringReactor& reactor, Options options)
      : ring_(std::make_shared<detail::ReactorRing>(reactor, options.eagerBelow)), options_(options) {}

  /// Sets up a dedicated ring; throws std::system_error if io_uring is
  /// unusable (the message names the cause).
  Disk(EpollReactor& reactor, Options options) : options_(options) {
    auto ring = std::make_shared<detail::DedicatedRing>(reactor, options.entries, options.cqEntries,
                                                        options.eagerBelow);
    ring_ = ring;
    reactor.spawn(pump(reactor, std::move(ring)));
  }

  /// A Disk on a reactor of another kind, whose namespace provides
  /// `makeDiskRing(reactor, options)` (found by argument-dependent lookup):
  /// coio::sim::SimReactor's simulated disk (<coio/testing/sim_disk.hpp>).
  /// Code templated over the reactor constructs a Disk the same way on each.
  template <typename R>
    requires requires(R& r, const Options& o) {
      { makeDiskRing(r, o) } -> std::convertible_to<std::shared_ptr<detail::DiskRing>>;
    }
  Disk(R& reactor, Options options) : ring_(makeDiskRing(reactor, options)), options_(options) {}
  /// The same, default options.
  template <typename R>
    requires requires(R& r, const Options& o) { makeDiskRing(r, o); }
  explicit Disk(R& reactor) : Disk(reactor, Options{}) {}

  Disk(const Disk&) = delete;
  Disk& operator=(const Disk&) = delete;
  ~Disk() {
    ring_->close();
    if (pool_) unregisterBuffers(*pool_);
    for (int* slot : files_) {
      if (slot) *slot = -1;  // the File is no longer registered
    }
    if (!files_.empty()) ring_->unregisterFiles();
  }

  /// The ring, e.g. to register more resources. Loop thread. (A simulated
  /// disk has none: calling this on one is a programming error, asserted.)
  io_uring& ring() noexcept { return ring_->ring(); }

  /// Makes the pool's buffers the ring's fixed buffers (the ring has one
  /// table: one pool at a time). On failure (ENOMEM when RLIMIT_MEMLOCK
  /// forbids pinning that much, EBUSY when the table is taken, ...) the pool
  /// keeps working with plain reads, and its registrationNote() says why.
  Result<void> registerBuffers(BufferPool& pool) {
    if (pool_ == &pool) return {};
    std::error_code error = pool_ ? systemError(EBUSY) : std::error_code{};
    if (!error) {
      const std::vector<iovec> regions = pool.regions();
      const int r = ring_->registerBuffers(regions);
      if (r == 0) {
        pool_ = &pool;
        pool.disk_ = this;
        pool.note_ = "registered as " + std::to_string(regions.size()) + " io_uring fixed buffer(s)";
        return {};
      }
      error = systemError(-r);
    }
    pool.note_ = "not registered (io_uring_register_buffers: " + error.message() + ")";
    if (error.value() == ENOMEM) pool.note_ += ": RLIMIT_MEMLOCK too low? raise ulimit -l or grant CAP_IPC_LOCK";
    if (error.value() == EBUSY) pool.note_ += ": the ring's fixed-buffer table is taken";
    pool.note_ += "; reads into it use IORING_OP_READ";
    return error;
  }

  /// Gives the fixed-buffer table back. No fixed read may be pending.
  void unregisterBuffers(BufferPool& pool) noexcept {
    if (pool_ != &pool) return;
    ring_->unregisterBuffers();
    pool_ = nullptr;
    pool.disk_ = nullptr;
    pool.note_ = "not registered (unregistered from its Disk)";
  }

 private:
  friend class File;
  friend class DiskBatch;

  detail::DiskRing& queue() noexcept { return *ring_; }

  // Puts `fd` in the registered-file table: its slot, or an error (EMFILE
  // when the table is full, else io_uring_register_files*'s). `owner` is
  // the File's slot field, which the Disk resets when it goes.
  Result<int> registerFile(int fd, int* owner) {
    if (files_.empty()) {
      if (const int r = ring_->registerFiles(options_.maxRegisteredFiles); r < 0) {
        return systemError(-r);
      }
      files_.assign(options_.maxRegisteredFiles, nullptr);
    }
    const auto free = std::find(files_.begin(), files_.end(), nullptr);
    if (free == files_.end()) return systemError(EMFILE);
    const int slot = static_cast<int>(free - files_.begin());
    if (const int r = ring_->updateFile(static_cast<unsigned>(slot), fd); r < 0) {
      return systemError(-r);
    }
    *free = owner;
    return slot;
  }

  // Empties a slot (operations in flight keep their own file reference).
  void unregisterFile(int slot) noexcept {
    (void)ring_->updateFile(static_cast<unsigned>(slot), -1);
    files_[static_cast<std::size_t>(slot)] = nullptr;
  }
  void moveFile(int slot, int* owner) noexcept { files_[static_cast<std::size_t>(slot)] = owner; }

  // Waits for the eventfd, drains it, dispatches; ends once the Disk closed.
  static Task<void> pump(EpollReactor& reactor, std::shared_ptr<detail::DedicatedRing> ring) {
    for (;;) {
      Result<void> ready = co_await reactor.readable(ring->eventFd());
      ready.value();  // an eventfd can always be polled
      if (ring->closed()) break;
      ring->pump();
    }
    reactor.forget(ring->eventFd());
  }

  std::shared_ptr<detail::DiskRing> ring_;
  Options options_;
  BufferPool* pool_ = nullptr;  // the pool in the fixed-buffer table
  std::vector<int*> files_;     // the registered-file table: each File's slot field (empty until first used)
};

}  // namespace coio
