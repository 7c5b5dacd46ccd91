"""rl.windows: RL episodes -> fixed-length windows with n-step discounted returns and done masks.

{"op": "rl.windows", "window": 32, "stride": 32, "n_step": 1, "gamma": 0.99,
 "obs": "obs", "action": "action", "reward": "reward", "done": "done", "episode": "episode"}

The input is one episode per row (as `shardstream ingest --format episodes` stores them): list
columns with one entry per time step (an entry may itself be a fixed-size vector or tensor). Each
episode of T steps becomes the windows starting at 0, stride, 2*stride, ... < T, each `window`
steps long; a window running past the end of its episode is padded with zeros and `valid` = 0.

Per window (shape [window, ...] each):
  obs, action        the steps' observations and actions, in their stored dtype
  reward             float32
  done               uint8, 1 where the episode's stored done flag is set
  returns            float32, the n-step discounted return computed over the whole episode:
                     G_t = sum_{k < m} gamma^k * reward[t+k], m = min(n_step, T - t)
  bootstrap          float32, the factor for the value of the state m steps later, so that a target
                     is returns + bootstrap * V(s_{t+m}): gamma^m, or 0 when the episode terminates
                     within those m steps (its last step's done flag is set)
  valid              uint8, 0 on padding
and episode_id (int64: the `episode` column when present, else the sample's global position) and
t0 (int32: the window's first time step). Other columns are dropped; each window's provenance is
its episode's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError

from .base import BatchContext, Params, Result, Transform, column_of, keep_rows, tensor_array, tensor_type

__all__ = ["RLWindows", "nstep_returns"]


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _step_shape(t: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    shape = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    return tuple(shape), t


def nstep_returns(reward: np.ndarray, terminal: bool, n: int, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(returns, bootstrap) of one episode's rewards; see the module docstring."""
    T = len(reward)
    padded = np.concatenate([reward.astype(np.float64), np.zeros(n)])
    g = np.zeros(T)
    for k in range(n):
        g += gamma**k * padded[k : k + T]
    m = np.minimum(n, T - np.arange(T))
    boot = gamma ** m.astype(np.float64)
    if terminal:
        boot[np.arange(T) + m >= T] = 0.0
    return g.astype(np.float32), boot.astype(np.float32)


class RLWindows(Transform):
    op = "rl.windows"

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.window = params.int("window", low=1, high=1 << 16)
        self.stride = params.int("stride", self.window, low=1, high=1 << 16)
        self.n_step = params.int("n_step", 1, low=1, high=1 << 12)
        self.gamma = params.float("gamma", 0.99, low=0.0, high=1.0)
        self.cols = {k: params.str(k, k) for k in ("obs", "action", "reward", "done")}
        self.episode = params.str("episode", "episode")
        self.shapes: dict[str, tuple[tuple[int, ...], pa.DataType]] = {}
        for key, name in self.cols.items():
            f = column_of(self.op, schema, name, "a list column with one entry per time step", _is_list)
            shape, leaf = _step_shape(f.type.value_type)
            if not (pa.types.is_integer(leaf) or pa.types.is_floating(leaf) or pa.types.is_boolean(leaf)):
                raise InvalidArgumentError(f"{self.op}: column {name!r} holds {leaf}, not numbers")
            if key in ("reward", "done") and shape:
                raise InvalidArgumentError(
                    f"{self.op}: column {name!r} must hold one scalar per step, it holds {list(shape)}"
                )
            self.shapes[key] = (shape, leaf)
        if self.episode in schema.names and not pa.types.is_integer(schema.field(self.episode).type):
            raise InvalidArgumentError(f"{self.op}: column {self.episode!r} must be an integer episode id")
        self.has_episode = self.episode in schema.names
        L = self.window
        fields = []
        for key in ("obs", "action"):
            shape, leaf = self.shapes[key]
            dtype = np.dtype(np.uint8) if pa.types.is_boolean(leaf) else np.dtype(leaf.to_pandas_dtype())
            fields.append(pa.field(key, tensor_type((L, *shape), dtype)))
        fields += [
            pa.field("reward", pa.list_(pa.float32(), L)),
            pa.field("done", pa.list_(pa.uint8(), L)),
            pa.field("returns", pa.list_(pa.float32(), L)),
            pa.field("bootstrap", pa.list_(pa.float32(), L)),
            pa.field("valid", pa.list_(pa.uint8(), L)),
            pa.field("episode_id", pa.int64()),
            pa.field("t0", pa.int32()),
        ]
        self.output_schema = pa.schema(fields)

    def _flat(self, batch: pa.RecordBatch, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values (steps, *shape), episode offsets, null mask) of one step column."""
        col = batch.column(self.cols[key])
        shape, leaf = self.shapes[key]
        values = col.flatten()
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        arr = values.to_numpy(zero_copy_only=False)
        if pa.types.is_boolean(leaf):
            arr = arr.astype(np.uint8)
        offsets = col.offsets.to_numpy().astype(np.int64)
        offsets = offsets - offsets[0]
        return arr.reshape(-1, *shape), offsets, col.is_null().to_numpy(zero_copy_only=False)

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        n = batch.num_rows
        flat = {k: self._flat(batch, k) for k in self.cols}
        lengths = {k: np.diff(f[1]) for k, f in flat.items()}
        errors: list[tuple[int, str]] = []
        for i in range(n):
            if any(f[2][i] for f in flat.values()):
                errors.append((i, "an episode column is null"))
            elif len({int(lengths[k][i]) for k in self.cols}) != 1:
                errors.append(
                    (
                        i,
                        "obs/action/reward/done have different lengths: "
                        + ", ".join(f"{self.cols[k]}={int(lengths[k][i])}" for k in self.cols),
                    )
                )
        keep = keep_rows(n, errors)
        L = self.window
        ep_ids = (
            batch.column(self.episode).to_numpy(zero_copy_only=False) if self.has_episode else ctx.positions
        )
        win_rows: list[int] = []
        win_starts: list[int] = []
        returns = np.zeros(len(flat["reward"][0]), np.float32)
        boot = np.zeros_like(returns)
        reward_off = flat["reward"][1]
        for i in keep.tolist():
            a, b = int(reward_off[i]), int(reward_off[i + 1])
            T = b - a
            if T:
                terminal = bool(flat["done"][0][b - 1])
                returns[a:b], boot[a:b] = nstep_returns(
                    flat["reward"][0][a:b], terminal, self.n_step, self.gamma
                )
            for s in range(0, T, self.stride):
                win_rows.append(i)
                win_starts.append(s)
        rows = np.array(win_rows, np.int64)
        starts = np.array(win_starts, np.int64)
        t = starts[:, None] + np.arange(L)[None, :]  # (windows, L) time step in the episode
        valid = t < lengths["reward"][rows][:, None]
        arrays = []
        for key in ("obs", "action", "reward", "done"):
            values, offsets, _ = flat[key]
            idx = np.where(valid, offsets[rows][:, None] + t, 0)
            src = values if len(values) else np.zeros((1, *values.shape[1:]), values.dtype)
            out = src[idx.reshape(-1)] if len(idx) else np.empty((0, *values.shape[1:]), values.dtype)
            out = out.reshape(len(rows), L, *values.shape[1:])
            out[~valid] = 0
            arrays.append(out)
        reward_idx = np.where(valid, reward_off[rows][:, None] + t, 0)
        extra = []
        for series in (returns, boot):
            src = series if len(series) else np.zeros(1, np.float32)
            v = (
                src[reward_idx.reshape(-1)].reshape(len(rows), L)
                if len(rows)
                else np.empty((0, L), np.float32)
            )
            v[~valid] = 0
            extra.append(v)
        obs, action, reward, done = arrays
        cols = [
            tensor_array(obs),
            tensor_array(action),
            tensor_array(reward.astype(np.float32)),
            tensor_array(done.astype(np.uint8)),
            tensor_array(extra[0]),
            tensor_array(extra[1]),
            tensor_array(valid.astype(np.uint8)),
            pa.array(np.asarray(ep_ids)[rows].astype(np.int64), pa.int64()),
            pa.array(starts.astype(np.int32), pa.int32()),
        ]
        return Result(pa.RecordBatch.from_arrays(cols, schema=self.output_schema), rows, errors)
