#pragma once
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/rdma/error.hpp>
#include <coio/rdma/memory_region.hpp>
#include <coio/reactor/reactor.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <stop_token>
#include <vector>

namespace coio::rdma {

template <Reactor R>
class QueuePair;

/// The RDMA operation of an RdmaBatch.
enum class RdmaOp { write = IBV_WR_RDMA_WRITE, read = IBV_WR_RDMA_READ };

namespace detail {
// One work request of a batch: a contiguous remote range and the local
// scatter/gather elements [firstSge, firstSge + sgeCount) of the batch.
struct RdmaWr {
  std::uint64_t remoteAddr;
  std::uint32_t rkey;
  std::uint32_t firstSge;
  std::uint32_t sgeCount;
};

// Cuts `locals` into work requests on consecutive parts of `remote`, each
// with at most maxSge elements and maxBytes bytes; appends them. The bytes
// added, or Errc::invalidArgument (nothing to move, or more than `remote`).
inline Result<std::uint64_t> appendWorkRequests(const RemoteBuffer& remote, std::span<const LocalBuffer> locals,
                                                std::uint64_t maxSge, std::uint64_t maxBytes,
                                                std::vector<RdmaWr>& wrs, std::vector<ibv_sge>& sges) {
  std::uint64_t total = 0;
  for (const LocalBuffer& b : locals) total += b.length;
  if (total == 0 || total > remote.length || maxSge == 0 || maxBytes == 0) return Errc::invalidArgument;
  std::uint64_t remoteAddr = remote.addr;
  std::uint64_t wrBytes = 0;
  bool open = false;
  for (const LocalBuffer& b : locals) {
    for (std::uint64_t offset = 0; offset < b.length;) {
      if (!open || wrs.back().sgeCount == maxSge || wrBytes == maxBytes) {
        wrs.push_back({remoteAddr, remote.rkey, static_cast<std::uint32_t>(sges.size()), 0});
        open = true;
        wrBytes = 0;
      }
      const std::uint64_t piece = std::min<std::uint64_t>(b.length - offset, maxBytes - wrBytes);
      sges.push_back({reinterpret_cast<std::uintptr_t>(b.data + offset), static_cast<std::uint32_t>(piece), b.lkey});
      ++wrs.back().sgeCount;
      wrBytes += piece;
      remoteAddr += piece;
      offset += piece;
    }
  }
  return total;
}
}  // namespace detail

/// A batch of RDMA WRITEs or READs on one QueuePair, built with add() and
/// executed by `co_await batch.post()` (3FS's RDMAReqBatch).
///
/// `add(remote, locals)` moves the local buffers to/from the contiguous
/// remote range; they are cut into work requests of at most `maxSge`
/// elements and at most the port's max_msg_sz bytes each. post() sends the
/// work requests as chains of at most maxRdmaWrPerPost, each chain
/// signalled only on its last work request and admitted by the queue pair's
/// RDMA-WR semaphore (so the send queue cannot overflow, however large the
/// batch). It yields success or the first failure (in chain order; within a
/// chain the first failed completion). The batch must outlive post(); the
/// local and remote memory must stay registered until post() completes.
/// `stop` ends a post that waits for work-request tokens (nothing posted:
/// std::errc::operation_canceled) and fails the queue pair under chains
/// already posted (see QueuePair, "Bounding an operation in time").
/// Threading: as QueuePair (loop thread; resumes on the loop thread).
template <Reactor R>
class RdmaBatch {
 public:
  /// An empty batch of `op` operations on `qp`.
  RdmaBatch(QueuePair<R>& qp, RdmaOp op) noexcept : qp_(&qp), op_(op) {}

  /// Errc::invalidArgument if the local buffers are empty or exceed `remote`.
  Result<void> add(const RemoteBuffer& remote, std::span<const LocalBuffer> locals) {
    const std::uint64_t maxBytes = std::min<std::uint64_t>(qp_->device().limits().maxMsgSize, UINT32_MAX);
    Result<std::uint64_t> added = detail::appendWorkRequests(remote, locals, qp_->config().maxSge, maxBytes, wrs_, sges_);
    if (!added) return added.error();
    bytes_ += *added;
    return {};
  }
  /// Adds one local buffer; see the other overload.
  Result<void> add(const RemoteBuffer& remote, const LocalBuffer& local) { return add(remote, std::span(&local, 1)); }

  /// Posts everything added; see the class comment.
  Task<Result<void>> post(std::stop_token stop = {}) {
    return qp_->postBatch(static_cast<ibv_wr_opcode>(op_), wrs_, sges_, std::move(stop));
  }

  /// Work requests the batch has made so far.
  std::size_t workRequests() const noexcept { return wrs_.size(); }
  /// Bytes added so far.
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  QueuePair<R>* qp_;
  RdmaOp op_;
  std::uint64_t bytes_ = 0;
  std::vector<detail::RdmaWr> wrs_;
  std::vector<ibv_sge> sges_;
};

}  // namespace coio::rdma
