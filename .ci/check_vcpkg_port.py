#!/usr/bin/env python3
"""Checks the vcpkg overlay port in ports/coio/ without a vcpkg tool.

vcpkg.json against the rules of vcpkg's manifest schema (vcpkg-tool's
docs/vcpkg.schema.json: fields, name and version formats, dependency and
feature objects, platform expressions), plus what ties the port to this
repository: the version equals project(VERSION) in CMakeLists.txt, every
feature is mapped by vcpkg_check_features, every -D option the portfile
passes is a variable coio's CMake reads, the vcpkg-cmake helpers it calls
have their host dependencies, no deprecated helper is used, and a usage file
exists. Exits 1 listing every problem found.
"""
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PORT = ROOT / "ports" / "coio"

IDENTIFIER = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
PACKAGE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*(\.[a-z0-9]+(-[a-z0-9]+)*)*$")
RESERVED = {"prn", "aux", "nul", "con", "core", "default"} | {f"{p}{i}" for p in ("lpt", "com") for i in range(1, 10)}
PRERELEASE = r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
BUILD = r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
VERSION_FIELDS = {
    "version": re.compile(r"^\d+(\.\d+)*" + PRERELEASE + BUILD + "$"),
    "version-semver": re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)" + PRERELEASE + BUILD + "$"),
    "version-date": re.compile(r"^\d{4}-\d{2}-\d{2}(\.\d+)*$"),
    "version-string": re.compile(r"^[^#]+$"),
}
TOP_LEVEL_FIELDS = set(VERSION_FIELDS) | {
    "name", "port-version", "maintainers", "summary", "description", "homepage", "documentation", "license",
    "builtin-baseline", "dependencies", "overrides", "features", "default-features", "supports",
    "vcpkg-configuration"}
DEPENDENCY_FIELDS = {"name", "features", "host", "default-features", "platform", "version>="}
FEATURE_FIELDS = {"description", "dependencies", "supports", "license"}
# Platform expression identifiers documented for vcpkg.json "supports"/"platform".
PLATFORMS = {
    "x64", "x86", "arm", "arm32", "arm64", "arm64ec", "wasm32", "mips64", "ppc64le", "riscv32", "riscv64",
    "s390x", "loongarch32", "loongarch64", "android", "emscripten", "freebsd", "ios", "linux", "netbsd",
    "openbsd", "osx", "qnx", "uwp", "visionos", "tvos", "watchos", "windows", "xbox", "mingw", "static",
    "staticcrt", "native"}
DEPRECATED_HELPERS = {
    "vcpkg_configure_cmake": "vcpkg_cmake_configure", "vcpkg_build_cmake": "vcpkg_cmake_build",
    "vcpkg_install_cmake": "vcpkg_cmake_install", "vcpkg_fixup_cmake_targets": "vcpkg_cmake_config_fixup",
    "vcpkg_extract_source_archive_ex": "vcpkg_extract_source_archive", "vcpkg_copy_tool_dependencies": "vcpkg_copy_tools"}

problems = []


def problem(where, message):
    problems.append(f"{where}: {message}")


def no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    for key in {k for k in keys if keys.count(k) > 1}:
        problem("vcpkg.json", f"duplicate key {key!r}")
    return dict(pairs)


def check_fields(where, obj, allowed):
    if not isinstance(obj, dict):
        return problem(where, "must be an object")
    for key in obj:
        if key not in allowed and not key.startswith("$"):
            problem(where, f"unknown field {key!r}")


def check_string_or_strings(where, value):
    if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
        problem(where, "must be a string or an array of strings")


def check_identifier(where, name, pattern=IDENTIFIER):
    if not isinstance(name, str) or not pattern.match(name) or set(name.split(".")) & RESERVED:
        problem(where, f"{name!r} is not a valid vcpkg name")


def check_platform(where, text):
    """vcpkg platform expressions: identifiers, !, (), and & or | (or ','),
    never & and | mixed without parentheses."""
    tokens = re.findall(r"[a-z0-9-]+|[!&|(),]|\S", text) if isinstance(text, str) else None
    if not tokens:
        return problem(where, f"empty or non-string platform expression {text!r}")
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def unary():
        nonlocal pos
        token = peek()
        pos += 1
        if token == "!":
            return unary()
        if token == "(":
            binary()
            if peek() != ")":
                raise ValueError("missing ')'")
            pos += 1
        elif token is None or not IDENTIFIER.match(token):
            raise ValueError(f"unexpected {token!r}")
        elif token not in PLATFORMS:
            raise ValueError(f"unknown platform identifier {token!r}")

    def binary():
        nonlocal pos
        unary()
        ops = set()
        while peek() in ("&", "|", ","):
            ops.add("|" if peek() == "," else peek())
            pos += 1
            unary()
        if len(ops) > 1:
            raise ValueError("mixes & and | without parentheses")

    try:
        binary()
        if pos != len(tokens):
            raise ValueError(f"unexpected {tokens[pos]!r}")
    except ValueError as error:
        problem(where, f"platform expression {text!r}: {error}")


def check_dependencies(where, deps):
    if not isinstance(deps, list):
        return problem(where, "must be an array")
    for i, dep in enumerate(deps):
        at = f"{where}[{i}]"
        if isinstance(dep, str):
            check_identifier(at, dep, PACKAGE_NAME)
            continue
        check_fields(at, dep, DEPENDENCY_FIELDS)
        if not isinstance(dep, dict):
            continue
        check_identifier(f"{at}.name", dep.get("name"), PACKAGE_NAME)
        for flag in ("host", "default-features"):
            if flag in dep and not isinstance(dep[flag], bool):
                problem(f"{at}.{flag}", "must be true or false")
        for feature in dep.get("features", []):
            check_identifier(f"{at}.features", feature)
        if "platform" in dep:
            check_platform(f"{at}.platform", dep["platform"])


def host_dependencies(manifest):
    return {d["name"] for d in manifest.get("dependencies", []) if isinstance(d, dict) and d.get("host")}


def check_manifest(manifest):
    check_fields("vcpkg.json", manifest, TOP_LEVEL_FIELDS)
    if manifest.get("name") != PORT.name:
        problem("vcpkg.json", f"name must be the port directory's name {PORT.name!r}")
    versions = [f for f in VERSION_FIELDS if f in manifest]
    if len(versions) != 1:
        problem("vcpkg.json", f"needs exactly one of {sorted(VERSION_FIELDS)}, has {versions}")
    for field in versions:
        if not isinstance(manifest[field], str) or not VERSION_FIELDS[field].match(manifest[field]):
            problem(f"vcpkg.json.{field}", f"{manifest[field]!r} is not a valid {field}")
    port_version = manifest.get("port-version", 0)
    if not isinstance(port_version, int) or isinstance(port_version, bool) or port_version < 0:
        problem("vcpkg.json.port-version", "must be a non-negative integer")
    if "description" not in manifest:
        problem("vcpkg.json", "a port needs a description")
    for field in ("description", "maintainers"):
        if field in manifest:
            check_string_or_strings(f"vcpkg.json.{field}", manifest[field])
    if "license" in manifest and not (manifest["license"] is None or isinstance(manifest["license"], str)):
        problem("vcpkg.json.license", "must be an SPDX expression or null")
    if "supports" in manifest:
        check_platform("vcpkg.json.supports", manifest["supports"])
    check_dependencies("vcpkg.json.dependencies", manifest.get("dependencies", []))

    features = manifest.get("features", {})
    if not isinstance(features, dict):
        return problem("vcpkg.json.features", "must be an object")
    for name, feature in features.items():
        at = f"vcpkg.json.features.{name}"
        check_identifier(at, name)
        check_fields(at, feature, FEATURE_FIELDS)
        if not isinstance(feature, dict):
            continue
        if "description" not in feature:
            problem(at, "needs a description")
        else:
            check_string_or_strings(f"{at}.description", feature["description"])
        if "supports" in feature:
            check_platform(f"{at}.supports", feature["supports"])
        check_dependencies(f"{at}.dependencies", feature.get("dependencies", []))
    for item in manifest.get("default-features", []):
        name = item.get("name") if isinstance(item, dict) else item
        if name not in features:
            problem("vcpkg.json.default-features", f"{name!r} is not a feature")


def cmake_project_version():
    match = re.search(r"project\(coio\s+VERSION\s+(\S+)", (ROOT / "CMakeLists.txt").read_text())
    return match.group(1) if match else None


def cmake_variables():
    """Every COIO_* name coio's own CMake code mentions."""
    files = [ROOT / "CMakeLists.txt", *(ROOT / "cmake").glob("*.cmake")]
    return set(re.findall(r"\bCOIO_[A-Z0-9_]+", "\n".join(f.read_text() for f in files)))


def check_portfile(manifest):
    portfile = (PORT / "portfile.cmake").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in portfile.splitlines())
    calls = set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", code, re.MULTILINE))

    for old, new in DEPRECATED_HELPERS.items():
        if old in calls:
            problem("portfile.cmake", f"{old} is deprecated: use {new}")
    hosts = host_dependencies(manifest)
    if any(c.startswith("vcpkg_cmake_") and c != "vcpkg_cmake_config_fixup" for c in calls) and "vcpkg-cmake" not in hosts:
        problem("vcpkg.json", "the portfile calls vcpkg_cmake_* but vcpkg-cmake is not a host dependency")
    if "vcpkg_cmake_config_fixup" in calls and "vcpkg-cmake-config" not in hosts:
        problem("vcpkg.json", "the portfile calls vcpkg_cmake_config_fixup but vcpkg-cmake-config is not a host dependency")

    mapped = {}
    block = re.search(r"vcpkg_check_features\((.*?)\)", code, re.DOTALL)
    if block:
        words = block.group(1).split()
        if "FEATURES" in words:
            pairs = words[words.index("FEATURES") + 1:]
            mapped = dict(zip(pairs[::2], pairs[1::2]))
    features = set(manifest.get("features", {}))
    for feature in features - set(mapped):
        problem("portfile.cmake", f"feature {feature!r} is not mapped by vcpkg_check_features")
    for feature in set(mapped) - features:
        problem("portfile.cmake", f"vcpkg_check_features maps {feature!r}, which vcpkg.json does not declare")

    known = cmake_variables()
    options = set(mapped.values()) | set(re.findall(r"-D(COIO_[A-Z0-9_]+)=", code))
    for option in sorted(options - known):
        problem("portfile.cmake", f"{option} is not a variable coio's CMake reads")

    if not (PORT / "usage").is_file():
        problem("ports/coio", "no usage file")
    elif "find_package(coio CONFIG REQUIRED" not in (PORT / "usage").read_text():
        problem("usage", "does not show find_package(coio CONFIG REQUIRED)")
    for path in re.findall(r"\$\{SOURCE_PATH\}/([^\s\")]+)", code):
        if not (ROOT / path).exists():
            print(f"check_vcpkg_port: warning: the portfile uses {path}, which this checkout lacks")


def main():
    try:
        manifest = json.loads((PORT / "vcpkg.json").read_text(), object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as error:
        sys.exit(f"check_vcpkg_port: vcpkg.json is not strict JSON: {error}")
    check_manifest(manifest)
    version = manifest.get("version-semver") or manifest.get("version")
    if version != cmake_project_version():
        problem("vcpkg.json", f"version {version!r} differs from project(VERSION {cmake_project_version()})")
    if "license" not in manifest:
        print("check_vcpkg_port: warning: vcpkg.json has no license field")
    check_portfile(manifest)
    for line in problems:
        print(f"check_vcpkg_port: {line}")
    if problems:
        sys.exit(1)
    print("check_vcpkg_port: ports/coio follows the rules checked")


if __name__ == "__main__":
    main()
