"""Signed bundles: an ed25519 signature over the exact bytes of ``manifest.json``.

The manifest lists every file of the bundle with its sha256, so a signature over it covers the
whole bundle. Checksums alone catch accidents, not tampering: whoever can edit a bundle can
also recompute a checksum. With a trusted public key, :func:`edgesplit.bundle.format.open_verified`
checks the signature before it parses the manifest, so an edited bundle is refused before any
part (and any native library) is loaded.

Keys are ed25519 (the ``cryptography`` package): PEM (``openssl genpkey -algorithm ed25519``,
or ``edgesplit keygen``) or OpenSSH (``ssh-keygen -t ed25519``). The signature lives beside the
manifest in ``manifest.json.sig``: ``{"algorithm": "ed25519", "key_id": ..., "signature": ...}``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from edgesplit.errors import BundleError, InputError
from edgesplit.util import atomic_write_bytes, dump_json, parse_json_object, read_file_bytes

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

SIGNATURE = "manifest.json.sig"
_MAX_KEY_NBYTES = 64 << 10


def key_id(key: Ed25519PublicKey) -> str:
    """A short name for a public key: the first 16 hex digits of the sha256 of its raw bytes."""
    from cryptography.hazmat.primitives import serialization as s

    return hashlib.sha256(key.public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)).hexdigest()[:16]


def load_private_key(path: str | os.PathLike | Ed25519PrivateKey) -> Ed25519PrivateKey:
    """An ed25519 private key from a PEM (PKCS#8) or OpenSSH file, unencrypted.

    Raises:
        InputError: naming the file: missing, encrypted, not a key, or not ed25519.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if isinstance(path, Ed25519PrivateKey):
        return path
    data = read_file_bytes(path, InputError, "signing key", max_nbytes=_MAX_KEY_NBYTES)
    loader = s.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data else s.load_pem_private_key
    try:
        key = loader(data, password=None)
    except TypeError as e:  # cryptography's word for "encrypted, and no password given"
        raise InputError(
            f"{path}: an encrypted key; sign with an unencrypted ed25519 key ({e})"
        ) from e
    except (ValueError, UnsupportedAlgorithm) as e:
        raise InputError(f"{path}: not a PEM or OpenSSH private key ({e})") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path}: a {type(key).__name__.removeprefix('_')}, not an ed25519 key")
    return key


def load_public_key(path: str | os.PathLike | Ed25519PublicKey) -> Ed25519PublicKey:
    """An ed25519 public key from a PEM file, an OpenSSH ``ssh-ed25519 ...`` line, or the private
    key file itself (its public half).

    Raises:
        InputError: naming the file: missing, not a key, or not ed25519.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(path, Ed25519PublicKey):
        return path
    data = read_file_bytes(path, InputError, "trusted key", max_nbytes=_MAX_KEY_NBYTES)
    if b"PRIVATE KEY" in data:
        return load_private_key(path).public_key()
    loader = s.load_ssh_public_key if data.lstrip().startswith(b"ssh-") else s.load_pem_public_key
    try:
        key = loader(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise InputError(f"{path}: not a PEM or OpenSSH public key ({e})") from e
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"{path}: a {type(key).__name__.removeprefix('_')}, not an ed25519 key")
    return key


def signature_json(manifest_bytes: bytes, key: Ed25519PrivateKey) -> bytes:
    """The signature file's content for ``manifest_bytes``."""
    doc = {
        "algorithm": "ed25519",
        "key_id": key_id(key.public_key()),
        "signature": base64.b64encode(key.sign(manifest_bytes)).decode(),
    }
    return dump_json(doc).encode()


def write_signature(bundle_dir: Path, manifest_bytes: bytes, key: Ed25519PrivateKey) -> None:
    atomic_write_bytes(bundle_dir / SIGNATURE, signature_json(manifest_bytes, key))


def check_signature(
    manifest_bytes: bytes, sig_file: bytes | None, key: Ed25519PublicKey, source: str
) -> None:
    """Refuse the manifest unless ``sig_file`` holds a valid signature of it by ``key``.

    Raises:
        BundleError: naming the bundle: unsigned, malformed signature, or not signed by ``key``.
    """
    from cryptography.exceptions import InvalidSignature

    if sig_file is None:
        raise BundleError(f"{source}: not signed (no {SIGNATURE}), and a trusted key was given")
    doc = parse_json_object(sig_file, f"{source}/{SIGNATURE}", BundleError, "signature")
    try:
        if doc.get("algorithm") != "ed25519":
            raise ValueError(f"algorithm {doc.get('algorithm')!r:.40}")
        sig = base64.b64decode(doc["signature"], validate=True)
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{source}/{SIGNATURE}: not an ed25519 signature ({e})") from e
    try:
        key.verify(sig, manifest_bytes)
    except InvalidSignature:
        signer = doc.get("key_id")
        by = (
            f"signed by key {signer:.16}, "
            if isinstance(signer, str) and signer != key_id(key)
            else ""
        )
        raise BundleError(
            f"{source}: the manifest's signature does not verify with the trusted key "
            f"{key_id(key)} "
            f"({by}or the manifest was changed after signing)"
        ) from None


def generate_key(path: str | os.PathLike, *, force: bool = False) -> tuple[Path, Path, str]:
    """A new ed25519 key pair: ``path`` (private, PEM, mode 0600) and ``path.pub`` (public, PEM).

    Returns:
        The two files and the key id.

    Raises:
        InputError: when either file exists (unless ``force``).
    """
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = Path(path), Path(f"{path}.pub")
    for p in (private, public):
        if (p.exists() or p.is_symlink()) and not force:
            raise InputError(f"{p}: exists; choose another name or pass --force to replace it")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    atomic_write_bytes(
        private, pem
    )  # its temp file is made 0600 (mkstemp), so never readable by others
    os.chmod(private, 0o600)
    pub = key.public_key()
    atomic_write_bytes(
        public, pub.public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
    )
    os.chmod(public, 0o644)
    return private, public, key_id(pub)
