"""Support code has one home: no test module imports another test module or conftest (they import
tests/support/), and loadtest/ never imports tests/. Checked over the AST, imports inside functions
included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKED = sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "loadtest").rglob("*.py")])


def imported(code: str, module: str, *, is_package: bool = False) -> list[str]:
    """Every module the code of `module` imports, as an absolute dotted name (relative ones resolved)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.module:
                out.append(".".join([*base, node.module]))
            else:
                out += [".".join([*base, a.name]) for a in node.names]
    return out


def forbidden(code: str, module: str, *, is_package: bool = False) -> list[str]:
    names = imported(code, module, is_package=is_package)
    if module.split(".")[0] == "loadtest":
        return [n for n in names if n.split(".")[0] == "tests"]
    return [
        n
        for n in names
        if n.split(".")[0] == "tests"
        and len(n.split(".")) > 1
        and (n.split(".")[1] == "conftest" or n.split(".")[1].startswith("test_"))
    ]


def module_of(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(REPO).with_suffix("").parts
    return (".".join(parts[:-1]), True) if parts[-1] == "__init__" else (".".join(parts), False)


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_test_module_imports_another_or_conftest_and_loadtest_never_imports_tests(path: Path) -> None:
    module, is_package = module_of(path)
    assert forbidden(path.read_text(), module, is_package=is_package) == []


@pytest.mark.parametrize(
    ("module", "code", "bad"),
    [
        ("tests.test_a", "from .conftest import N_ROWS\n", ["tests.conftest"]),
        ("tests.test_a", "from . import conftest, media\n", ["tests.conftest"]),
        ("tests.test_b", "def f():\n    from .test_a import x\n", ["tests.test_a"]),
        ("tests.support.c", "from ..test_a import x\n", ["tests.test_a"]),
        ("tests.support.c", "import tests.test_a\n", ["tests.test_a"]),
        ("loadtest.d", "import tests.support.seaweed\n", ["tests.support.seaweed"]),
        ("loadtest.e", "from tests import support\n", ["tests"]),
        ("tests.test_a", "from .support.data import N_ROWS\nfrom loadtest.seaweed import BUCKET\n", []),
        ("loadtest.f", "from .seaweed import BUCKET\nfrom loadtest import common\n", []),
    ],
)
def test_the_check_sees_the_imports_it_forbids(module: str, code: str, bad: list[str]) -> None:
    assert forbidden(code, module) == bad


def test_relative_imports_resolve_from_the_package() -> None:
    assert imported("from .support.data import N_ROWS\n", "tests.conftest") == ["tests.support.data"]
    assert imported("from . import media\n", "tests.support", is_package=True) == ["tests.support.media"]
    assert imported("from ..data import x\n", "tests.support.sub.mod") == ["tests.support.data"]
