#pragma once
// Everything in coio that needs no library beyond libc: the core, the
// testing executor, the epoll reactor and TCP. The io_uring reactor and
// disk I/O are in <coio/uring.hpp>, RDMA in <coio/rdma.hpp>.
#include <coio/core/async_generator.hpp>
#include <coio/core/async_scope.hpp>
#include <coio/core/awaitable_traits.hpp>
#include <coio/core/baton.hpp>
#include <coio/core/batch_semaphore.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/bounded_queue.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/event.hpp>
#include <coio/core/generator.hpp>
#include <coio/core/latch.hpp>
#include <coio/core/lock_guard.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/result.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/shared_mutex.hpp>
#include <coio/core/stamped_ptr.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>
#include <coio/core/version.hpp>
#include <coio/net/group_commit.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/loop_stats.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/reactor_pool.hpp>
#include <coio/reactor/wait_for.hpp>
#include <coio/reactor/with_timeout.hpp>
#include <coio/testing/manual_executor.hpp>
#include <coio/testing/sim_reactor.hpp>
