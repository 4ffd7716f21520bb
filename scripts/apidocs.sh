#!/usr/bin/env bash
# Builds coio's API reference with Doxygen (docs/Doxyfile) from the headers'
# doc comments; fails on any warning, e.g. an undocumented public name.
#   scripts/apidocs.sh [OUT_DIR]     (default build-apidocs; open OUT_DIR/html/index.html)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-build-apidocs}")
command -v doxygen >/dev/null ||
  { echo "apidocs: doxygen not found (apt-get install doxygen; scripts/install-deps.sh installs it)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
version=$(sed -n 's/^#define COIO_VERSION "\(.*\)"$/\1/p' include/coio/core/version.hpp)
echo "apidocs: $(doxygen --version | head -1), coio $version"
if ! COIO_APIDOCS_REPO=$(realpath -m --relative-to="$out/html" .) COIO_VERSION=$version COIO_APIDOCS_OUT=$out doxygen docs/Doxyfile || [[ -s $out/warnings.log ]]; then
  cat "$out/warnings.log"
  echo "apidocs: FAILED: $(wc -l <"$out/warnings.log") warning(s) above; document the names (/// comments)" >&2
  exit 1
fi
echo "apidocs: $out/html/index.html, no warnings"
