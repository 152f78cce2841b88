"""The shape limits the engine's sources keep (tests/test_code_shape.py runs it):
no file in csrc/ over MAX_LINES lines, and no function declared or defined
with more than MAX_PARAMS parameters (option structs instead).

The parameter check reads C++ as text: a parameter list is one whose every
entry looks like a declaration ("type name", "type* name = default", a type
alone), so calls, macros and initializer lists do not count.

    python scripts/code_shape.py          # prints what is over, exit 1 if any
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MAX_LINES = 500
MAX_PARAMS = 5
SOURCES = ("*.h", "*.cpp", "*.cu", "*.cuh")

_NAME = re.compile(r"(?<![\w:.>])(~?[A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)*)\s*\(")
# A declared parameter: type words (and template arguments, pointers,
# references), then optionally a name and a default value.
_PARAM = re.compile(
    r"^(?:const\s+|volatile\s+|unsigned\s+|signed\s+|struct\s+|enum\s+)*"
    r"[A-Za-z_][\w:]*(?:<.*>)?(?:\s*const)?[\s*&]*"
    r"(?:\s*(?:const\s*)?[\s*&]*[A-Za-z_]\w*(?:\[[^\]]*\])?)?"
    r"(?:\s*=\s*.+)?$",
    re.S,
)
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "catch", "static_assert",
             "decltype", "alignof", "alignas", "defined", "noexcept", "throw", "new", "delete"}


def _strip(text: str) -> str:
    """Comments and string / char literals blanked (lengths kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        two = text[i:i + 2]
        if two == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif two == "/*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(q + " " * (min(j, n) - i - 1) + (q if j < n else ""))
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _split(args: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in args:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def long_parameter_lists(path: Path) -> list[tuple[int, str, int]]:
    """(line, function, parameters) of the declarations over MAX_PARAMS."""
    text = _strip(path.read_text())
    found = []
    for m in _NAME.finditer(text):
        name = m.group(1)
        if name in _KEYWORDS or re.fullmatch(r"[A-Z][A-Z0-9_]+", name):  # macros: ALL_CAPS
            continue
        i, depth = m.end(), 1
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params = _split(text[m.end():i - 1])
        if len(params) <= MAX_PARAMS:
            continue
        after = text[i:i + 60].lstrip()
        if not re.match(r"(const\b|override\b|noexcept\b|final\b|\{|;|:|->|=\s*0)", after):
            continue
        # "type name" entries, or an unnamed pointer / reference ("char*").
        declared = [(_PARAM.match(p) and " " in p.replace("::", "")) or p.endswith(("*", "&"))
                    for p in params]
        if all(declared):
            found.append((text.count("\n", 0, m.start()) + 1, name, len(params)))
    return found


def check(root: Path) -> list[str]:
    problems = []
    for pattern in SOURCES:
        for path in sorted((root / "csrc").rglob(pattern)):
            rel = path.relative_to(root)
            lines = path.read_text().count("\n")
            if lines > MAX_LINES:
                problems.append(f"{rel}: {lines} lines (at most {MAX_LINES})")
            for line, name, n in long_parameter_lists(path):
                problems.append(f"{rel}:{line}: {name} takes {n} parameters (at most {MAX_PARAMS}: "
                                "pass an options struct)")
    return problems


def main() -> int:
    problems = check(Path(__file__).resolve().parent.parent)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
