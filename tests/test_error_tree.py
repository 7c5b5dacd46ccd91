"""errors.py is the one place shardstream's errors live (STYLE "Errors"): every error class the product
defines on purpose is there, drawn in its module docstring's tree under its own base, with its base's
gRPC code. Read over the AST of every product module, so a class added elsewhere is reported."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import grpc

from shardstream import errors

REPO = Path(__file__).resolve().parent.parent
PRODUCT = (REPO / "shardstream", REPO / "client", REPO / "server")
ERRORS_PY = REPO / "shardstream" / "errors.py"
TREE_LINE = re.compile(r"^    ([│ ]   |[├└]── )*([├└]── )?(?P<name>[A-Z]\w*(Error|Exception))\b")


def tree_classes() -> dict[str, type[errors.ShardstreamError]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, errors.ShardstreamError)
    }


def drawn_parents() -> dict[str, str | None]:
    """class name -> the name drawn one level up in errors.py's docstring tree (None: the root)."""
    parents: dict[str, str | None] = {}
    path: list[str] = []  # the names drawn at depths 0, 1, ... above the current line
    for line in (errors.__doc__ or "").splitlines():
        m = TREE_LINE.match(line)
        if m is None:
            continue
        depth = (m.start("name") - 4) // 4
        del path[depth:]
        parents[m["name"]] = path[-1] if path else None
        path.append(m["name"])
    return parents


def test_every_error_class_of_the_tree_is_drawn_under_its_base() -> None:
    classes, parents = tree_classes(), drawn_parents()
    assert set(parents) == set(classes), "drawn but not defined, or defined but not drawn"
    for name, cls in classes.items():
        bases = [b.__name__ for b in cls.__bases__ if issubclass(b, errors.ShardstreamError)]
        assert parents[name] == (bases[0] if bases else None), name
        if bases and bases[0] != "ShardstreamError":  # a kind of a kind keeps its base's status code
            assert "grpc_code" not in vars(cls) and cls.grpc_code == getattr(errors, bases[0]).grpc_code, name
    assert {"NoCommittedStepError", "CursorStoreBehindError", "StaleRunError", "CorruptCursorError"} <= set(classes)
    assert errors.UnclaimedError.grpc_code == grpc.StatusCode.UNAVAILABLE


def test_no_product_module_defines_an_error_of_the_tree_elsewhere() -> None:
    known = set(tree_classes())
    found: list[str] = []
    for folder in PRODUCT:
        for path in sorted(folder.rglob("*.py")):
            if path == ERRORS_PY:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & known:
                    found.append(f"{path.relative_to(REPO)}: class {node.name}({', '.join(sorted(bases))})")
    assert not found, "error classes outside shardstream/errors.py:\n" + "\n".join(found)


def test_every_error_class_is_exported() -> None:
    assert set(tree_classes()) <= set(errors.__all__)
