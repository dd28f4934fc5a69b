"""docs/errors.md cannot go stale: every row's test exists and asserts the row's exit code, and
every literal fragment of the row's message (the text between the values the code fills in:
`<placeholders>`, `...`, quoted values, paths, parenthesised details) is in the code's strings or
the test's. A message reworded in the code fails here until its row is."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
MIN_FRAGMENT = 12          # shorter literal pieces (a quoted value, "; ") say nothing on their own


def _rows() -> list[tuple[str, dict]]:
    """(section, {column: cell}) for every table row of the page."""
    rows, section, header = [], "", None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
        elif line.startswith("|"):
            cells = [c.strip() for c in _split_cells(line)]
            if header is None:
                header = [c.lower() for c in cells]
            elif not set("".join(cells)) <= set("-: "):
                rows.append((section, dict(zip(header, cells))))
        else:
            header = None
    return rows


def _split_cells(line: str) -> list[str]:
    """Cells of a table row; a `|` inside backticks belongs to its cell."""
    cells, cell, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cell)
            cell = ""
        else:
            cell += ch
    return cells + [cell]


ROWS = _rows()


def _tests(cell: str, previous: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(module, function) pairs a test cell names: `test_mod::test_fn`, `::test_fn` (the module
    before), `same` (the row above's), prose around them."""
    if cell.strip().startswith("same"):
        return previous
    found, module = [], None
    for mod, fn in re.findall(r"(test_\w+)?::(test_\w+)", cell):
        module = mod or module
        found.append((module, fn))
    return found


@cache
def _module(name: str) -> tuple[ast.Module, list[str]]:
    """A test module's AST and the literal pieces of its strings (f-string holes split them;
    regex escapes undone), where a message may be asserted."""
    tree = ast.parse((ROOT / "tests" / f"{name}.py").read_text())
    pieces = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            pieces.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            pieces += [v.value for v in node.values if isinstance(v, ast.Constant)]
    return tree, [re.sub(r"\\(.)", r"\1", p) for p in pieces] + pieces


def _function(module: str, name: str) -> ast.FunctionDef | None:
    tree, _ = _module(module)
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


# where a message holds a value the code fills in: a <placeholder>, an elision, a quoted value, a
# path, a parenthesised detail (an OS error's words, a pid and a time)
_FILLED = re.compile(r"<[a-z_]+>|\.\.\.|—|'[^']*'|\S*/\S*|\([^()]*\)|\b\d[\d.:]*\b")


def _source_with_helpers(module: str, name: str, depth: int = 2) -> str:
    """A test function's source and that of the module's functions it calls (assertion helpers)."""
    fn = _function(module, name)
    if fn is None:
        return ""
    called = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    helpers = [_source_with_helpers(module, c, depth - 1) for c in sorted(called) if depth and c != name]
    return "\n".join([ast.unparse(fn), *helpers])


def _fragments(message: str) -> list[str]:
    parts = (p.strip(" ;,:()") for p in _FILLED.split(message))
    return [p for p in parts if len(p) >= MIN_FRAGMENT]


@cache
def _code_strings() -> tuple[list[str], list[list[str]]]:
    """Every string literal in omni_export/, and each f-string as its literal pieces (the holes between)."""
    literals, templates = [], []
    for f in sorted((ROOT / "omni_export").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                pieces, piece = [], ""
                for v in node.values:
                    if isinstance(v, ast.Constant):
                        piece += v.value
                    else:
                        pieces.append(piece)
                        piece = ""
                templates.append(pieces + [piece])
                literals += pieces + [piece]
    return literals, templates


def _filled_in(fragment: str, template: list[str]) -> bool:
    """Whether `fragment` is a stretch of some text the f-string `template` makes: it starts inside
    a literal piece (or a hole), takes every piece after it in order, anything in the holes, and
    ends inside a later piece (or a hole)."""
    def tail(piece):       # the fragment may start anywhere inside its first piece, or in the hole after it
        return "(?:" + "|".join(re.escape(piece[k:]) for k in range(len(piece) + 1)) + ")"

    def head(piece):       # and stop anywhere inside its last, or in the hole before it
        return "(?:" + "|".join(re.escape(piece[:k]) for k in range(len(piece) + 1)) + ")"

    n = len(template)
    for i in range(n):
        for j in range(i + 1, n):
            pattern = ".*?".join([tail(template[i]), *map(re.escape, template[i + 1:j]), head(template[j])])
            if re.fullmatch(pattern, fragment, re.S):
                return True
    return False


def _in_code(fragment: str) -> bool:
    literals, templates = _code_strings()
    if any(fragment in p for p in literals):
        return True
    return any(_filled_in(fragment, t) for t in templates
               if any(len(p.strip(" ;,:()")) >= 5 and p.strip(" ;,:()") in fragment for p in t))


def _messages(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def _row_id(i: int) -> str:
    section, row = ROWS[i]
    return f"{section[:24]}: {(row.get('bad input') or row.get('event') or '')[:40]}"


def test_the_page_has_its_tables():
    assert len(ROWS) >= 60
    assert all("exit" in row for _, row in ROWS), "every table has an exit column"


@pytest.mark.parametrize("i", range(len(ROWS)), ids=_row_id)
def test_each_row_is_held_by_a_test_that_asserts_its_message_and_exit_code(i):
    section, row = ROWS[i]
    previous: list[tuple[str, str]] = []
    for _, r in ROWS[:i + 1]:
        previous = _tests(r.get("test", ""), previous)
    tests = previous
    if row.get("test", "").strip() in ("—", "-", ""):
        pytest.skip("no test named (the row says what is not tested yet)")
    assert tests, f"no test named in {row.get('test')!r}"
    for module, fn in tests:
        assert (ROOT / "tests" / f"{module}.py").is_file(), f"tests/{module}.py does not exist"
        assert _function(module, fn) is not None, f"{module}::{fn} does not exist"
    message_cell = row.get("message") or row.get("what happens") or ""
    messages = [m for m in _messages(message_cell) if len(m) >= MIN_FRAGMENT]
    assert messages, f"no message in {message_cell!r}"
    pieces = [p for module, _ in tests for p in _module(module)[1]]
    for message in messages:
        if message.startswith(("Invalid value for", "Error:")):
            continue                        # click's own words, asserted by the named test's pattern
        for fragment in _fragments(message):
            assert any(fragment in p for p in pieces) or _in_code(fragment), \
                f"{fragment!r} (of {message!r}) is in neither the code nor {', '.join(m + '::' + f for m, f in tests)}"
    exit_code = row["exit"].strip("* ")
    assert exit_code.isdigit(), f"exit {row['exit']!r} is not a number"
    sources = "\n".join(_source_with_helpers(m, f) for m, f in tests)
    asserted = {int(c) for c in re.findall(r"(?:returncode|exit_code|code|status)\s*==\s*(\d+)", sources)}
    # an expected code passed to an assertion helper, or its default there (`code: int = 2`)
    asserted |= {int(c) for c in re.findall(r"\b(?:EXIT_\w+|exit|code|exit_code)\s*(?::\s*\w+)?\s*=\s*(\d+)", sources)}
    if "UsageError" in sources:
        asserted.add(2)                      # raised in-process: the CLI maps UsageError to exit 2
    assert int(exit_code) in asserted, f"exit {exit_code} is asserted by none of {tests}"
