#pragma once
// coio-storage-server's subcommands, one file each: each declares its
// options in a CLI11 subcommand of the program (help text, units and
// validation in one place) and returns what runs it once parsed.
#include <CLI/CLI.hpp>

#include <functional>

namespace storage::cli {

/// A declared subcommand: `app` was parsed when `app->parsed()`; `run`
/// then runs it and returns the program's exit code.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

/// The program's name, as its messages begin.
inline constexpr const char* kServerProgram = "coio-storage-server";

Command addInit(CLI::App& program);     // init.cpp
Command addServe(CLI::App& program);    // serve.cpp
Command addMgmtd(CLI::App& program);    // mgmtd.cpp
Command addCluster(CLI::App& program);  // cluster.cpp
Command addRouting(CLI::App& program);  // routing.cpp

}  // namespace storage::cli
