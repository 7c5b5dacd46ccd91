"""A Loader's options are one frozen `LoaderOptions` (client/loader_options.py): any valid options build a
`ReadSpec` whose Read requests carry what was given, the Loader shows each option as its attribute,
normalizing twice changes nothing, and an unknown keyword is one line naming it and the closest option.
No server: nothing is sent before the first batch."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pydoc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client import Loader
from shardstream.client.loader_options import LoaderOptions, option_names
from shardstream.client.schedule_state import LoaderSchedule
from shardstream.order.cursor_math import WorkerSplit
from shardstream.order.shuffle import DEFAULT_MODE, DEFAULT_WINDOW

from .support.loader_options import NOWHERE, NUM_ROWS, TARGET, valid_options

# The Loader's keyword options and their defaults before LoaderOptions (at 66a296f): the public surface.
SURFACE: dict[str, Any] = {
    "batch_size": inspect.Parameter.empty,
    "rank": None,
    "world_size": None,
    "seed": 0,
    "shuffle": True,
    "shuffle_window": None,
    "columns": None,
    "epochs": 1,
    "drop_last": False,
    "output": "numpy",
    "provenance": False,
    "pin_memory": False,
    "prefetch": 8,
    "streams": 1,
    "timeout_s": 10.0,
    "max_retries": 6,
    "max_message_bytes": 0,
    "transforms": None,
    "on_error": "fail",
    "stream_idle_timeout_s": 60.0,
    "report_interval_s": 15.0,
    "mixture_block": 0,
    "mixture_epoch_samples": 0,
    "balance": None,
    "pad_rows": False,
    "skip_steps": None,
    "job": None,
    "cursor_store": None,
    "resume": None,
    "resume_min_step": None,
    "tls": None,
    "token": None,
}


def expected_shuffle(given: dict[str, Any]) -> tuple[str, int]:
    shuffle, window = given.get("shuffle", True), given.get("shuffle_window")
    if isinstance(shuffle, dict):
        return shuffle["mode"], shuffle.get("window", window or DEFAULT_WINDOW)
    mode = DEFAULT_MODE if shuffle is True else "none" if shuffle is False else shuffle
    return mode, DEFAULT_WINDOW if window is None else window


@settings(max_examples=200, deadline=None)
@given(given_=valid_options(), epoch=st.integers(0, 3), offset=st.integers(0, NUM_ROWS), stride=st.integers(1, 4))
def test_valid_options_build_a_read_spec_whose_requests_carry_them(
    given_: dict[str, Any], epoch: int, offset: int, stride: int
) -> None:
    options = LoaderOptions(**given_)
    schedule = LoaderSchedule(options.batch_size, options.skip_steps).schedule(
        num_rows=NUM_ROWS, world_size=options.world_size, drop_last=options.drop_last, epoch=0, offset=0, steps=0
    )
    split = WorkerSplit(1, 3)
    spec = options.read_spec(target=TARGET, endpoints=NOWHERE, schedule=schedule, split=split, origin=(0, 7))
    request = spec.request(epoch, offset, 1, stride)

    phases = given_["batch_size"] if isinstance(given_["batch_size"], list) else [(0, given_["batch_size"])]
    assert (request.seed, request.rank, request.world_size) == (
        given_.get("seed", 0),
        given_["rank"],
        given_["world_size"],
    )
    assert (request.epoch, request.start_offset, request.first_step, request.step_stride) == (epoch, offset, 1, stride)
    assert (request.shuffle.mode, request.shuffle.window) == expected_shuffle(given_)
    if len(phases) > 1:
        assert request.batch_size == 0
        assert [(p.start, p.batch_size) for p in request.batch_schedule] == phases
    else:
        assert request.batch_size == phases[0][1] and not request.batch_schedule
    assert spec.batch_size == phases[0][1]
    assert request.drop_last == given_.get("drop_last", False)
    assert list(request.columns) == list(given_.get("columns") or [])
    assert request.max_message_bytes == given_.get("max_message_bytes", 0)
    transforms = given_.get("transforms") or []
    assert [{"op": t.op, **json.loads(t.params_json)} for t in request.transforms] == transforms
    assert request.on_error == (given_.get("on_error", "fail") if transforms else "")
    assert [(r.start, r.end) for r in request.skip] == list(schedule.skips if schedule else ())
    assert bool(request.skip) == bool(given_.get("skip_steps"))
    assert (request.dataset, request.fingerprint) == ("t@1", "f" * 64)
    # what the prefetch thread and the decoder read besides the request
    assert spec.target is TARGET and spec.endpoints == tuple(NOWHERE) and spec.schedule == schedule
    assert (spec.split, spec.origin) == (split, (0, 7))
    assert (spec.output, spec.provenance, spec.prefetch, spec.streams, spec.epochs) == (
        given_["output"],
        given_.get("provenance", False),
        given_.get("prefetch", 8),
        given_.get("streams", 1),
        given_.get("epochs", 1),
    )
    assert spec.pin_memory is (options.pin_memory and given_.get("pin_memory", False))
    assert (spec.retry.max_retries, spec.retry.budget_s, spec.retry.idle_timeout_s) == (
        given_.get("max_retries", 6),
        given_.get("timeout_s", 10.0),
        given_.get("stream_idle_timeout_s", 60.0),
    )
    assert spec.job == (given_.get("job") or "")
    # the normal form is a fixed point: replace() and a rebuild from the fields change nothing
    assert dataclasses.replace(options) == options
    assert LoaderOptions(**{n: getattr(options, n) for n in option_names()}) == options


@settings(max_examples=60, deadline=None)
@given(given_=valid_options(job=False))
def test_a_loader_shows_each_option_as_its_attribute(given_: dict[str, Any]) -> None:
    with Loader(NOWHERE, "a@1", **given_) as ld:
        options = ld.options
        assert options == LoaderOptions(**given_)
        for name in option_names():
            if name in ("token", "batch_size", "columns", "transforms"):
                continue
            assert getattr(ld, name) == getattr(options, name), name
        assert ld.batch_size == options.first_batch
        assert ld.columns == (None if given_.get("columns") is None else list(given_["columns"]))
        assert isinstance(ld.transforms, list) and tuple(ld.transforms) == options.transforms
        assert (ld.rank, ld.world_size) == (given_["rank"], given_["world_size"])
        assert not hasattr(ld, "token")  # a secret is no attribute
        with pytest.raises(AttributeError, match="seed is an option, fixed when the Loader is made"):
            ld.seed = 1  # type: ignore[misc]
        assert ld.options is options


@pytest.mark.parametrize(
    ("typo", "closest"),
    [("batch_sise", "batch_size"), ("worldsize", "world_size"), ("shufle", "shuffle"), ("timeout", "timeout_s")],
)
def test_an_unknown_option_is_one_line_naming_it_and_the_closest(typo: str, closest: str) -> None:
    with pytest.raises(TypeError) as info:
        Loader(NOWHERE, "a@1", batch_size=8, **{typo: 1})
    message = str(info.value)
    assert f"{typo!r}" in message and f"did you mean {closest!r}?" in message and "\n" not in message, message


@settings(max_examples=100, deadline=None)
@given(name=st.from_regex(r"[a-z_][a-z0-9_]{0,30}", fullmatch=True).filter(lambda n: n not in SURFACE))
def test_any_unknown_option_is_refused_naming_it(name: str) -> None:
    with pytest.raises(TypeError) as info:
        LoaderOptions.of({"batch_size": 8, name: 1})
    message = str(info.value)
    assert f"unknown option {name!r}" in message and "\n" not in message, message


def test_a_missing_batch_size_is_named() -> None:
    with pytest.raises(TypeError, match="needs the option 'batch_size'"):
        Loader(NOWHERE, "a@1", seed=1)


def test_the_constructor_keeps_its_keywords_and_defaults_and_help_shows_them() -> None:
    params = inspect.signature(Loader).parameters
    assert list(params)[:2] == ["endpoints", "dataset"]
    keywords = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == SURFACE
    assert set(option_names()) == set(SURFACE)
    text = pydoc.render_doc(Loader)
    for name in SURFACE:
        assert name in text, name
    assert "prefetch: 'int' = 8" in text and "LoaderOptions" in text
