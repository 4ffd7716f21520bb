#pragma once
// coio's RDMA verbs layer (link coio::rdma): devices, registered memory,
// completion queues driven by a reactor, and RC queue pairs with
// co_await-able RDMA READ/WRITE batches and flow-controlled messages.
#include <coio/rdma/completion_queue.hpp>
#include <coio/rdma/config.hpp>
#include <coio/rdma/device.hpp>
#include <coio/rdma/error.hpp>
#include <coio/rdma/memory_region.hpp>
#include <coio/rdma/queue_pair.hpp>
#include <coio/rdma/queue_pair_state.hpp>
#include <coio/rdma/rdma_batch.hpp>
