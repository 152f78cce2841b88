"""The engine's sources keep their shape (scripts/code_shape.py): no file in
csrc/ over 500 lines, no function or lambda taking more than 5 parameters
(option structs instead), no function in csrc/ or python/smdccl/ over 80
lines. The checker itself is tested on sources made to break
each rule, so that a pass means something."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import code_shape  # noqa: E402


def test_csrc_keeps_its_shape():
    problems = code_shape.check(ROOT)
    assert problems == [], "\n".join(problems)


def _tree(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / "csrc").mkdir(exist_ok=True)
    (tmp_path / "csrc" / name).write_text(text)
    return tmp_path


def test_a_long_parameter_list_is_found(tmp_path):
    src = """
// a comment with f(a, b, c, d, e, f) in it is no declaration
namespace x {
int six(Comm& c, char* buf, size_t count, DType dt, RedOp op, const Tuning& t);
void five(Comm& c, char* buf, size_t count, DType dt, RedOp op) {
  six(c, buf, count, dt, op, tuning());  // a call, not a declaration
  SMDCCL_WARN("a", 1, 2, 3, 4, 5, 6);    // a macro
}
struct S {
  S(int a, int b, int c, int d, int e, std::function<void()> f = nullptr) : a_(a) {}
  virtual int v(const std::vector<int>& a, int b, int c, int d, int e, bool f) const = 0;
};
}
"""
    found = code_shape.check(_tree(tmp_path, "a.h", src))
    assert [p.split(": ", 1)[1].split(" takes")[0] for p in found] == ["six", "S", "v"], found
    assert all("6 parameters" in p for p in found), found


def test_a_long_file_is_found(tmp_path):
    root = _tree(tmp_path, "long.cpp", "int x;\n" * (code_shape.MAX_LINES + 1))
    assert code_shape.check(root) == [f"csrc/long.cpp: {code_shape.MAX_LINES + 1} lines (at most "
                                      f"{code_shape.MAX_LINES})"]
    root = _tree(tmp_path, "long.cpp", "int x;\n" * code_shape.MAX_LINES)
    assert code_shape.check(root) == []


def test_a_lambda_with_too_many_parameters_is_found(tmp_path):
    src = """
auto plan = [](const std::string& a, int b, int c, int d, double e, bool f) { return b; };
auto fine = [&](int a, int b) mutable { return a + b; };
int x = table[i](a, b, c, d, e, f);  // a call through an array, not a lambda
"""
    found = code_shape.check(_tree(tmp_path, "l.cpp", src))
    assert found == ["csrc/l.cpp:2: lambda takes 6 parameters (at most 5: pass an options struct)"]


def _cpp_function(name: str, lines: int) -> str:
    """A definition of `lines` lines: head, a loop and a lambda inside, body, brace."""
    inner = ["  for (int i = 0; i < 3; ++i) {", "    auto f = [&](int k) { return k; };", "  }"]
    body = ["  x += 1;"] * (lines - 2 - len(inner))
    return "\n".join([f"int {name}(int x) const {{"] + inner + body + ["}"]) + "\n"


def test_a_long_function_is_found(tmp_path):
    n = code_shape.MAX_FUNCTION_LINES
    src = ("namespace a {\nstruct S {\n" + _cpp_function("longer", n + 1) + "};\n"
           + _cpp_function("S::fits", n) + "}  // namespace a\n")
    found = code_shape.check(_tree(tmp_path, "f.cpp", src))
    assert found == [f"csrc/f.cpp:3: longer is {n + 1} lines (at most {n}: split it)"], found


def test_a_long_python_function_is_found(tmp_path):
    n = code_shape.MAX_FUNCTION_LINES
    pkg = tmp_path / "python" / "smdccl"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text("def fits():\n" + "    x = 1\n" * (n - 1)
                              + "\n\ndef longer():\n" + "    x = 1\n" * n)
    found = code_shape.check(tmp_path)
    assert found == [f"python/smdccl/m.py:{n + 3}: longer is {n + 1} lines (at most {n}: "
                     "split it)"], found
