"""Who is calling, and which datasets they may read: `serve --auth FILE` (DESIGN §10).

The file (YAML) names principals; each authenticates with a bearer token — stored as the sha256 of
the token, never the token — and/or the subject of an mTLS client certificate, and may read the
datasets its patterns match:

    principals:
      - name: team-a
        token_sha256: "<hex sha256 of the bearer token>"   # printf %s "$TOKEN" | sha256sum
        datasets: ["web", "code*"]
      - name: ci
        mtls_subject: "CN=ci"          # the certificate's subject, its attributes in any order
        datasets: ["*"]

A principal may also keep checkpoints (server/checkpoints/, `serve --checkpoint-root`): it saves and
loads those of the jobs its `checkpoints:` globs match, and only loads those of `checkpoints_read:`
(an evaluation host, an RL rollout worker); a principal without either has none. Without `--auth`
every caller may save and load every job's.

    principals:
      - name: trainer
        token_sha256: "..."
        datasets: ["web"]
        checkpoints: ["run-*"]
        checkpoints_read: ["eval-*"]

A pattern is `NAME_GLOB` (every version of the matching datasets) or `NAME_GLOB@N` (version N only);
the glob is fnmatch's (`*`, `?`, `[...]`), matched case-sensitively against dataset names.

Authentication (`Authenticator.authenticate`, once per call, before anything else is looked at): a
call with `authorization: Bearer TOKEN` metadata is that token's principal — an unknown token is
UNAUTHENTICATED, whatever certificate came with it; without a token, the verified client certificate's
subject decides; with neither, UNAUTHENTICATED. The token's sha256 is compared with every principal's
in constant time (`hmac.compare_digest`, no early exit). The Flight data plane cannot see a client
certificate: there a certificate's principal is known by the grant the gRPC port gave it
(grants.py), and only on a call without a token. Without `--auth` every caller may read
everything (`OPEN`), named by its certificate subject when it sent one.

Authorization (`Principal.check`) happens before the registry is asked anything: a reference whose
name matches none of the principal's patterns is PERMISSION_DENIED with the same words whether the
dataset exists or not, so the answer reveals no more than NOT_FOUND would. Only for a name the
principal's version-pinned patterns cover (`web@3`) and a reference that does not name a version
(`web`, `web@stable`) is the check repeated on the version it resolved to (`check_version`).

The file is re-read when it changes (its size, mtime or inode: a Kubernetes Secret update swaps a
symlink): a token rotated or revoked there takes effect on the next call, without a restart; calls
already streaming keep going. A file that does not load keeps the last good one in force, with one
error line in the log per bad version of the file.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError, excerpt
from shardstream.manifest import DatasetRef

__all__ = [
    "AUTHORIZATION_KEY",
    "AuthFile",
    "Authenticator",
    "OPEN",
    "Principal",
    "has_token",
    "load_principals",
    "normalize_subject",
    "token_sha256",
]

log = logging.getLogger("shardstream.server.policy.auth")

AUTHORIZATION_KEY = "authorization"  # call metadata: "Bearer <token>"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
_PATTERN_RE = re.compile(r"^[A-Za-z0-9._*?\[\]!-]{1,128}(@[1-9][0-9]{0,18})?\Z")
_PRINCIPAL_KEYS = frozenset({"name", "token_sha256", "mtls_subject", "datasets", "checkpoints", "checkpoints_read"})
_NO_MATCH = b"\0" * 32  # compared against when a principal has no token, so every comparison costs the same


def token_sha256(token: str) -> str:
    """The hex sha256 the auth file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def normalize_subject(subject: str) -> frozenset[str]:
    """A certificate subject as a set of `KEY=value` attributes: gRPC reports `O=lab,CN=ci` where an
    operator writes `CN=ci, O=lab` (order and spaces around separators do not matter)."""
    parts = re.split(r"(?<!\\),", subject)
    out = set()
    for part in parts:
        key, sep, value = part.strip().partition("=")
        if sep:
            out.add(f"{key.strip().upper()}={value.strip()}")
    return frozenset(out)


@dataclass(frozen=True)
class Principal:
    """A caller and the dataset patterns it may read (`patterns` None: everything)."""

    name: str
    patterns: tuple[str, ...] | None = None
    token_digest: bytes | None = None  # sha256 of its token
    subject: frozenset[str] | None = None  # its mTLS subject, normalized
    checkpoints: tuple[str, ...] | None = None  # job globs it saves and loads (None: every job)
    checkpoints_read: tuple[str, ...] | None = None  # job globs it loads only

    def _matching(self, name: str) -> list[str]:
        assert self.patterns is not None
        return [p for p in self.patterns if fnmatch.fnmatchcase(name, p.partition("@")[0])]

    def may_read(self, name: str, version: int) -> bool:
        """Whether dataset `name@version` is readable."""
        if self.patterns is None:
            return True
        return any(not v or int(v) == version for _, _, v in (p.partition("@") for p in self._matching(name)))

    def may_write_checkpoints(self, job: str) -> bool:
        """Whether the checkpoints of training job `job` may be saved (and loaded)."""
        return self.checkpoints is None or any(fnmatch.fnmatchcase(job, p) for p in self.checkpoints)

    def may_read_checkpoints(self, job: str) -> bool:
        """Whether the checkpoints of training job `job` may be loaded."""
        read = self.checkpoints_read
        return self.may_write_checkpoints(job) or (read is not None and any(fnmatch.fnmatchcase(job, p) for p in read))

    def check(self, ref: DatasetRef, what: str = "") -> None:
        """PERMISSION_DENIED unless some pattern may cover `ref` (decided on the reference alone)."""
        if self.patterns is None:
            return
        versions = [v for _, _, v in (p.partition("@") for p in self._matching(ref.name))]
        if not versions or (
            ref.version is not None and "" not in versions and str(ref.version) not in versions
        ):
            self._deny(str(ref), what)

    def check_version(self, name: str, version: int, what: str = "") -> None:
        """PERMISSION_DENIED unless `name@version` (what a reference resolved to) may be read."""
        if not self.may_read(name, version):
            self._deny(f"{name}@{version}", what)

    def _deny(self, ref: str, what: str) -> None:
        raise PermissionDeniedError(
            f"{what}{excerpt(ref)} is not readable with the credentials of principal {self.name!r} (or does "
            "not exist): the server's --auth file lists what each principal may read"
        )


OPEN = Principal("anonymous")  # no --auth: everyone may read everything


def _principal(i: int, entry: Any) -> Principal:
    where = f"principals[{i}]"
    if not isinstance(entry, Mapping):
        raise InvalidArgumentError(f"{where} must be a mapping with name, datasets and a token or subject")
    unknown = sorted(set(map(str, entry)) - _PRINCIPAL_KEYS)
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown key(s) {unknown} (known: {sorted(_PRINCIPAL_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"{where} needs a name")
    where = f"principal {name!r}"
    digest = entry.get("token_sha256")
    subject = entry.get("mtls_subject")
    if digest is None and subject is None:
        raise InvalidArgumentError(f"{where} needs token_sha256 or mtls_subject (or both)")
    if digest is not None and (not isinstance(digest, str) or not _SHA256_RE.match(digest.lower())):
        raise InvalidArgumentError(
            f"{where}: token_sha256 must be 64 hex digits (the sha256 of the token, never the token itself)"
        )
    if subject is not None and (not isinstance(subject, str) or not normalize_subject(subject)):
        raise InvalidArgumentError(f"{where}: mtls_subject must look like 'CN=name' or 'CN=name,O=org'")
    patterns = entry.get("datasets")
    if not isinstance(patterns, Sequence) or isinstance(patterns, str):
        raise InvalidArgumentError(f"{where}: datasets must be a list of patterns ('web', 'web@3', 'code*')")
    for p in patterns:
        if not isinstance(p, str) or not _PATTERN_RE.match(p):
            raise InvalidArgumentError(f"{where}: bad dataset pattern {p!r} (NAME_GLOB or NAME_GLOB@VERSION)")
    jobs = {}
    for key in ("checkpoints", "checkpoints_read"):
        globs = entry.get(key, [])
        if not isinstance(globs, Sequence) or isinstance(globs, str) or not all(
            isinstance(g, str) and _PATTERN_RE.match(g) and "@" not in g for g in globs
        ):
            raise InvalidArgumentError(f"{where}: {key} must be a list of job name globs ('run-*')")
        jobs[key] = tuple(globs)
    return Principal(
        name=name,
        patterns=tuple(patterns),
        checkpoints=jobs["checkpoints"],
        checkpoints_read=jobs["checkpoints_read"],
        token_digest=bytes.fromhex(digest) if digest is not None else None,
        subject=normalize_subject(subject) if subject is not None else None,
    )


def load_principals(text: str) -> tuple[Principal, ...]:
    """The principals of an auth file's text; InvalidArgumentError saying what is wrong."""
    import yaml  # the server extra's; safe_load builds plain data only (no Python objects)

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("principals"), list):
        raise InvalidArgumentError("expected a mapping with a 'principals' list")
    principals = tuple(_principal(i, e) for i, e in enumerate(doc["principals"]))
    for attr, what in (("name", "name"), ("token_digest", "token_sha256"), ("subject", "mtls_subject")):
        values = [getattr(p, attr) for p in principals if getattr(p, attr) is not None]
        if len(set(values)) != len(values):
            raise InvalidArgumentError(f"two principals have the same {what}")
    return principals


def _signature(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class AuthFile:
    """The principals of one `--auth` file, re-read when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._signature = _signature(path)
            with open(path, encoding="utf-8") as f:
                self._principals = load_principals(f.read())
        except OSError as exc:
            raise InvalidArgumentError(f"--auth {path}: {exc.strerror}") from exc
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"--auth {path}: {exc}") from exc
        self._bad: tuple[int, int, int, int] | None = None

    def principals(self) -> tuple[Principal, ...]:
        """The principals now in force (the file is re-read first if it changed)."""
        try:
            sig = _signature(self.path)
        except OSError:
            return self._principals  # mid-swap or removed: keep what was loaded
        if sig == self._signature or sig == self._bad:
            return self._principals
        with self._lock:
            if sig == self._signature:
                return self._principals
            try:
                with open(self.path, encoding="utf-8") as f:
                    principals = load_principals(f.read())
            except (OSError, InvalidArgumentError) as exc:
                self._bad = sig
                log.error(
                    "--auth %s changed but does not load, keeping the last good one: %s", self.path, exc
                )
                return self._principals
            self._principals, self._signature, self._bad = principals, sig, None
            log.info("--auth %s reloaded: %d principals", self.path, len(principals))
            return principals


def _metadata_value(metadata: Iterable[tuple[str, Any]] | None, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v if isinstance(v, str) else v.decode("latin-1")
    return None


def has_token(metadata: Iterable[tuple[str, Any]] | None) -> bool:
    """Whether a call sent `authorization` metadata: then its token, and nothing else, says who it is."""
    return _metadata_value(metadata, AUTHORIZATION_KEY) is not None


class Authenticator:
    """Turns a call's metadata and TLS peer into a Principal (see the module docstring)."""

    def __init__(self, auth_file: str | None) -> None:
        self.file = AuthFile(auth_file) if auth_file else None

    @property
    def enabled(self) -> bool:
        return self.file is not None

    def authenticate(
        self, metadata: Iterable[tuple[str, Any]] | None, auth_context: Mapping[str, Sequence[bytes]] | None
    ) -> Principal:
        subject_raw = (auth_context or {}).get("x509_subject") or ()
        subject = subject_raw[0].decode("utf-8", "replace") if subject_raw else None
        if self.file is None:
            return Principal(f"cert:{subject}") if subject else OPEN
        principals = self.file.principals()
        header = _metadata_value(metadata, AUTHORIZATION_KEY)
        if header is not None:
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise UnauthenticatedError("the authorization metadata must be 'Bearer <token>'")
            digest = hashlib.sha256(token.strip().encode("utf-8")).digest()
            found = None
            for p in principals:  # every one compared: the time does not say which matched
                if hmac.compare_digest(digest, p.token_digest or _NO_MATCH) and p.token_digest:
                    found = p
            if found is None:
                raise UnauthenticatedError("the bearer token is not one this server accepts")
            return found
        if subject:
            attrs = normalize_subject(subject)
            for p in principals:
                if p.subject is not None and p.subject == attrs:
                    return p
            raise UnauthenticatedError(
                f"the client certificate's subject {excerpt(subject)} is not one this server accepts"
            )
        raise UnauthenticatedError(
            "this server needs credentials: a bearer token (Loader(token=...), $SHARDSTREAM_TOKEN) or a "
            "client certificate of a known subject"
        )

    def has_tokens(self) -> bool:
        return self.file is not None and any(p.token_digest is not None for p in self.file.principals())
