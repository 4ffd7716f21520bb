#pragma once
// Component coio::rdma (link libibverbs): everything in <coio/coio.hpp>, plus
// the RDMA verbs awaitables.
#include <coio/coio.hpp>
#include <coio/rdma/rdma.hpp>
