"""The checkpoint calls' commands on the wire (DESIGN §13): `CheckpointCommand` (shardstream.v1) both ways.

No I/O. The client encodes each call's command (client/checkpoint/transport.py); the server decodes it
(server/checkpoints/plane.py) into the same dict as the previous release's JSON form, which it still
accepts: a body that starts with "{" is JSON, and no CheckpointCommand starts with it (its fields are
numbered below 15, so its first byte is a tag below 0x50; "{" would be field 15 as a group). The kinds
are the calls:

    chunks.put           DoPut descriptor command     {"op": "chunks", "job", "hashes"}
    chunks.get           DoGet ticket (after CHUNK_TICKET_PREFIX)  {"job", "hashes"}
    checkpoint.has       DoAction body                {"job", "hashes"}
    checkpoint.put-part                               {"job", "step", "rank", "part"}
    checkpoint.commit                                 {"job", "step", "world_size", "save_id"}
    checkpoint.abort                                  {"job", "hashes"}
    checkpoint.steps                                  {"job"}
    checkpoint.manifest                               {"job", "step": int | "latest"[, "rank", "world_size"]}

A command that does not parse, holds a field this version does not define, or holds another op than
its call's is INVALID_ARGUMENT in one line; the values themselves are checked by the server as the
JSON form's are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from shardstream.errors import InvalidArgumentError, excerpt
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["KINDS", "decode_command", "encode_command", "is_json_command"]

# call kind -> its op in CheckpointCommand
KINDS = {
    "chunks.put": "put_chunks",
    "chunks.get": "get_chunks",
    "checkpoint.has": "has",
    "checkpoint.put-part": "put_part",
    "checkpoint.commit": "commit",
    "checkpoint.abort": "abort",
    "checkpoint.steps": "steps",
    "checkpoint.manifest": "manifest",
}
_HASHES = ("put_chunks", "get_chunks", "has", "abort")


def is_json_command(raw: bytes) -> bool:
    """Whether a command is the previous release's JSON form (it starts with "{")."""
    return raw[:1] == b"{"


def encode_command(kind: str, body: Mapping[str, Any]) -> bytes:
    """The CheckpointCommand of call `kind` with the fields of `body` (the keys of the JSON form);
    INVALID_ARGUMENT for a value its field cannot hold (a negative step)."""
    try:
        return _encode(KINDS[kind], body)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{kind}: {excerpt(dict(body))} cannot be sent ({exc})") from None


def _encode(op: str, body: Mapping[str, Any]) -> bytes:
    command = pb.CheckpointCommand(job=body["job"])
    sub = getattr(command, op)
    sub.SetInParent()  # an op without fields (steps, an empty list of chunks) is still that op
    if op in _HASHES:
        sub.hashes.extend(body["hashes"])
    elif op == "put_part":
        sub.step, sub.rank = body["step"], body["rank"]
        sub.part_json = json.dumps(body["part"], separators=(",", ":")).encode()
    elif op == "commit":
        sub.step, sub.world_size, sub.save_id = body["step"], body["world_size"], body["save_id"]
    elif op == "manifest":
        if body["step"] == "latest":
            sub.latest = True
        else:
            sub.step = body["step"]
        if body.get("world_size") is not None:
            sub.rank, sub.world_size = body["rank"], body["world_size"]
    return command.SerializeToString(deterministic=True)


def decode_command(raw: bytes, kind: str, what: str, parse_part: Callable[[bytes], Any]) -> dict[str, Any]:
    """The command of call `kind` in `raw` (a CheckpointCommand) as the dict of its JSON form;
    `parse_part` reads a put-part's JSON part record (within the server's bounds)."""
    op = KINDS.get(kind)
    if op is None:
        raise InvalidArgumentError(f"unknown action {excerpt(kind)}")
    try:
        command = pb.CheckpointCommand.FromString(raw)
    except Exception:  # noqa: BLE001 — protobuf's DecodeError, invalid UTF-8 in a string field
        raise InvalidArgumentError(
            f"the checkpoint {what} is neither a CheckpointCommand (shardstream.v1) nor a JSON object"
        ) from None
    _no_unknown_fields(command, what)
    got = command.WhichOneof("op")
    if got != op:
        holds = f"a {got} command" if got else "no command"
        raise InvalidArgumentError(f"the checkpoint {what} holds {holds}, not {op} ({kind})")
    sub = getattr(command, op)
    out: dict[str, Any] = {"job": command.job}
    if op in _HASHES:
        out["hashes"] = list(sub.hashes)
        if op == "put_chunks":
            out["op"] = "chunks"
    elif op == "put_part":
        out.update(step=sub.step, rank=sub.rank, part=parse_part(sub.part_json))
    elif op == "commit":
        out.update(step=sub.step, world_size=sub.world_size, save_id=sub.save_id)
    elif op == "manifest":
        which = sub.WhichOneof("which")
        if which is None or (which == "latest" and not sub.latest):
            raise InvalidArgumentError(f"the checkpoint {what} names no step (step, or latest = true)")
        out["step"] = "latest" if which == "latest" else sub.step
        if sub.world_size:
            out.update(rank=sub.rank, world_size=sub.world_size)
    return out


def _no_unknown_fields(message: Message, what: str) -> None:
    if len(UnknownFieldSet(message)):
        raise InvalidArgumentError(
            f"the checkpoint {what} holds a field {message.DESCRIPTOR.name} does not define in this "
            "server's version of shardstream.v1"
        )
    for field, value in message.ListFields():
        if field.message_type is not None:  # the commands have no repeated messages
            _no_unknown_fields(value, what)
