import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


# Builds tests/consumer, the program every other route is tested with,
# against the Conan package, with the components the package was built with.
class CoioTestPackageConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        coio = self.dependencies["coio"]
        components = [c for c in ("uring", "rdma") if coio.options.get_safe(f"with_{c}")]
        toolchain = CMakeToolchain(self)
        toolchain.cache_variables["COIO_CONSUMER_COMPONENTS"] = ";".join(components)
        toolchain.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure(build_script_folder=os.path.join(self.source_folder, os.pardir, "tests", "consumer"))
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "coio_consumer"), env="conanrun")
