#!/usr/bin/env python3
"""Writes every ```cpp block that defines main() in the given Markdown files
to OUTDIR/<page>_<n>.cpp (<page>: readme for README.md, docs_<name> for
docs/<name>.md), so the examples of the README and the guides are compiled
and run by the test suite instead of rotting. Prints the written paths.
  scripts/extract_examples.py OUTDIR PAGE.md...
"""
import pathlib
import re
import sys

outdir = pathlib.Path(sys.argv[1])
outdir.mkdir(parents=True, exist_ok=True)
for markdown in map(pathlib.Path, sys.argv[2:]):
    page = "readme" if markdown.name == "README.md" else "docs_" + re.sub(r"\W", "_", markdown.stem)
    blocks = re.findall(r"^```cpp\n(.*?)^```", markdown.read_text(), re.S | re.M)
    for n, code in enumerate(b for b in blocks if re.search(r"\bint main\(", b)):
        path = outdir / f"{page}_{n}.cpp"
        if not path.exists() or path.read_text() != code:
            path.write_text(code)
        print(path)
