"""The shape limits the engine's sources keep (tests/test_code_shape.py runs it):
no file in csrc/ over MAX_LINES lines; no function or lambda declared or
defined with more than MAX_PARAMS parameters (option structs instead); no
function in csrc/ or python/smdccl/ longer than MAX_FUNCTION_LINES lines.

The C++ checks read the code as text. A parameter list is one whose every
entry looks like a declaration ("type name", "type* name = default", a type
alone), so calls, macros and initializer lists do not count. A function body
is a brace block that follows a parameter list (control statements aside)
outside any other function; lambdas and blocks inside it count towards it.

    python scripts/code_shape.py          # prints what is over, exit 1 if any
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MAX_LINES = 500
MAX_PARAMS = 5
MAX_FUNCTION_LINES = 80
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


# A lambda's parameter list: right after its capture list.
_LAMBDA = re.compile(r"\]\s*\(")
# What may follow a declared parameter list: of a function, of a lambda.
_AFTER_FUNCTION = re.compile(r"(const\b|override\b|noexcept\b|final\b|\{|;|:|->|=\s*0)")
_AFTER_LAMBDA = re.compile(r"(mutable\b|noexcept\b|->|\{)")


def _heads(text: str):
    """(name, where its parameter list opens, what may follow it) of every
    function-like and lambda parameter list in `text`."""
    for m in _NAME.finditer(text):
        name = m.group(1)
        if name in _KEYWORDS or re.fullmatch(r"[A-Z][A-Z0-9_]+", name):  # macros: ALL_CAPS
            continue
        yield m.start(), name, m.end(), _AFTER_FUNCTION
    for m in _LAMBDA.finditer(text):
        yield m.start(), "lambda", m.end(), _AFTER_LAMBDA


def long_parameter_lists(path: Path) -> list[tuple[int, str, int]]:
    """(line, function, parameters) of the declarations (lambdas too) over MAX_PARAMS."""
    text = _strip(path.read_text())
    found = []
    for start, name, opened, follows in _heads(text):
        i, depth = opened, 1
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params = _split(text[opened:i - 1])
        if len(params) <= MAX_PARAMS:
            continue
        if not follows.match(text[i:i + 60].lstrip()):
            continue
        # "type name" entries, or an unnamed pointer / reference ("char*").
        declared = [(_PARAM.match(p) and " " in p.replace("::", "")) or p.endswith(("*", "&"))
                    for p in params]
        if all(declared):
            found.append((text.count("\n", 0, start) + 1, name, len(params)))
    return found


# The end of a function's head: its parameter list, then qualifiers, an
# initializer list or a trailing return type.
_BODY_HEAD = re.compile(r"\)\s*(?:const|override|noexcept|final|mutable|\s)*"
                        r"(?:->[^;{}]*|:[^;{}]*)?$")
_CONTROL = re.compile(r"\b(?:if|for|while|switch|catch)\s*\(")


def long_functions(path: Path) -> list[tuple[int, str, int]]:
    """(line, function, lines) of the C++ function bodies over MAX_FUNCTION_LINES."""
    text = _strip(path.read_text())
    found, stack = [], []  # stack: (opens a function body, where its head starts)
    last = 0  # where the text since the last ; { or } starts
    for i, ch in enumerate(text):
        if ch == "{":
            head = "\n".join(line for line in text[last:i].split("\n")
                             if not line.lstrip().startswith("#"))
            body = (not any(f for f, _ in stack) and bool(_BODY_HEAD.search(head.rstrip()))
                    and not _CONTROL.search(head))
            stack.append((body, last))
        elif ch == "}" and stack:
            body, head_at = stack.pop()
            if body:
                name = _NAME.search(text, head_at, i)
                first = text.count("\n", 0, name.start() if name else head_at) + 1
                lines = text.count("\n", 0, i) + 2 - first
                if lines > MAX_FUNCTION_LINES:
                    found.append((first, name.group(1) if name else "?", lines))
        if ch in ";{}":
            last = i + 1
    return found


def long_python_functions(path: Path) -> list[tuple[int, str, int]]:
    """(line, function, lines) of the Python functions over MAX_FUNCTION_LINES."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append((node.lineno, node.name, lines))
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
            for line, name, n in long_functions(path):
                problems.append(f"{rel}:{line}: {name} is {n} lines (at most "
                                f"{MAX_FUNCTION_LINES}: split it)")
    for path in sorted((root / "python" / "smdccl").rglob("*.py")):
        for line, name, n in long_python_functions(path):
            problems.append(f"{path.relative_to(root)}:{line}: {name} is {n} lines (at most "
                            f"{MAX_FUNCTION_LINES}: split it)")
    return problems


def main() -> int:
    problems = check(Path(__file__).resolve().parent.parent)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
