#pragma once
// Component coio::uring (link liburing): everything in <coio/coio.hpp>, plus
// the io_uring reactor, the run-time reactor choice, disk I/O, and the
// simulated disk (coio::sim).
#include <coio/coio.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/direct_io.hpp>
#include <coio/disk/disk_batch.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/disk/read_batch.hpp>
#include <coio/disk/write_batch.hpp>
#include <coio/reactor/reactor_kind.hpp>
#include <coio/reactor/uring_reactor.hpp>
#include <coio/testing/sim_disk.hpp>
