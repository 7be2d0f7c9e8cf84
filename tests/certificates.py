"""Self-signed certificates for the TLS tests (the webhooks' and the registry's), made by openssl."""

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A certificate that is its own authority, for the DNS name `name` only (no IP address in
    it), and its key. Skips the test when openssl is not installed (`make test` says so)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
