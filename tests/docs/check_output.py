#!/usr/bin/env python3
"""Runs a guide's example and compares what it prints with the ```output
block under it on its page (scripts/extract_examples.py writes it to
EXPECTED):
  tests/docs/check_output.py EXPECTED PROGRAM [ARGS...]
Fails when the program fails (its exit status is passed on) or when its
standard output does not match. Lines match exactly, but for trailing
blanks, except that in an expected line `...` stands for any text (a
figure that changes from run to run), and a line that is only `...` for any
number of lines, none included. Standard error is not compared.
"""
import functools
import re
import subprocess
import sys


def pattern(line):
    return re.compile(".*".join(map(re.escape, line.split("..."))))


def matches(expected, actual):
    @functools.lru_cache(maxsize=None)
    def match(e, a):
        if e == len(expected):
            return a == len(actual)
        if expected[e] == "...":
            return any(match(e + 1, b) for b in range(a, len(actual) + 1))
        return a < len(actual) and pattern(expected[e]).fullmatch(actual[a]) is not None and match(e + 1, a + 1)

    return match(0, 0)


def lines(text):
    return [line.rstrip() for line in text.rstrip("\n").split("\n")] if text.strip() else []


def main():
    with open(sys.argv[1]) as f:
        expected = lines(f.read())
    run = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, text=True, errors="replace")
    sys.stdout.write(run.stdout)
    if run.returncode != 0:
        print(f"check_output.py: the example exited with status {run.returncode}")
        return run.returncode if run.returncode > 0 else 1
    if not matches(tuple(expected), tuple(lines(run.stdout))):
        print("check_output.py: the output above does not match the page's ```output block:")
        print("\n".join(expected))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
