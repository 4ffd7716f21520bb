#pragma once
// The etcd client of the subcommands that talk to etcd (serve --etcd,
// mgmtd, cluster): its --etcd option, made and destroyed on its loop thread.
#include "etcd/etcd_client.hpp"
#include "programs/server/on_loop.hpp"

#include <CLI/CLI.hpp>
#include <coio/core/result.hpp>
#include <coio/reactor/reactor.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace storage::cli {

/// --etcd URL[,URL...]: the endpoints (empty items skipped).
inline std::vector<std::string> splitEndpoints(const std::string& value) {
  std::vector<std::string> urls;
  for (std::size_t at = 0; at <= value.size();) {
    const std::size_t comma = std::min(value.find(',', at), value.size());
    if (comma > at) urls.push_back(value.substr(at, comma - at));
    at = comma + 1;
  }
  return urls;
}

/// Declares --etcd URL[,URL...] on `command`, into `endpoints`.
inline CLI::Option* addEtcdOption(CLI::App& command, std::vector<std::string>& endpoints, const std::string& help) {
  return command
      .add_option_function<std::string>(
          "--etcd", [&endpoints](const std::string& value) { endpoints = splitEndpoints(value); }, help)
      ->check(CLI::Validator(
          [](std::string& value) { return splitEndpoints(value).empty() ? std::string("no endpoint") : std::string(); },
          "URL[,URL...]"));
}

inline void logEtcd(const std::string& line) { std::fprintf(stderr, "coio-storage-server: etcd: %s\n", line.c_str()); }

/// An etcd client made on `reactor`'s loop thread (where it lives), or
/// prints why not and returns null.
template <coio::Reactor R>
std::unique_ptr<etcd::EtcdClient<R>> connectEtcd(R& reactor, const std::vector<std::string>& endpoints) {
  coio::Result<std::unique_ptr<etcd::EtcdClient<R>>> client = coio::Errc::closed;
  runOn(reactor, [](R& home, std::vector<std::string> urls,
                    coio::Result<std::unique_ptr<etcd::EtcdClient<R>>>& out) -> coio::Task<void> {
    etcd::EtcdOptions options;
    options.endpoints = std::move(urls);
    options.log = logEtcd;
    out = etcd::EtcdClient<R>::create(home, std::move(options));
    co_return;
  }(reactor, endpoints, client));
  if (!client) {
    std::fprintf(stderr, "coio-storage-server: --etcd: bad endpoint list (http://IP:PORT[,...]): %s\n",
                 client.error().message().c_str());
    return nullptr;
  }
  return std::move(*client);
}

/// Destroys `client` on its loop thread.
template <coio::Reactor R>
void disconnectEtcd(R& reactor, std::unique_ptr<etcd::EtcdClient<R>>& client) {
  runOn(reactor, [](std::unique_ptr<etcd::EtcdClient<R>>& c) -> coio::Task<void> {
    c.reset();
    co_return;
  }(client));
}

}  // namespace storage::cli
