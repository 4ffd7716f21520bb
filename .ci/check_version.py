#!/usr/bin/env python3
"""Checks that every place naming coio's version agrees with project(VERSION)
in CMakeLists.txt: the COIO_VERSION* macros, the vcpkg port, the newest
CHANGELOG.md entry and, given a conan executable, the version the Conan
recipe computes. The version is 0.x semver (MAJOR.MINOR.PATCH).
  .ci/check_version.py [path to conan]
Exits 1 listing every disagreement."""
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def read(path):
    return (ROOT / path).read_text()


def first(pattern, text, where):
    match = re.search(pattern, text, re.M)
    return match.groups() if match else sys.exit(f"check_version: no match for {pattern!r} in {where}")


(version,) = first(r"project\(coio\s+VERSION\s+(\S+)", read("CMakeLists.txt"), "CMakeLists.txt")
if not re.fullmatch(r"0\.(0|[1-9]\d*)\.(0|[1-9]\d*)", version):
    sys.exit(f"check_version: project(VERSION {version}) is not a 0.x semantic version MAJOR.MINOR.PATCH")

header = read("include/coio/core/version.hpp")
macros = {name: value for name, value in re.findall(r"^#define (COIO_VERSION\w*) (\S+)", header, re.M)}
found = {
    "include/coio/core/version.hpp COIO_VERSION": macros.get("COIO_VERSION", "").strip('"'),
    "include/coio/core/version.hpp COIO_VERSION_MAJOR.MINOR.PATCH": ".".join(
        macros.get(f"COIO_VERSION_{part}", "?") for part in ("MAJOR", "MINOR", "PATCH")),
    "ports/coio/vcpkg.json version-semver": json.loads(read("ports/coio/vcpkg.json")).get("version-semver"),
    "CHANGELOG.md newest entry": first(r"^## \[(\d+\.\d+\.\d+)\]", read("CHANGELOG.md"), "CHANGELOG.md")[0],
}
if len(sys.argv) > 1:
    inspect = subprocess.run([sys.argv[1], "inspect", str(ROOT), "--format=json"], capture_output=True, text=True)
    found["conanfile.py (conan inspect)"] = json.loads(inspect.stdout).get("version") if inspect.returncode == 0 \
        else f"conan inspect failed: {inspect.stderr.strip()}"

wrong = {where: value for where, value in found.items() if value != version}
for where, value in wrong.items():
    print(f"check_version: {where} is {value!r}, CMakeLists.txt says {version!r}")
if wrong:
    sys.exit(1)
print(f"check_version: {version} everywhere ({', '.join(found)})")
