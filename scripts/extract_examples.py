#!/usr/bin/env python3
"""Writes the runnable examples of the given Markdown files, so that the
examples of the README and the guides are compiled and run by the test
suite instead of rotting. Prints the written paths.
  scripts/extract_examples.py OUTDIR PAGE.md...
<page> is readme for README.md, docs_<name> for docs/<name>.md.
- Every ```cpp block that defines main() goes to OUTDIR/<page>_<n>.cpp.
- Every shell block fenced ```sh run goes to OUTDIR/<page>_sh<n>.sh, after
  the page's ```sh setup blocks above it (what the page has the reader do
  before it). tests/docs/run_sh_example.sh runs it. GitHub takes the first
  word of a fence's info string as the language, so these still render as sh.
"""
import pathlib
import re
import sys


def write(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    print(path)


outdir = pathlib.Path(sys.argv[1])
outdir.mkdir(parents=True, exist_ok=True)
for markdown in map(pathlib.Path, sys.argv[2:]):
    page = "readme" if markdown.name == "README.md" else "docs_" + re.sub(r"\W", "_", markdown.stem)
    blocks = re.findall(r"^```([^\n]*)\n(.*?)^```", markdown.read_text(), re.S | re.M)
    cpp = [code for info, code in blocks if info.split()[:1] == ["cpp"] and re.search(r"\bint main\(", code)]
    for n, code in enumerate(cpp):
        write(outdir / f"{page}_{n}.cpp", code)
    setup, runs = "", 0
    for info, code in blocks:
        words = info.split()
        if words[:1] != ["sh"] or len(words) < 2:
            continue
        if words[1:] == ["setup"]:
            setup += code
        elif words[1:] == ["run"]:
            write(outdir / f"{page}_sh{runs}.sh", setup + code)
            runs += 1
        else:
            sys.exit(f"{markdown}: unknown shell block kind '{info}' (sh setup or sh run)")
