"""Real X.509 certificates made in the test: the maker is loadtest/certs.py (the one copy, shared
with the TLS benchmark; loadtest never imports tests)."""

from __future__ import annotations

from loadtest.certs import Issued, Pki, write_atomic

__all__ = ["Issued", "Pki", "write_atomic"]
