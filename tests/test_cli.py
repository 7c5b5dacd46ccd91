"""The command line as a user meets it: help with examples, global options anywhere, one-line errors,
read-only commands that write nothing, a closed pipe, and an install without the server extra."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardstream.cli import build_parser, main
from shardstream.cli.common import SERVER_EXTRA_HINT, apply_global_options

ROWS = 5000  # enough for `inspect --json` of one step to overflow a pipe's buffer

# Runs shardstream.cli.main as an install without the server extra would: importing any of its
# third-party modules fails the way a missing package does.
CLIENT_ONLY = """
import importlib.abc, sys

MISSING = {"grpc_health", "grpc_reflection", "aiobotocore", "botocore", "PIL", "av", "tiktoken", "uvloop", "tqdm"}

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from shardstream.cli import main
sys.exit(main(sys.argv[1:]))
"""


def clean_env() -> dict[str, str]:
    """This environment without the variables that change the CLI's defaults."""
    drop = ("SHARDSTREAM_ROOT", "SHARDSTREAM_CURSOR_STORE", "AWS_ENDPOINT_URL")
    return {k: v for k, v in os.environ.items() if k not in drop}


def shardstream(*args: str, cwd: Path, client_only: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = ["-c", CLIENT_ONLY] if client_only else ["-m", "shardstream"]
    return subprocess.run(
        [sys.executable, *prefix, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
        timeout=120,
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local registry with toy@1 (ROWS rows, an id column) and toy@2 (appended rows)."""
    from shardstream.server.writing.ingest import IngestOptions, ingest

    base = tmp_path_factory.mktemp("cli")
    opts = IngestOptions(row_group_rows=500, shard_rows=2000, progress=False)
    for name, start, n in (("a", 0, ROWS), ("b", ROWS, 100)):
        src = base / f"{name}.jsonl"
        src.write_text(
            "".join(json.dumps({"id": i, "text": f"sample-{i}"}) + "\n" for i in range(start, start + n))
        )
        ingest(src, "toy", base / "root", opts, change="append" if start else None)
    return base / "root"


@pytest.fixture
def store(tmp_path: Path) -> str:
    """An embedded cursor store holding job `j`, committed at step 8 by both of its ranks."""
    from shardstream.client.cursors.records import CursorRecord
    from shardstream.client.cursors.stores import open_store
    from shardstream.client.loader_state import LoaderState

    url = f"sqlite:///{tmp_path / 'store' / 'cursors.db'}"
    st = open_store(url)
    try:
        for rank in range(2):
            state = LoaderState("toy@1", "f" * 64, 0, "block", 0, 160, 2, 10, 8)
            rec = CursorRecord("j", rank, 8, state)
            st.write("j", 8, rec.key, rank, 2, rec.to_bytes())
    finally:
        st.close()
    return url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the command line: the top level, each group and each command."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


# --- help ---------------------------------------------------------------------------------------
def test_every_help_has_examples_that_parse_as_its_command() -> None:
    checked = 0
    for path, parser in parsers(build_parser()):
        text = parser.format_help()
        assert "\nExamples:\n" in text, f"`shardstream {' '.join(path)} --help` has no Examples: section"
        lines = text.split("\nExamples:\n", 1)[1].splitlines()
        commands = [line.strip() for line in lines if line.startswith("  shardstream")]
        assert commands and len(commands) == len([line for line in lines if line.strip()]), text
        for command in commands:
            argv = shlex.split(command, comments=True)
            assert argv[0] == "shardstream"
            top = build_parser()
            try:
                args = top.parse_args(argv[1:])
                apply_global_options(top, args)
            except SystemExit as exc:
                raise AssertionError(f"example {command!r} of {path} does not parse") from exc
            fn = parser.get_default("fn")  # an example of a command runs that command; of a group, one of its
            assert args.fn is fn if fn is not None else args.command == (path or [args.command])[0], command
            checked += 1
    assert checked >= 40


def test_help_lists_every_command_and_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    top = capsys.readouterr().out
    for command in ("ingest", "serve", "datasets", "register", "inspect", "cursor", "demo"):
        assert f"\n    {command} " in top, top
    for group, subs in (
        ("datasets", ("list", "show", "verify", "tag", "history", "diff", "gc")),
        ("cursor", ("list", "show", "migrate")),
    ):
        with pytest.raises(SystemExit):
            main([group, "--help"])
        text = capsys.readouterr().out
        for sub in subs:
            assert f"\n    {sub} " in text, text


# --- global options ---------------------------------------------------------------------------------
def test_global_options_go_before_or_after_the_command(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = str(tmp_path / "nowhere")
    for argv in (
        ("--root", str(root), "datasets", "list", "--json"),
        ("datasets", "list", "--root", str(root), "--json"),
        ("datasets", "--root", str(root), "list", "--json"),
        ("--json", "--root", str(root), "datasets", "list"),
        ("--root", nowhere, "datasets", "list", "--root", str(root), "--json"),  # after the command wins
        ("--root", nowhere, "datasets", "--root", str(root), "list", "--json"),
    ):
        code, out, err = run(capsys, *argv)
        assert code == 0, (argv, err)
        listed = json.loads(out)
        assert [(d["name"], d["latest"], d["rows"]) for d in listed["datasets"]] == [
            ("toy", 2, ROWS + 100)
        ], argv
        assert listed["bad"] == []
    code, _, err = run(capsys, "datasets", "--root", str(root), "list", "--root", nowhere)
    assert code == 1 and str(Path(nowhere).resolve()) in err
    code, out, _ = run(capsys, "--root", str(root), "inspect", "toy@1", "--batch-size", "3", "--json")
    assert code == 0 and [s["id"] for s in json.loads(out)["samples"]] and json.loads(out)["rank"] == 0
    code, out, _ = run(capsys, "--root", str(root), "--json", "datasets", "history", "toy")
    assert code == 0 and [h["version"] for h in json.loads(out)] == [1, 2]


def test_a_global_option_the_command_does_not_take_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, flag in (
        (("--json", "serve"), "--json"),
        (("--store", "memory://", "datasets", "list"), "--store"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(list(argv))
        assert exc.value.code == 2
        assert f"{flag} does not apply to 'shardstream " in capsys.readouterr().err


# --- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ("datasets", "list"),
        ("datasets", "show", "toy"),
        ("datasets", "history", "toy"),
        ("datasets", "diff", "toy@1", "toy@2"),
        ("datasets", "tag", "toy@1", "prod"),
        ("datasets", "verify", "toy"),
        ("inspect", "toy@1"),
    ],
)
def test_a_root_that_does_not_exist_is_named_with_its_absolute_path(
    argv: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv, "--root", "missing/root")
    assert code == 1 and out == ""
    assert err == f"shardstream: error: --root {tmp_path.resolve() / 'missing' / 'root'}: no such directory\n"
    assert list(tmp_path.iterdir()) == []


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))
    }


def test_read_only_commands_create_nothing(root: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "empty"
    cwd.mkdir()
    before = snapshot(root)
    r = str(root)
    for argv, code in (
        # the default root (./datasets) and the default cursor store (.shardstream/) do not exist here
        (("datasets", "list"), 1),
        (("datasets", "show", "toy"), 1),
        (("datasets", "history", "toy"), 1),
        (("datasets", "diff", "toy@1", "toy@2"), 1),
        (("inspect", "toy@1"), 1),
        (("cursor", "list"), 0),
        (("cursor", "show", "some-job"), 1),
        (("cursor", "list", "--store", "sqlite:///sub/dir/cursors.db"), 0),
        (("cursor", "show", "some-job", "--json", "--store", "sqlite:///sub/cursors.db"), 1),
        # an existing root elsewhere: read, not written
        (("datasets", "list", "--root", r), 0),
        (("datasets", "show", "toy@1", "--root", r, "--all-shards"), 0),
        (("datasets", "history", "toy", "--root", r), 0),
        (("datasets", "diff", "toy@1", "toy@2", "--root", r), 0),
        (("inspect", "toy@1", "--root", r, "--world-size", "2", "--rank", "1", "--step", "3"), 0),
        (("inspect", "toy@2", "--root", r, "--show", "--columns", "id,text"), 0),
        (("inspect", "toy", "--root", r, "--stats"), 0),
    ):
        p = shardstream(*argv, cwd=cwd)
        assert p.returncode == code, (argv, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.splitlines()) <= 1, (argv, p.stderr)
        assert list(cwd.iterdir()) == [], (argv, list(cwd.iterdir()))
    assert snapshot(root) == before


# --- a closed pipe ------------------------------------------------------------------------------
def test_a_closed_pipe_exits_quietly(root: Path, tmp_path: Path) -> None:
    # the reader is gone before anything is written
    with subprocess.Popen(
        [sys.executable, "-m", "shardstream", "datasets", "list", "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == 141 and err == "", err

    # `| head -1` on an output much larger than the pipe's buffer: the write fails mid-way
    script = (
        f"{shlex.quote(sys.executable)} -m shardstream inspect toy@1 --batch-size {ROWS} --json "
        f'--root {shlex.quote(str(root))} | head -1; echo "exit=${{PIPESTATUS[0]}}" >&2'
    )
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert p.stdout == "{\n" and p.stderr == "exit=141\n", p.stderr


# --- an install without the server extra --------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ("serve", "--root", "{root}", "--port", "0"),
        ("ingest", "{tmp}/a.jsonl", "--name", "new", "--root", "{tmp}/newroot"),
        ("register", "toy", "--from", "data", "--root", "{root}", "-q"),
        ("datasets", "verify", "toy", "--root", "{root}"),
        ("datasets", "list", "--root", "s3://bucket/registry"),
        ("demo", "--rows", "100", "--workdir", "{tmp}/demo"),
    ],
)
def test_a_server_command_without_the_server_extra_says_so_in_one_line(
    argv: tuple[str, ...], root: Path, tmp_path: Path
) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1}\n')
    before = snapshot(root)
    p = shardstream(*(a.format(root=root, tmp=tmp_path) for a in argv), cwd=tmp_path, client_only=True)
    assert (p.returncode, p.stderr) == (1, SERVER_EXTRA_HINT + "\n"), p.stderr
    assert p.stdout == ""
    assert snapshot(root) == before and not (tmp_path / "newroot").exists()


def test_client_side_commands_run_without_the_server_extra(root: Path, store: str, tmp_path: Path) -> None:
    def ok(*argv: str) -> str:
        p = shardstream(*argv, cwd=tmp_path, client_only=True)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (argv, p.stderr)
        return p.stdout

    listed = json.loads(ok("datasets", "list", "--root", str(root), "--json"))
    assert [d["name"] for d in listed["datasets"]] == ["toy"]
    assert "id: int64" in ok("datasets", "show", "toy@1", "--root", str(root))
    assert [
        h["change"] for h in json.loads(ok("datasets", "history", "toy", "--root", str(root), "--json"))
    ] == [
        "create",
        "append",
    ]
    assert (
        json.loads(ok("datasets", "diff", "toy@1", "toy@2", "--root", str(root), "--json"))["change"]
        == "append"
    )
    planned = json.loads(
        ok("inspect", "toy@1", "--root", str(root), "--shuffle", "none", "--batch-size", "4", "--json")
    )
    assert [s["id"] for s in planned["samples"]] == [0, 1, 2, 3]
    assert json.loads(ok("cursor", "list", "--store", store, "--json")) == [
        {"job": "j", "committed_steps": 1, "latest": 8, "steps_written": 1}
    ]
    shown = json.loads(ok("cursor", "show", "j", "--store", store, "--json"))
    assert shown["step"] == 8 and [r["rank"] for r in shown["ranks"]] == [0, 1]
