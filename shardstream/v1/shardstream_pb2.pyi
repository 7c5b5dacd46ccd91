from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetDatasetRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class ListDatasetsRequest(_message.Message):
    __slots__ = ("data_plane_only",)
    DATA_PLANE_ONLY_FIELD_NUMBER: _ClassVar[int]
    data_plane_only: bool
    def __init__(self, data_plane_only: _Optional[bool] = ...) -> None: ...

class ListDatasetsResponse(_message.Message):
    __slots__ = ("datasets", "data_port", "data_grant", "data_grant_ttl_s")
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    DATA_GRANT_FIELD_NUMBER: _ClassVar[int]
    DATA_GRANT_TTL_S_FIELD_NUMBER: _ClassVar[int]
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetInfo]
    data_port: int
    data_grant: bytes
    data_grant_ttl_s: int
    def __init__(self, datasets: _Optional[_Iterable[_Union[DatasetInfo, _Mapping]]] = ..., data_port: _Optional[int] = ..., data_grant: _Optional[bytes] = ..., data_grant_ttl_s: _Optional[int] = ...) -> None: ...

class Field(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class DatasetInfo(_message.Message):
    __slots__ = ("name", "version", "fingerprint", "num_rows", "num_shards", "num_bytes", "fields", "arrow_schema", "data_port", "data_grant", "data_grant_ttl_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    DATA_GRANT_FIELD_NUMBER: _ClassVar[int]
    DATA_GRANT_TTL_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    fingerprint: str
    num_rows: int
    num_shards: int
    num_bytes: int
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    arrow_schema: bytes
    data_port: int
    data_grant: bytes
    data_grant_ttl_s: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., fingerprint: _Optional[str] = ..., num_rows: _Optional[int] = ..., num_shards: _Optional[int] = ..., num_bytes: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., arrow_schema: _Optional[bytes] = ..., data_port: _Optional[int] = ..., data_grant: _Optional[bytes] = ..., data_grant_ttl_s: _Optional[int] = ...) -> None: ...

class Shuffle(_message.Message):
    __slots__ = ("mode", "window")
    MODE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    mode: str
    window: int
    def __init__(self, mode: _Optional[str] = ..., window: _Optional[int] = ...) -> None: ...

class MixtureSource(_message.Message):
    __slots__ = ("dataset", "fingerprint", "weight")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    fingerprint: str
    weight: float
    def __init__(self, dataset: _Optional[str] = ..., fingerprint: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("dataset", "fingerprint", "seed", "epoch", "shuffle", "start_offset", "rank", "world_size", "batch_size", "first_step", "num_steps", "drop_last", "columns", "max_message_bytes", "mixture", "mixture_block", "mixture_epoch_samples", "step_stride", "transforms", "on_error", "split_steps", "batch_schedule", "skip", "mixture_phases", "balance", "movable", "handover", "provenance_in_header")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    DROP_LAST_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_EPOCH_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    STEP_STRIDE_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMS_FIELD_NUMBER: _ClassVar[int]
    ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    SPLIT_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_PHASES_FIELD_NUMBER: _ClassVar[int]
    BALANCE_FIELD_NUMBER: _ClassVar[int]
    MOVABLE_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_IN_HEADER_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    fingerprint: str
    seed: int
    epoch: int
    shuffle: Shuffle
    start_offset: int
    rank: int
    world_size: int
    batch_size: int
    first_step: int
    num_steps: int
    drop_last: bool
    columns: _containers.RepeatedScalarFieldContainer[str]
    max_message_bytes: int
    mixture: _containers.RepeatedCompositeFieldContainer[MixtureSource]
    mixture_block: int
    mixture_epoch_samples: int
    step_stride: int
    transforms: _containers.RepeatedCompositeFieldContainer[Transform]
    on_error: str
    split_steps: bool
    batch_schedule: _containers.RepeatedCompositeFieldContainer[BatchPhase]
    skip: _containers.RepeatedCompositeFieldContainer[SkipRange]
    mixture_phases: _containers.RepeatedCompositeFieldContainer[MixturePhase]
    balance: Balance
    movable: bool
    handover: bool
    provenance_in_header: bool
    def __init__(self, dataset: _Optional[str] = ..., fingerprint: _Optional[str] = ..., seed: _Optional[int] = ..., epoch: _Optional[int] = ..., shuffle: _Optional[_Union[Shuffle, _Mapping]] = ..., start_offset: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., batch_size: _Optional[int] = ..., first_step: _Optional[int] = ..., num_steps: _Optional[int] = ..., drop_last: _Optional[bool] = ..., columns: _Optional[_Iterable[str]] = ..., max_message_bytes: _Optional[int] = ..., mixture: _Optional[_Iterable[_Union[MixtureSource, _Mapping]]] = ..., mixture_block: _Optional[int] = ..., mixture_epoch_samples: _Optional[int] = ..., step_stride: _Optional[int] = ..., transforms: _Optional[_Iterable[_Union[Transform, _Mapping]]] = ..., on_error: _Optional[str] = ..., split_steps: _Optional[bool] = ..., batch_schedule: _Optional[_Iterable[_Union[BatchPhase, _Mapping]]] = ..., skip: _Optional[_Iterable[_Union[SkipRange, _Mapping]]] = ..., mixture_phases: _Optional[_Iterable[_Union[MixturePhase, _Mapping]]] = ..., balance: _Optional[_Union[Balance, _Mapping]] = ..., movable: _Optional[bool] = ..., handover: _Optional[bool] = ..., provenance_in_header: _Optional[bool] = ...) -> None: ...

class Balance(_message.Message):
    __slots__ = ("mode", "pad_rows", "cost_column")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        BALANCE_NONE: _ClassVar[Balance.Mode]
        BALANCE_TOKENS: _ClassVar[Balance.Mode]
        BALANCE_ATTENTION: _ClassVar[Balance.Mode]
        BALANCE_COST: _ClassVar[Balance.Mode]
    BALANCE_NONE: Balance.Mode
    BALANCE_TOKENS: Balance.Mode
    BALANCE_ATTENTION: Balance.Mode
    BALANCE_COST: Balance.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    PAD_ROWS_FIELD_NUMBER: _ClassVar[int]
    COST_COLUMN_FIELD_NUMBER: _ClassVar[int]
    mode: Balance.Mode
    pad_rows: bool
    cost_column: str
    def __init__(self, mode: _Optional[_Union[Balance.Mode, str]] = ..., pad_rows: _Optional[bool] = ..., cost_column: _Optional[str] = ...) -> None: ...

class BatchPhase(_message.Message):
    __slots__ = ("start", "batch_size")
    START_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    start: int
    batch_size: int
    def __init__(self, start: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class SkipRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class MixturePhase(_message.Message):
    __slots__ = ("start", "weights")
    START_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    start: int
    weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, start: _Optional[int] = ..., weights: _Optional[_Iterable[float]] = ...) -> None: ...

class Transform(_message.Message):
    __slots__ = ("op", "params_json")
    OP_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    op: str
    params_json: str
    def __init__(self, op: _Optional[str] = ..., params_json: _Optional[str] = ...) -> None: ...

class StepInfo(_message.Message):
    __slots__ = ("step", "position_start", "position_end", "global_start", "global_end", "rows", "skipped", "part", "more_parts", "tokens", "step_tokens", "cost", "step_cost", "balanced")
    STEP_FIELD_NUMBER: _ClassVar[int]
    POSITION_START_FIELD_NUMBER: _ClassVar[int]
    POSITION_END_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_START_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_END_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    MORE_PARTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    STEP_COST_FIELD_NUMBER: _ClassVar[int]
    BALANCED_FIELD_NUMBER: _ClassVar[int]
    step: int
    position_start: int
    position_end: int
    global_start: int
    global_end: int
    rows: int
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedSample]
    part: int
    more_parts: bool
    tokens: int
    step_tokens: int
    cost: float
    step_cost: float
    balanced: bool
    def __init__(self, step: _Optional[int] = ..., position_start: _Optional[int] = ..., position_end: _Optional[int] = ..., global_start: _Optional[int] = ..., global_end: _Optional[int] = ..., rows: _Optional[int] = ..., skipped: _Optional[_Iterable[_Union[SkippedSample, _Mapping]]] = ..., part: _Optional[int] = ..., more_parts: _Optional[bool] = ..., tokens: _Optional[int] = ..., step_tokens: _Optional[int] = ..., cost: _Optional[float] = ..., step_cost: _Optional[float] = ..., balanced: _Optional[bool] = ...) -> None: ...

class SkippedSample(_message.Message):
    __slots__ = ("position", "shard", "row", "source", "reason")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    position: int
    shard: int
    row: int
    source: int
    reason: str
    def __init__(self, position: _Optional[int] = ..., shard: _Optional[int] = ..., row: _Optional[int] = ..., source: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ReadHeader(_message.Message):
    __slots__ = ("epoch", "steps", "end_of_epoch", "dropped", "stream_id", "move_at", "provenance")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    END_OF_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    MOVE_AT_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    steps: _containers.RepeatedCompositeFieldContainer[StepInfo]
    end_of_epoch: bool
    dropped: int
    stream_id: str
    move_at: int
    provenance: Provenance
    def __init__(self, epoch: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[StepInfo, _Mapping]]] = ..., end_of_epoch: _Optional[bool] = ..., dropped: _Optional[int] = ..., stream_id: _Optional[str] = ..., move_at: _Optional[int] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("shards", "rows", "lengths")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    shards: bytes
    rows: bytes
    lengths: bytes
    def __init__(self, shards: _Optional[bytes] = ..., rows: _Optional[bytes] = ..., lengths: _Optional[bytes] = ...) -> None: ...

class CheckpointCommand(_message.Message):
    __slots__ = ("job", "put_chunks", "get_chunks", "has", "put_part", "commit", "abort", "steps", "manifest")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PUT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    GET_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HAS_FIELD_NUMBER: _ClassVar[int]
    PUT_PART_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    job: str
    put_chunks: CheckpointChunks
    get_chunks: CheckpointChunks
    has: CheckpointChunks
    put_part: CheckpointPart
    commit: CheckpointCommit
    abort: CheckpointChunks
    steps: CheckpointSteps
    manifest: CheckpointManifest
    def __init__(self, job: _Optional[str] = ..., put_chunks: _Optional[_Union[CheckpointChunks, _Mapping]] = ..., get_chunks: _Optional[_Union[CheckpointChunks, _Mapping]] = ..., has: _Optional[_Union[CheckpointChunks, _Mapping]] = ..., put_part: _Optional[_Union[CheckpointPart, _Mapping]] = ..., commit: _Optional[_Union[CheckpointCommit, _Mapping]] = ..., abort: _Optional[_Union[CheckpointChunks, _Mapping]] = ..., steps: _Optional[_Union[CheckpointSteps, _Mapping]] = ..., manifest: _Optional[_Union[CheckpointManifest, _Mapping]] = ...) -> None: ...

class CheckpointChunks(_message.Message):
    __slots__ = ("hashes",)
    HASHES_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, hashes: _Optional[_Iterable[str]] = ...) -> None: ...

class CheckpointPart(_message.Message):
    __slots__ = ("step", "rank", "part_json")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PART_JSON_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank: int
    part_json: bytes
    def __init__(self, step: _Optional[int] = ..., rank: _Optional[int] = ..., part_json: _Optional[bytes] = ...) -> None: ...

class CheckpointCommit(_message.Message):
    __slots__ = ("step", "world_size", "save_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAVE_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    world_size: int
    save_id: str
    def __init__(self, step: _Optional[int] = ..., world_size: _Optional[int] = ..., save_id: _Optional[str] = ...) -> None: ...

class CheckpointSteps(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointManifest(_message.Message):
    __slots__ = ("step", "latest", "rank", "world_size")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    step: int
    latest: bool
    rank: int
    world_size: int
    def __init__(self, step: _Optional[int] = ..., latest: _Optional[bool] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...
