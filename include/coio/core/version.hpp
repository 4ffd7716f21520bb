#pragma once
/// @file
/// coio's version. coio follows semantic versioning with a 0.x major
/// version: until 1.0 a minor release (0.1 -> 0.2) may change the API, a
/// patch release (0.1.0 -> 0.1.1) only fixes. project(VERSION) in
/// CMakeLists.txt, the Conan and vcpkg recipes and these macros agree (CI
/// checks it with .ci/check_version.py).

/// Major version.
#define COIO_VERSION_MAJOR 0
/// Minor version.
#define COIO_VERSION_MINOR 1
/// Patch version.
#define COIO_VERSION_PATCH 0
/// The version as a string, "MAJOR.MINOR.PATCH".
#define COIO_VERSION "0.1.0"
