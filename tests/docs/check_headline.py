#!/usr/bin/env python3
"""The README's results table is docs/benchmarks.md's headline table.

  check_headline.py README.md docs/benchmarks.md

Both hold the table between `<!-- headline table: begin -->` and `<!-- headline
table: end -->`; the README's links point into docs/benchmarks.md, the page's
at its own sections. Checks that the two are the same table, that every row
has a reference, a goal (a least figure: "≥ ..."), a current figure and
whether it is met, and that no cell names a time only its writer knew
("today", "issue 19", "session 6"): dates and commits go in the sections.
"""
import re
import sys

BEGIN = "<!-- headline table: begin -->"
END = "<!-- headline table: end -->"


def table(path):
    text = open(path, encoding="utf-8").read()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"{path}: expected one headline table between '{BEGIN}' and '{END}'")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip().splitlines()


def main():
    readme, page = sys.argv[1], sys.argv[2]
    ours = table(page)
    theirs = [line.replace("](docs/benchmarks.md#", "](#") for line in table(readme)]
    problems = []
    if ours != theirs:
        for a, b in zip(ours + [""] * len(theirs), theirs + [""] * len(ours)):
            if a != b:
                problems.append(f"differs:\n  {page}: {a}\n  {readme}: {b}")
                break
    header = [c.strip() for c in ours[0].strip("|").split("|")]
    if header != ["what", "reference", "goal", "current", "met", "how"]:
        problems.append(f"{page}: the header is {header}")
    for row in ours[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 6 or not all(cells):
            problems.append(f"a row without every cell: {row}")
            continue
        if not cells[2].startswith("≥"):
            problems.append(f"{cells[0]}: the goal '{cells[2]}' is not a least figure (≥)")
        if not re.search(r"\d", cells[3]):
            problems.append(f"{cells[0]}: no current figure")
        if not re.search(r"\b(yes|no)\b", cells[4]):
            problems.append(f"{cells[0]}: 'met' says neither yes nor no")
        if re.search(r"\b(today|yesterday|issue \d+|session \d+)\b", row, re.I):
            problems.append(f"{cells[0]}: names a time only its writer knew: {row}")
    for p in problems:
        print("check_headline: " + p)
    if problems:
        return 1
    print(f"check_headline: {len(ours) - 2} rows, the same in {readme} and {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
