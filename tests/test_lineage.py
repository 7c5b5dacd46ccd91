"""Migration (DESIGN §3): each change kind accepted when true and refused when false, pure and end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.cli import main
from shardstream.errors import InvalidArgumentError
from shardstream.lineage import CLAIMS, check_change, diff, infer_change
from shardstream.manifest import Manifest, Shard
from shardstream.server.backends.roots import open_registry
from shardstream.server.writing.ingest import IngestOptions, ingest

from .support.data import make_table, put_parquet

BASE = [("id", pa.int64()), ("text", pa.string()), ("label", pa.int32())]


def shard(i: int, rows: int = 100, tag: str = "") -> Shard:
    return Shard(
        f"data/s{i}{tag}.parquet", rows, 1000 + rows, (rows,), f"{i:02x}{tag.encode().hex()}".ljust(64, "0")
    )


def man(fields: list[tuple[str, pa.DataType]], shards: list[Shard], version: int = 2) -> Manifest:
    return Manifest(name="ds", version=version, schema=pa.schema(fields), shards=tuple(shards))


PARENT = man(BASE, [shard(0), shard(1, 50)], version=1)

# (kind, a child for which the claim holds)
TRUE = [
    ("append", man(BASE, [shard(0), shard(1, 50), shard(2, 7)])),
    ("add_columns", man([*BASE, ("emb", pa.list_(pa.float32()))], [shard(0, tag="b"), shard(1, 50, "b")])),
    (
        "rename_columns",
        man([("id", pa.int64()), ("body", pa.string()), ("y", pa.int32())], [shard(0), shard(1, 50)]),
    ),
    ("drop_columns", man([BASE[0], BASE[2]], [shard(0, tag="c"), shard(1, 50, "c")])),
    ("drop_rows", man(BASE, [shard(0), dataclasses.replace(shard(1, 50), masked=((3, 5),))])),
    ("replace", man([("other", pa.float64())], [shard(9, 3)])),
]

# (kind, a child for which the claim is false, what the error must name)
FALSE = [
    ("append", man(BASE, [shard(0), shard(1, 50)]), "adds no shards"),
    ("append", man(BASE, [shard(1, 50), shard(0), shard(2)]), "shard 0 is data/s1.parquet"),
    ("append", man(BASE, [shard(0), shard(1, 51), shard(2)]), "shard 1 is data/s1.parquet (its size, rows"),
    ("append", man(BASE, [shard(0)]), "the parent's shard 1 (data/s1.parquet) is missing"),
    ("append", man([*BASE, ("z", pa.int8())], [shard(0), shard(1, 50), shard(2)]), "field 'z' (int8) added"),
    ("append", man([BASE[1], BASE[0], BASE[2]], [shard(0), shard(1, 50), shard(2)]), "fields reordered"),
    ("add_columns", man(BASE, [shard(0), shard(1, 50)]), "it adds no fields"),
    (
        "add_columns",
        man([*BASE, ("z", pa.int8())], [shard(0), shard(1, 49)]),
        "shard 1 (data/s1.parquet) has 49 rows, the parent's",
    ),
    (
        "add_columns",
        man([*BASE, ("z", pa.int8())], [shard(0), shard(1, 50), shard(2)]),
        "it has 3 shard(s), the parent has 2",
    ),
    (
        "add_columns",
        man([BASE[0], ("text", pa.large_string()), ("z", pa.int8())], [shard(0), shard(1, 50)]),
        "field 'label' (int32) removed; field 'text' is large_string, the parent's is string",
    ),
    ("rename_columns", man(BASE, [shard(0), shard(1, 50)]), "it renames no fields"),
    (
        "rename_columns",
        man([("id", pa.int64()), ("body", pa.int8()), ("y", pa.int32())], [shard(0), shard(1, 50)]),
        "field 1 'body' (int8) has another type than the parent's 'text' (string)",
    ),
    (
        "rename_columns",
        man([("id", pa.int64()), ("body", pa.string())], [shard(0), shard(1, 50)]),
        "it has 2 field(s), the parent has 3",
    ),
    (
        "rename_columns",
        man([("id", pa.int64()), ("body", pa.string()), ("y", pa.int32())], [shard(0, 99), shard(1, 50)]),
        "shard 0 (data/s0.parquet) has 99 rows",
    ),
    ("drop_columns", man(BASE, [shard(0), shard(1, 50)]), "it drops no fields"),
    (
        "drop_columns",
        man([BASE[0], ("new", pa.int8())], [shard(0), shard(1, 50)]),
        "field 'new' (int8) added",
    ),
    ("drop_columns", man([BASE[2], BASE[0]], [shard(0), shard(1, 50)]), "fields reordered"),
    ("drop_columns", man([BASE[0]], [shard(0), shard(1, 50), shard(2)]), "it has 3 shard(s)"),
    ("drop_rows", man(BASE, [shard(0), shard(1, 50)]), "it masks no more rows"),
    ("drop_rows", man(BASE, [shard(0), shard(2, 50, "x")]), "shard 1 is data/s2x.parquet, not the parent's"),
    ("drop_rows", man(BASE[:2], [shard(0), dataclasses.replace(shard(1, 50), masked=((0, 1),))]), "removed"),
]


@pytest.mark.parametrize(("kind", "child"), TRUE, ids=[k for k, _ in TRUE])
def test_true_claims_are_accepted_and_inferred(kind: str, child: Manifest) -> None:
    check_change(PARENT, child, kind)
    check_change(PARENT, child, "replace")  # anything is a replace
    assert infer_change(PARENT, child) == kind


@pytest.mark.parametrize(
    ("kind", "child", "names"), FALSE, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(FALSE)]
)
def test_false_claims_are_refused_naming_what_contradicts_them(
    kind: str, child: Manifest, names: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_change(PARENT, child, kind)
    msg = str(info.value)
    assert f"change {kind!r} does not hold from ds@1 to ds@2: " in msg and names in msg, msg
    assert "\n" not in msg


def test_every_claim_has_true_and_false_cases() -> None:
    assert {k for k, _ in TRUE} == set(CLAIMS)
    assert {k for k, _, _ in FALSE} == set(CLAIMS) - {"replace"}


def test_identical_content_and_unknown_kinds() -> None:
    assert infer_change(PARENT, man(BASE, list(PARENT.shards))) == "replace"  # no kind's "at least one" holds
    with pytest.raises(InvalidArgumentError, match="cannot be a 'create'"):
        check_change(PARENT, TRUE[0][1], "create")
    with pytest.raises(InvalidArgumentError, match="unknown change 'rename'"):
        check_change(PARENT, TRUE[0][1], "rename")


def test_diff_and_rename_mapping() -> None:
    d = diff(PARENT, dict(TRUE)["rename_columns"])
    assert d.change == "rename_columns" and d.fields_renamed == (("text", "body"), ("label", "y"))
    assert d.fields_added == d.fields_removed == () and d.recorded is None  # ds@2's parent is not recorded
    d = diff(PARENT, man([BASE[0], ("text", pa.large_string()), ("z", pa.int8())], [shard(0), shard(3, 5)]))
    assert d.change == "replace"
    assert d.fields_added == (("z", "int8"),) and d.fields_removed == (("label", "int32"),)
    assert d.fields_retyped == (("text", "string", "large_string"),)
    assert d.shards_added == ("data/s3.parquet",) and d.shards_removed == ("data/s1.parquet",)
    assert (d.rows_before, d.rows_after, d.shards_before, d.shards_after) == (150, 105, 2, 2)


def test_manifest_records_renames_and_old_manifests_still_read() -> None:
    m = Manifest(
        name="ds",
        version=2,
        schema=PARENT.schema,
        shards=PARENT.shards,
        parent=1,
        change="rename_columns",
        renamed={"a": "b"},
    )
    again = Manifest.loads(m.dumps())
    assert again.renamed == {"a": "b"} and again.change == "rename_columns"
    assert again.fingerprint == PARENT.fingerprint  # lineage is not content
    old = PARENT.to_json()
    assert "renamed" not in old  # other manifests' JSON is unchanged
    assert Manifest.from_json(old).renamed == {}
    with pytest.raises(InvalidArgumentError, match="unknown change 'merge'"):
        Manifest.from_json({**old, "change": "merge"})


# --- end to end, local root ----------------------------------------------------------------------
def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def src(tmp_path: Path, table: pa.Table, name: str) -> str:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return str(path)


def test_ingest_change_claims_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path / "root")
    sizing = ["--row-group-rows", "40", "--shard-rows", "100", "-q", "--root", root]
    base = make_table(250)
    assert run(capsys, "ingest", src(tmp_path, base, "v1"), "--name", "t", *sizing)[1].strip() == "t@1"

    # A false append claim (ingest --append conforms to the parent's schema, so: a new field) writes nothing.
    wide = base.append_column("extra", pa.array([1.0] * 250))
    code, out, err = run(capsys, "ingest", src(tmp_path, wide, "wide"), "--name", "t", "--append", *sizing)
    assert code == 1 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "input field(s) ['extra'] are not in t@1's schema" in err
    # add_columns: same rows per shard, one new field.
    code, out, err = run(
        capsys, "ingest", src(tmp_path, wide, "wide"), "--name", "t", "--change", "add_columns", *sizing
    )
    assert (code, out.strip()) == (0, "t@2"), err
    # A false rename claim: the types differ.
    code, _, err = run(
        capsys, "ingest", src(tmp_path, base, "v1"), "--name", "t", "--change", "rename_columns", *sizing
    )
    assert (
        code == 1
        and "change 'rename_columns' does not hold from t@2 to t@3: it has 4 field(s), the parent has 5"
        in err
    )
    # drop_columns, inferred.
    assert run(capsys, "ingest", src(tmp_path, base, "v1"), "--name", "t", *sizing)[1].strip() == "t@3"
    # rename_columns, claimed.
    renamed = base.rename_columns(["id", "vec", "label", "body"])
    assert (
        run(
            capsys,
            "ingest",
            src(tmp_path, renamed, "ren"),
            "--name",
            "t",
            "--change",
            "rename_columns",
            *sizing,
        )[0]
        == 0
    )
    # append: the parent's shards + the input's.
    more = make_table(30, 250).rename_columns(["id", "vec", "label", "body"])
    assert run(capsys, "ingest", src(tmp_path, more, "more"), "--name", "t", "--append", *sizing)[0] == 0
    # A false add_columns claim: the row counts per shard differ.
    code, _, err = run(
        capsys, "ingest", src(tmp_path, wide, "wide"), "--name", "t", "--change", "add_columns", *sizing
    )
    assert code == 1 and "it has 3 shard(s), the parent has 4" in err

    with open_registry(root) as reg:
        ms = [reg.resolve(f"t@{v}") for v in reg.versions("t")]
        assert [(m.parent, m.change) for m in ms] == [
            (None, "create"),
            (1, "add_columns"),
            (2, "drop_columns"),
            (3, "rename_columns"),
            (4, "append"),
        ]
        assert ms[3].renamed == {"x": "vec", "text": "body"}
        assert ms[4].shards[:3] == ms[3].shards and ms[4].num_rows == 280
        # Nothing of the refused ingests is left behind: only the five versions' shards exist.
        on_disk = {
            p.relative_to(Path(root) / "t").as_posix() for p in (Path(root) / "t" / "data").rglob("*.parquet")
        }
        assert on_disk == {s.uri for m in ms for s in m.shards}

    code, out, _ = run(capsys, "datasets", "diff", "t@3", "t@4", "--root", root)
    assert code == 0
    assert out.splitlines()[:5] == [
        "t@3 -> t@4: rename_columns (recorded: rename_columns)",
        "  rows    250 -> 250 (+0)",
        "  shards  3 -> 3 (+0): 3 added, 3 removed",
        "  fields  ~ x -> vec (renamed)",
        "          ~ text -> body (renamed)",
    ]
    code, out, _ = run(capsys, "datasets", "diff", "t@4", "t@5", "--root", root, "--json")
    d = json.loads(out)
    assert (d["change"], d["recorded_change"], d["rows_before"], d["rows_after"]) == (
        "append",
        "append",
        250,
        280,
    )
    assert d["shards_removed"] == [] and d["shards_added"] == [ms[4].shards[3].uri]
    code, out, _ = run(capsys, "datasets", "diff", "t@1", "t@3", "--root", root)
    # Same schema, same rows, but other files: a replace.
    assert out.splitlines()[0] == "t@1 -> t@3: replace" and "  fields  unchanged" in out
    code, _, err = run(capsys, "datasets", "diff", "t", "t@2", "--root", root)
    assert code == 1 and "diff needs NAME@VERSION or NAME@TAG, got 't'" in err
    code, _, err = run(capsys, "datasets", "diff", "t@1", "t@9", "--root", root)
    assert code == 1 and "has no version 9" in err
    code, out, _ = run(capsys, "datasets", "show", "t@4", "--root", root)
    assert "  renamed      x -> vec, text -> body" in out


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue("s3_root")


def test_register_change_claims_end_to_end(
    root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i, day in enumerate(["day=2", "day=1", "day=3"]):  # day=2 first: not the sorted order
        put_parquet(root, f"web/data/{day}/part.parquet", make_table(60, 60 * i), tmp_path, row_group_size=25)
    put_parquet(root, "new/a.parquet", make_table(5), tmp_path)
    args = ["--root", root, "-q"]
    assert run(capsys, "register", "web", "--from", "data/day=2", *args)[1].strip() == "web@1"
    # The parent's file keeps its place first, so registering the grown prefix is an append.
    code, out, err = run(capsys, "register", "web", "--from", "data", "--change", "append", *args)
    assert (code, out.strip()) == (0, "web@2"), err
    code, _, err = run(capsys, "register", "web", "--from", "data/day=1", "--change", "append", *args)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "change 'append' does not hold from web@2 to web@3: shard 0 is data/day=1/part.parquet" in err
    code, _, err = run(capsys, "register", "web", "--from", "data/day=1", "--change", "drop_columns", *args)
    assert code == 1 and "it drops no fields; it has 1 shard(s), the parent has 3" in err
    with open_registry(root) as reg:
        assert reg.versions("web") == [1, 2]  # the false claims wrote nothing
        m = reg.resolve("web@2")
        assert (m.parent, m.change) == (1, "append")
        assert [s.uri for s in m.shards] == [f"data/{d}/part.parquet" for d in ("day=2", "day=1", "day=3")]
    code, out, _ = run(capsys, "datasets", "diff", "web@1", "web@2", "--root", root)
    assert code == 0 and out.splitlines()[0] == "web@1 -> web@2: append (recorded: append)"
    code, _, err = run(capsys, "register", "new", "--from", "a.parquet", "--change", "add_columns", *args)
    assert code == 1
    assert "new has no version yet: new@1 would be its first (a 'create'), not 'add_columns'" in err
    assert run(capsys, "register", "new", "--from", "a.parquet", "--change", "replace", *args)[0] == 0
    with open_registry(root) as reg:
        assert (reg.resolve("new@1").parent, reg.resolve("new@1").change) == (None, "create")


def test_append_needs_a_parent(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="no dataset named 'nope' .* to append to"):
        ingest(
            src(tmp_path, make_table(5), "a"),
            "nope",
            tmp_path / "root",
            IngestOptions(progress=False),
            change="append",
        )
    assert not (tmp_path / "root" / "nope" / "manifests").exists()
