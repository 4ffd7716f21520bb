#pragma once
// Everything in coio that needs nothing beyond the C++ standard library.
#include <coio/core/async_scope.hpp>
#include <coio/core/awaitable_traits.hpp>
#include <coio/core/baton.hpp>
#include <coio/core/batch_semaphore.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/result.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/stamped_ptr.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>
#include <coio/testing/manual_executor.hpp>
