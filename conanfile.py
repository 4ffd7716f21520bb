import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout
from conan.tools.scm import Version

required_conan_version = ">=2.0.8"  # implements = ["auto_header_only"]


class CoioConan(ConanFile):
    name = "coio"
    description = "Header-only C++20 coroutines and event loops for io_uring / RDMA storage services"
    license = "MIT"
    topics = ("coroutines", "async", "io_uring", "rdma", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_uring": [True, False], "with_rdma": [True, False]}
    default_options = {"with_uring": False, "with_rdma": False}
    exports_sources = "include/*", "LICENSE*", "cmake/coio-conan-components.cmake"
    no_copy_source = True
    # The headers are the same for every configuration and option.
    implements = ["auto_header_only"]

    # CMake code CMakeDeps includes after defining the targets (see the file).
    _components_module = os.path.join("cmake", "coio-conan-components.cmake")

    # Compilers coio's CI builds and tests with.
    _min_compiler_version = {"gcc": "12", "clang": "14"}

    def set_version(self):
        # project(VERSION) in CMakeLists.txt is the one place the version lives.
        cmake = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = self.version or re.search(r"project\(coio\s+VERSION\s+(\S+)", cmake).group(1)

    def config_options(self):
        # io_uring and ibverbs exist only on Linux.
        if self.settings.os != "Linux":
            del self.options.with_uring
            del self.options.with_rdma

    def layout(self):
        basic_layout(self)

    def requirements(self):
        # Lower bounds: the versions coio's CI tests with (Debian 12).
        if self.options.get_safe("with_uring"):
            self.requires("liburing/[>=2.3 <3]")
        if self.options.get_safe("with_rdma"):
            self.requires("rdma-core/[>=44.0]")

    def validate(self):
        check_min_cppstd(self, 20)
        compiler = str(self.settings.compiler)
        minimum = self._min_compiler_version.get(compiler)
        if minimum and Version(self.settings.compiler.version) < minimum:
            raise ConanInvalidConfiguration(f"{self.ref} needs {compiler} >= {minimum}")

    def package(self):
        copy(self, "LICENSE*", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        copy(self, self._components_module, self.source_folder, self.package_folder)

    def package_info(self):
        # The file and target names of coio's own CMake package config: coio::coio is
        # the core alone, so the root target that aggregates every component gets
        # another name.
        self.cpp_info.set_property("cmake_file_name", "coio")
        self.cpp_info.set_property("cmake_target_name", "coio::coio_all")
        self.cpp_info.set_property("pkg_config_name", "coio_all")
        # find_package(coio COMPONENTS x) fails when x was not enabled.
        self.cpp_info.set_property("cmake_build_modules", [self._components_module])

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "coio::coio")
        core.set_property("pkg_config_name", "coio")
        core.bindirs = []
        core.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]

        # (component, Conan package it needs, that package's target, the system library)
        for component, package, target, system_lib in (
            ("uring", "liburing", "liburing::liburing", "uring"),
            ("rdma", "rdma-core", "rdma-core::libibverbs", "ibverbs"),
        ):
            if not self.options.get_safe(f"with_{component}"):
                continue
            info = self.cpp_info.components[component]
            info.set_property("cmake_target_name", f"coio::{component}")
            info.set_property("pkg_config_name", f"coio-{component}")
            info.requires = ["core"]
            info.bindirs = []
            info.libdirs = []
            # A dependency given as [platform_requires] is not in self.dependencies and
            # CMakeDeps rejects component requires on it: link the system library by name.
            if package in self.dependencies:
                info.requires.append(target)
            else:
                info.system_libs = [system_lib]
