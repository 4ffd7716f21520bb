#pragma once
// SpliceReactor: moving bytes between fds inside the kernel (splice, tee,
// sendfile), without copying them through the program's memory.
#include <coio/core/result.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/reactor.hpp>

#include <cstddef>
#include <cstdint>
#include <stop_token>

namespace coio {

/// An offset for splice() meaning "none": the end is a pipe or a socket
/// (which have none), or a file read or written at its file position,
/// which then advances.
inline constexpr std::int64_t kNoOffset = -1;

/// A Reactor whose awaitables move bytes between fds inside the kernel:
/// EpollReactor and UringReactor. (The simulated reactor has no files and
/// no pipes, so it is not one: code meant to run on it too checks
/// `if constexpr (SpliceReactor<R>)` and copies otherwise.)
///
/// - `splice(in, inOffset, out, outOffset, length, stop)`: splice(2), from
///   `in` into `out`, one of which must be a pipe (Pipe): a file or a
///   socket into a pipe, or a pipe into a file, a socket or another pipe.
///   An offset is where in a regular file to read or write (its position
///   does not move), or kNoOffset (for a pipe or socket end it must be).
/// - `tee(in, out, length, stop)`: tee(2), from pipe `in` into pipe `out`,
///   without consuming `in`.
/// - `sendfile(out, in, offset, length, pipe, stop)`: from regular file
///   `in` at `offset` (>= 0) into `out` (a socket, a pipe, a file): on
///   UringReactor a splice into `pipe` then from it (`pipe` must be empty,
///   as every sendfile leaves it: else EBUSY, before any byte moves), on
///   EpollReactor sendfile(2), which leaves `pipe` untouched.
///
/// What every one of them guarantees, on both reactors:
/// - It resumes its coroutine on the loop thread and must be awaited there,
///   once; it yields Result<std::size_t> (errno values in the system
///   category).
/// - Partial transfers: the bytes moved, possibly fewer than asked: what
///   the pipe had room for or held, what the socket took, up to the file's
///   end (sendfile on UringReactor: at most the pipe's capacity per call).
///   0 means the input is at its end: a file at or past its end (a file
///   truncated under a transfer reads as the shorter file: a short count,
///   then 0), or a pipe or socket whose writer closed it (or `length` was
///   0). Never 0 for want of readiness.
/// - EAGAIN never reaches the caller: an end that is not ready (an empty or
///   full pipe, a socket with no data or no room) is waited for, and the
///   transfer tried again then; what an error interrupts is reported as the
///   bytes moved before it (the next call yields the error). One operation
///   at a time may wait on each end in each direction (as with every fd).
/// - Errors: EINVAL for an fd the kernel cannot splice (no pipe among the
///   ends; a file without splice support, e.g. an eventfd; an O_DIRECT end
///   at an offset or length its device cannot take; a negative offset
///   other than kNoOffset); ESPIPE for an offset given for a pipe or
///   socket; EPIPE for an output whose reader is gone (no SIGPIPE is
///   raised: the program need not ignore it); ECONNRESET, EBADF as
///   usual; on UringReactor EBUSY for a socket it reads ahead (a recv()
///   armed a multishot recv on it: see UringReactor::splice), whose bytes
///   a splice would race that recv for.
/// - Cancellation: a stop requested on the loop thread (given no token,
///   the awaiting Task's) ends it with std::errc::operation_canceled, or
///   with what it had moved by then if anything; it resumes once the kernel
///   has let go of it. sendfile returns with `pipe` empty whatever
///   happened: what it could not deliver is discarded (and not counted).
///   (One that never returns, its reactor stopped, may leave bytes there:
///   Pipe::discard() them before the pipe is used again.)
/// - Pages, not copies: a file's page-cache pages spliced into a pipe are
///   referenced, not copied, until they leave it, so a write to that part
///   of the file before then shows in what is sent (sendfile(2) is the
///   same); a file truncated meanwhile still sends what was spliced in.
///   sendfile empties its pipe before it returns; after a splice into a
///   pipe, order writes to the file after the splice out of it (or copy).
/// - O_DIRECT: the file end may be O_DIRECT (Linux 6.5 and later read it
///   into fresh pages, not the page cache), at offsets and lengths aligned
///   as the device requires; sockets and pipes have no O_DIRECT.
/// - How: UringReactor submits IORING_OP_SPLICE / IORING_OP_TEE, which the
///   kernel runs on its io-wq workers (a file read from disk blocks a
///   worker, not the loop); EpollReactor calls splice(2) / tee(2) /
///   sendfile(2) non-blocking on the loop thread and waits for readiness
///   with epoll, so a file end whose pages are not in the page cache is
///   read from disk on the loop thread, blocking it: on EpollReactor,
///   splice hot data only.
template <typename R>
concept SpliceReactor = Reactor<R> && requires(R& r, int fd, std::int64_t offset, std::size_t length, Pipe& pipe,
                                               std::stop_token stop) {
  { r.splice(fd, offset, fd, offset, length, stop) } -> AwaitableOf<Result<std::size_t>>;
  { r.tee(fd, fd, length, stop) } -> AwaitableOf<Result<std::size_t>>;
  { r.sendfile(fd, fd, offset, length, pipe, stop) } -> AwaitableOf<Result<std::size_t>>;
};

}  // namespace coio
