#!/usr/bin/env python3
"""Doxygen input filter for coio's headers (docs/Doxyfile, FILTER_PATTERNS).

A public alias of an internal type, `using Name = detail::...;`, is what an
operation returns (`Semaphore::AcquireAwaitable`): its doc comment says what
the user can do with it (what `co_await` yields, which thread resumes the
coroutine, what cancels it). Doxygen would print the internal type as the
alias's definition; this filter makes it `unspecified`, as the standard
library's documentation does for such types. Line numbers are kept.

  apidocs_filter.py HEADER   (prints the filtered header on stdout)
"""
import re
import sys

ALIAS_OF_INTERNAL = re.compile(r"(\busing\s+\w+\s*=\s*)(?:typename\s+)?detail::[^;]*;")


def unspecified(match: re.Match) -> str:
    return match.group(1) + "unspecified;" + "\n" * match.group(0).count("\n")


with open(sys.argv[1], encoding="utf-8") as header:
    sys.stdout.write(ALIAS_OF_INTERNAL.sub(unspecified, header.read()))
