#!/usr/bin/env python3
"""Writes every ```cpp block of a Markdown file that defines main() to
OUTDIR/readme_example_<n>.cpp, so the README's examples are compiled and run
by the test suite instead of rotting. Prints the written paths."""
import pathlib
import re
import sys

markdown, outdir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
outdir.mkdir(parents=True, exist_ok=True)
blocks = re.findall(r"^```cpp\n(.*?)^```", markdown.read_text(), re.S | re.M)
for n, code in enumerate(b for b in blocks if re.search(r"\bint main\(", b)):
    path = outdir / f"readme_example_{n}.cpp"
    if not path.exists() or path.read_text() != code:
        path.write_text(code)
    print(path)
