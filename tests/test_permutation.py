from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.order.permutation import KeyedPermutation, derive_key

from .support.processes import same_output_in_processes


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 15, 16, 17, 97, 255, 256, 257, 1009, 4096, 10_007])
def test_is_a_bijection_with_inverse(n: int) -> None:
    for seed in range(3):
        p = KeyedPermutation(n, derive_key("t", seed))
        out = p(np.arange(n))
        assert sorted(out.tolist()) == list(range(n))
        np.testing.assert_array_equal(p.inverse(out), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32))
def test_bijection_property(n: int, seed: int) -> None:
    out = KeyedPermutation(n, derive_key(seed))(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))


def test_keys_give_different_orders() -> None:
    a = KeyedPermutation(1000, derive_key("a"))(np.arange(1000))
    b = KeyedPermutation(1000, derive_key("b"))(np.arange(1000))
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, np.arange(1000))  # actually shuffled


def test_lookup_at_huge_n_is_in_range_and_injective() -> None:
    n = 10**10
    p = KeyedPermutation(n, derive_key("big"))
    pos = np.array([0, 1, 2, n // 2, n - 2, n - 1, 123_456_789_012 % n])
    out = p(pos)
    assert ((out >= 0) & (out < n)).all()
    assert len(set(out.tolist())) == len(pos)
    np.testing.assert_array_equal(p.inverse(out), pos)


def test_out_of_range_positions_are_refused() -> None:
    p = KeyedPermutation(10, derive_key("x"))
    with pytest.raises(IndexError):
        p(np.array([10]))
    with pytest.raises(IndexError):
        p(np.array([-1]))


def test_same_in_another_process_with_another_hash_seed() -> None:
    code = (
        "import numpy as np;from shardstream.order.permutation import KeyedPermutation, derive_key;"
        "print(KeyedPermutation(777, derive_key('fp', 3, 1, 'full'))(np.arange(777)).tolist())"
    )
    out = same_output_in_processes(code)
    here = KeyedPermutation(777, derive_key("fp", 3, 1, "full"))(np.arange(777)).tolist()
    assert out.strip() == str(here)
