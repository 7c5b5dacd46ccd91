"""DESIGN §2: one-way layers and no import cycles, checked over the AST of every product module.

The rule (imports inside functions and under TYPE_CHECKING count: they are edges all the same):

    core   shardstream.* (errors, manifest, registry, storage, ...)  ->  core only
    order  shardstream.order.*                                         ->  core and order
    client shardstream.client.*  (client/)                            ->  core, order and client
    server shardstream.server.*  (server/)                            ->  core, order and server
    facade shardstream.checkpoint                                     ->  core, order and client (the
                                                                          public path of a client API)
    entry  shardstream.cli.*, .demo.*, .viz.*, .engines.*, __main__   ->  anything (the only code that
                                                                          sees both sides)

and no cycle between modules. Any module outside the entry-point folders that imports a side is
reported. An edge goes to the module an import names: `from a.b import c` is an edge to `a.b.c` when
that is a module, else to `a.b`; importing a submodule does not count as an edge to its parent package.

Inside each side, wings in an order (SERVER_WINGS, CLIENT_WINGS, lowest first): a module imports its
own wing and lower ones, never a higher wing nor a peer (two wings on one line):

    server  backends, policy -> transforms -> read -> checkpoints, writing -> serving -> the top
            (a sub-package is a wing; the modules at server/'s root are the top: lifecycle,
            worker_process, local_fleet)
    client  base -> transport -> cursors, checkpoint -> reads -> integrations -> the top (the package's
            public names) (the sub-packages are wings; each flat module is placed in CLIENT_MODULES)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# import name -> folder (pyproject's package-dir)
PACKAGES = {
    "shardstream": REPO / "shardstream",
    "shardstream.client": REPO / "client",
    "shardstream.server": REPO / "server",
}
GENERATED = ("shardstream.v1.",)
ENTRY_POINTS = (
    "shardstream.cli",  # the command line, one module per command group
    "shardstream.demo",  # `shardstream demo`: a fleet, ranks and a resume in one process tree
    "shardstream.viz",  # the visualizers read through the client and may start a server (--root)
    "shardstream.engines",  # Spark and Ray adapters: the server's writer and checksums in the engine's tasks
)  # the folders that may import both sides
ORDER = "shardstream.order"
# Public import paths of a client API that issues name at the top (`from shardstream.checkpoint import
# Checkpointer`): a re-export of the client's, which a client-only install has; never of the server.
FACADES = ("shardstream.checkpoint",)


def product_sources() -> dict[str, str]:
    """module name -> source, for every module of the distribution."""
    out: dict[str, str] = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if name.startswith(GENERATED):
                continue
            out[name] = path.read_text()
    return out


def is_package(name: str, sources: Mapping[str, str]) -> bool:
    return any(m.startswith(name + ".") for m in sources) or name in PACKAGES


def edges(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the product modules it imports (anywhere in its body)."""
    out: dict[str, set[str]] = {}
    for mod, text in sources.items():
        pkg = mod if is_package(mod, sources) else mod.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(text)):
            names: Iterable[str]
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in sources:  # `import a.b.c` of an attribute path: its module
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    targets.add(name)
        out[mod] = targets
    return out


def layer(mod: str) -> str:
    if mod == "shardstream.__main__" or any(mod == p or mod.startswith(p + ".") for p in ENTRY_POINTS):
        return "entry"
    if mod in FACADES:
        return "facade"
    for side in ("client", "server"):
        if mod == f"shardstream.{side}" or mod.startswith(f"shardstream.{side}."):
            return side
    if mod == ORDER or mod.startswith(ORDER + "."):
        return "order"
    return "core"


ALLOWED = {
    "core": {"core"},
    "order": {"core", "order"},
    "client": {"core", "order", "client"},
    "server": {"core", "order", "server"},
    "facade": {"core", "order", "client"},
    "entry": {"core", "order", "client", "server", "facade", "entry"},
}


def forbidden_edges(graph: Mapping[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} ({layer(a)}) imports {b} ({layer(b)})"
        for a, targets in graph.items()
        for b in targets
        if layer(b) not in ALLOWED[layer(a)]
    )


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# --- the product ----------------------------------------------------------------------------------
def test_the_tree_is_read_as_expected() -> None:
    sources = product_sources()
    for mod in (
        "shardstream.order.read_order",
        "shardstream.errors",
        "shardstream.client.loader",
        "shardstream.server.serving.control_plane",
    ):
        assert mod in sources
    graph = edges(sources)
    # the checker sees relative imports, imports inside functions and `from pkg import module`
    assert "shardstream.client.loader" in graph["shardstream.client"]
    assert "shardstream.errors" in graph["shardstream.order.read_order"]


def test_no_forbidden_import_between_layers() -> None:
    bad = forbidden_edges(edges(product_sources()))
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_no_import_cycle_between_modules() -> None:
    found = cycles(edges(product_sources()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


# --- the checker itself fails where it should -----------------------------------------------------
def with_extra(module: str, line: str) -> dict[str, str]:
    sources = product_sources()
    sources[module] = sources.get(module, "") + "\n" + line + "\n"
    return sources


@pytest.mark.parametrize(
    ("module", "line", "edge"),
    [
        # the shared package reaching into a side, even inside a function
        (
            "shardstream.order.read_order",
            "def f():\n    from shardstream.server.read import reader",
            "shardstream.server.read.reader",
        ),
        ("shardstream.storage", "import shardstream.client.loader", "shardstream.client.loader"),
        # the core reaching into the order wing, or into an entry point
        ("shardstream.manifest", "from shardstream.order import mixture", "shardstream.order.mixture"),
        ("shardstream.registry", "from shardstream.cli import common", "shardstream.cli.common"),
        # the order wing reaching into a side or an entry point
        ("shardstream.order.curriculum", "from shardstream.client import loader", "shardstream.client.loader"),
        ("shardstream.order.explain", "from shardstream.engines import spark_io", "shardstream.engines.spark_io"),
        # a side importing an entry point
        ("shardstream.server.policy.auth", "from shardstream.cli import common", "shardstream.cli.common"),
        # a facade of a client API reaching into the server
        ("shardstream.checkpoint", "from shardstream.server import checkpoints", "shardstream.server.checkpoints"),
        # the client importing the server, relatively
        ("shardstream.client.convert", "from ..server.serving import control_plane", "shardstream.server.serving.control_plane"),
        # the server importing the client
        (
            "shardstream.server.read.cache",
            "from shardstream.client.loader import Loader",
            "shardstream.client.loader",
        ),
    ],
)
def test_a_forbidden_import_is_reported(module: str, line: str, edge: str) -> None:
    bad = forbidden_edges(edges(with_extra(module, line)))
    assert any(b.startswith(f"{module} ") and f" imports {edge} " in b for b in bad), bad


@pytest.mark.parametrize(
    "module", ["shardstream.demo.run", "shardstream.cli.serve", "shardstream.viz.query", "shardstream.engines.ray_io"]
)
def test_the_entry_points_may_import_both_sides(module: str) -> None:
    sources = with_extra(module, "from shardstream.server.local_fleet import LocalServer\nimport shardstream.client.loader")
    graph = edges(sources)
    assert {"shardstream.server.local_fleet", "shardstream.client.loader"} <= graph[module]
    assert not [b for b in forbidden_edges(graph) if b.startswith(f"{module} ")]


def test_every_product_module_is_in_a_named_layer() -> None:
    """The layers are the folders DESIGN §2 names: a new top-level module of the shared package is core."""
    for mod in product_sources():
        top = mod.split(".")[1] if "." in mod else ""
        expected = {
            "client": "client",
            "server": "server",
            "order": "order",
            **dict.fromkeys(("cli", "demo", "viz", "engines", "__main__"), "entry"),
        }.get(top, "core")
        expected = "facade" if mod in FACADES else expected
        assert layer(mod) == expected, mod


def test_a_cycle_is_reported() -> None:
    # errors is imported by read_order; errors importing read_order closes the loop
    found = cycles(edges(with_extra("shardstream.errors", "def f():\n    from shardstream.order import read_order")))
    assert any({"shardstream.errors", "shardstream.order.read_order"} <= set(c) for c in found), found


def test_the_distribution_lists_every_package() -> None:
    """A package folder missing from pyproject's `packages` works in a checkout and is absent from the wheel."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {m for m in product_sources() if is_package(m, product_sources())} | {"shardstream.v1"}
    assert found == listed, (
        f"missing from pyproject: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"
    )


# --- wings inside a side: each imports its own wing and lower ones ---------------------------------
TOP = "top"  # the package itself and, on the server, the modules at its root
# Lowest first; wings on one line are peers and import neither of each other.
SERVER_WINGS: tuple[tuple[str, ...], ...] = (
    ("backends", "policy"),  # storage roots by URL; principals, grants, redaction, the dataset label
    ("transforms",),  # named server-side transforms (the read planner builds their pipeline)
    ("read",),  # the read path: request -> plan -> messages; shards, checksums, caches
    ("checkpoints", "writing"),  # the checkpoint store and its Flight calls; ingest, register, materialize
    ("serving",),  # both planes, admission, security, metrics, the supervisor, ServerConfig
    (TOP,),  # lifecycle.py (one process's serve), worker_process.py, local_fleet.py
)
CLIENT_WINGS: tuple[tuple[str, ...], ...] = (
    ("base",),  # small values and pure helpers: what a Loader reads, its state, credentials, metrics
    ("transport",),  # transport/: the one session to the fleet: channels, Flight calls, retries, failover
    ("cursors", "checkpoint"),  # job cursors and their stores; checkpoints of model state (sub-packages)
    ("reads",),  # the Loader, the step reader and what feeds them: options, prefetch, decode
    ("integrations",),  # training frameworks over the Loader and the Checkpointer (a sub-package)
    (TOP,),  # shardstream.client: the public names
)
# The client's flat modules by wing (its sub-packages are wings of their own): a new module is placed here.
CLIENT_MODULES = {
    "base": ("batch", "convert", "credentials", "launcher", "loader_state", "metrics", "parts", "spec", "step_timings", "target"),
    "reads": (
        "decode",
        "loader",
        "loader_options",
        "prefetch",
        "schedule_state",
        "step_reader",
        "striped",
        "torch_dataset",
    ),
}
SIDE_WINGS = {"shardstream.server": SERVER_WINGS, "shardstream.client": CLIENT_WINGS}


def wing(mod: str, sources: Mapping[str, str]) -> tuple[str, str] | None:
    """(side, wing) of a module of a side, None for any other module. A wing of the server is its
    sub-package; a module at its root is the top. The client's flat modules are placed in CLIENT_MODULES
    ("?" when one is not)."""
    for side in SIDE_WINGS:
        if mod == side:
            return side, TOP
        if not mod.startswith(side + "."):
            continue
        first = mod[len(side) + 1 :].split(".")[0]
        if is_package(f"{side}.{first}", sources):
            return side, first
        if side == "shardstream.server":
            return side, TOP
        return side, next((w for w, mods in CLIENT_MODULES.items() if first in mods), "?")
    return None


def upward_imports(graph: Mapping[str, set[str]], sources: Mapping[str, str]) -> list[str]:
    """Each import of a module of a side into a higher wing or a peer wing of that side."""
    bad = []
    for a, targets in graph.items():
        here = wing(a, sources)
        if here is None:
            continue
        side, wa = here
        rank = {w: i for i, peers in enumerate(SIDE_WINGS[side]) for w in peers}
        for b in sorted(targets):
            there = wing(b, sources)
            if there is None or there[0] != side or there[1] == wa:
                continue
            wb = there[1]
            if wa not in rank or wb not in rank:
                bad.append(f"{a} ({wa}) imports {b} ({wb}): a wing test_layers.py does not name")
            elif rank[wb] > rank[wa]:
                bad.append(f"{a} ({wa}) imports {b} ({wb}): a higher wing")
            elif rank[wb] == rank[wa]:
                bad.append(f"{a} ({wa}) imports {b} ({wb}): a peer wing")
    return sorted(bad)


def test_the_wings_of_each_side_import_downward_only() -> None:
    sources = product_sources()
    bad = upward_imports(edges(sources), sources)
    assert not bad, "imports against the wing order:\n" + "\n".join(bad)


def test_every_wing_is_named_in_the_order() -> None:
    """A new sub-package of a side, or a new flat module of the client, is placed in an order here."""
    sources = product_sources()
    named = {side: {w for peers in wings for w in peers} for side, wings in SIDE_WINGS.items()}
    for mod in sources:
        found = wing(mod, sources)
        if found is not None:
            assert found[1] in named[found[0]], f"{mod}: wing {found[1]!r} is not in the order of {found[0]}"
    flat = {m.rpartition(".")[2] for m in sources if m.count(".") == 2 and m.startswith("shardstream.client.")}
    placed = {m for mods in CLIENT_MODULES.values() for m in mods}
    assert placed == flat - {"checkpoint", "cursors", "integrations", "transport"}, (sorted(flat - placed), sorted(placed - flat))


def test_the_layer_check_names_each_upward_import() -> None:
    """What a break looks like: two upward imports and a peer's, in a tree of a few modules."""
    sources = {
        "shardstream.server": "",
        "shardstream.server.lifecycle": "from .serving import control_plane",
        "shardstream.server.read": "",
        "shardstream.server.read.plan": "from ..policy.auth import Principal\nfrom ..serving.auth import OPEN",
        "shardstream.server.policy": "",
        "shardstream.server.policy.auth": "",
        "shardstream.server.checkpoints": "",
        "shardstream.server.checkpoints.plane": "def f():\n    from shardstream.server.writing import ingest",
        "shardstream.server.writing": "",
        "shardstream.server.writing.ingest": "from ..read import plan",
        "shardstream.server.serving": "",
        "shardstream.server.serving.auth": "",
        "shardstream.server.serving.control_plane": "from .. import lifecycle",
    }
    assert upward_imports(edges(sources), sources) == [
        "shardstream.server.checkpoints.plane (checkpoints) imports shardstream.server.writing.ingest (writing): "
        "a peer wing",
        "shardstream.server.read.plan (read) imports shardstream.server.serving.auth (serving): a higher wing",
        "shardstream.server.serving.control_plane (serving) imports shardstream.server.lifecycle (top): "
        "a higher wing",
    ]


@pytest.mark.parametrize(
    ("module", "line", "edge"),
    [
        # the read path reaching up into serving, or a transform into the read path
        ("shardstream.server.read.plan", "from ..serving import admission", "shardstream.server.serving.admission"),
        ("shardstream.server.transforms.pipeline", "from ..read import cache", "shardstream.server.read.cache"),
        # checkpoints and writing are peers; serving below the process's top
        ("shardstream.server.checkpoints.store", "from ..writing import ingest", "shardstream.server.writing.ingest"),
        ("shardstream.server.serving.supervisor", "from .. import lifecycle", "shardstream.server.lifecycle"),
        # policy is the floor
        ("shardstream.server.policy.redact", "from ..backends import roots", "shardstream.server.backends.roots"),
        # the client: the transport under the reads, cursors and checkpoints peers, nothing under the top
        ("shardstream.client.transport.session", "from ..loader import Loader", "shardstream.client.loader"),
        ("shardstream.client.transport.fleet", "from ..checkpoint import transport", "shardstream.client.checkpoint.transport"),
        ("shardstream.client.cursors.job", "from ..checkpoint import Checkpointer", "shardstream.client.checkpoint"),
        ("shardstream.client.target", "from .transport import channel", "shardstream.client.transport.channel"),
        ("shardstream.client.checkpoint.transport", "from .. import Loader", "shardstream.client"),
    ],
)
def test_an_import_against_the_wing_order_is_reported(module: str, line: str, edge: str) -> None:
    sources = with_extra(module, line)
    bad = upward_imports(edges(sources), sources)
    assert len(bad) == 1 and bad[0].startswith(f"{module} (") and f" imports {edge} (" in bad[0], bad


# --- the visualizers read through the client's public names only ---------------------------------
# The one client module they import: its __all__ (Loader, StepReader, read_step, open_store, ...). A
# facade (`shardstream.checkpoint`) is a public path too, and of the layer "facade", not "client".
PUBLIC_CLIENT = "shardstream.client"


def private_client_imports(graph: Mapping[str, set[str]], entry: str = "shardstream.viz") -> list[str]:
    """`entry`'s imports of client modules other than the public package."""
    return sorted(
        f"{mod} imports {target}"
        for mod, targets in graph.items()
        if mod == entry or mod.startswith(entry + ".")
        for target in targets
        if layer(target) == "client" and target != PUBLIC_CLIENT
    )


def test_the_visualizers_import_no_private_client_module() -> None:
    assert not private_client_imports(edges(product_sources()))


@pytest.mark.parametrize(
    "line",
    [
        "from shardstream.client.transport.session import StreamSession",
        "def f():\n    import shardstream.client.transport.session",
        "from shardstream.client.transport import session",
    ],
)
def test_a_private_client_import_of_the_visualizers_is_reported(line: str) -> None:
    found = private_client_imports(edges(with_extra("shardstream.viz.source", line)))
    assert found == ["shardstream.viz.source imports shardstream.client.transport.session"], found


@pytest.mark.parametrize(
    ("line", "edge"),
    [
        # the client's sub-packages are reached through the package's names too
        ("def f():\n    from shardstream.client.cursors.stores import open_store", "shardstream.client.cursors.stores"),
        ("from shardstream.client.checkpoint import Checkpointer", "shardstream.client.checkpoint"),
    ],
)
def test_a_sub_package_import_of_the_visualizers_is_reported(line: str, edge: str) -> None:
    found = private_client_imports(edges(with_extra("shardstream.viz.fleet_status", line)))
    assert found == [f"shardstream.viz.fleet_status imports {edge}"], found


def test_the_visualizers_may_import_the_public_package_and_the_facades() -> None:
    line = "from shardstream.client import Loader, open_store\nfrom shardstream.checkpoint import Checkpointer"
    assert not private_client_imports(edges(with_extra("shardstream.viz.fleet_status", line)))
