"""``kvcs inspect`` (what a KV cache file, descriptor, manifest or report holds) and
``kvcs keygen`` (a scope key and a producer key pair). Failures: one line, exit 1; usage 2."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from relay.kvcs.descriptor import Descriptor
from relay.kvcs.identifiers import generate_scope_key, scope_id, write_scope_key
from relay.kvcs.kvfile import read_kvfile
from relay.kvcs.manifest import parse_manifest

from .errors import InputError

_SAFETENSORS_MAX_HEADER = 100 << 20


def _descriptor_fields(d: Descriptor) -> dict[str, Any]:
    return {"compat_id": d.compat_id.hex(), "model": d.doc.get("model"),
            "layers": d.layers, "kv_heads": d.kv_heads, "head_dim": d.head_dim,
            "dtype": d.dtype_name, "block_tokens": d.block_tokens}


def _looks_like_safetensors(raw: bytes) -> bool:
    n = int.from_bytes(raw[:8], "little") if len(raw) >= 8 else 0
    return 2 <= n <= _SAFETENSORS_MAX_HEADER and raw[8:9] == b"{"


def describe(path: Path) -> dict[str, Any]:
    """What ``path`` holds, as a JSON-able dict with a ``kind``."""
    with open(path, "rb") as f:
        head = f.read(16)
    if _looks_like_safetensors(head):
        kv = read_kvfile(path)
        d = kv.descriptor
        return {"kind": "kv cache file", **_descriptor_fields(d),
                "k_shape": list(kv.k.shape), "v_shape": list(kv.v.shape),
                "tokens": kv.k.shape[2], "token_ids": kv.tokens is not None,
                "blocks": kv.k.shape[2] // d.block_tokens}
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"{path}: neither a KV cache file nor JSON (descriptor, manifest, "
                         "report)") from None
    if isinstance(doc, dict) and "segments" in doc and "compat" in doc:
        m = parse_manifest(path.read_bytes())
        return {"kind": "manifest", **_descriptor_fields(m.compat),
                "deterministic": m.deterministic, "segments": len(m.segments),
                "blocks": sum(s.blocks for s in m.segments)}
    if isinstance(doc, dict) and "reused_blocks" in doc:
        return {"kind": "fetch report", **{k: doc.get(k) for k in (
            "mode", "exit_code", "namespace", "prompt_blocks", "reused_blocks",
            "objects_verified", "objects_discarded", "recompute_layers", "bytes")}}
    if isinstance(doc, dict) and "confirmed" in doc and "objects" in doc:
        return {"kind": "publish report", **{k: doc.get(k) for k in (
            "namespace", "relays", "tracks", "objects", "bytes", "segments", "layers",
            "confirmed")}}
    try:
        d = Descriptor(doc)
    except Exception as e:  # the library names what is wrong with it
        raise InputError(f"{path}: not a descriptor, manifest or report ({e})") from None
    return {"kind": "descriptor", **_descriptor_fields(d)}


@click.command("inspect")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def inspect_file(file: Path, as_json: bool) -> None:
    """What FILE holds: a KV cache file, a Compatibility Descriptor, a manifest or a
    publish/fetch report — kind, compat ID, shapes, block count. Exit 1 if unreadable."""
    from .cli import _errors

    @_errors
    def run() -> None:
        info = describe(file)
        if as_json:
            click.echo(json.dumps(info, indent=2))
            return
        width = max(len(k) for k in info)
        for k, v in info.items():
            shown = "x".join(map(str, v)) if isinstance(v, list) and k.endswith("shape") else v
            click.echo(f"{k.replace('_', ' '):<{width}}  {shown}")

    run()


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` readable by its owner only; never overwrite a key."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@click.command("keygen")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for scope.key, <kid>.pem (private) and keys/<kid>.pem (public).")
@click.option("--alg", type=click.Choice(["p256", "ed25519"]), default="ed25519",
              show_default=True, help="Producer key algorithm (manifest.cose).")
@click.option("--kid", default="producer", show_default=True,
              help="Key identifier; also the key files' stem, as publish --producer-key and "
                   "fetch --keys expect.")
@click.option("--no-scope-key", is_flag=True, help="Only the producer key pair.")
def keygen(out_dir: Path, alg: str, kid: str, no_scope_key: bool) -> None:
    """Write a scope key (32 random octets, mode 0600) and a producer key pair: the private
    key <kid>.pem (0600, for publish --producer-key) and the public key keys/<kid>.pem (for
    fetch --keys). Existing files are never overwritten (exit 1)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    from relay.kvcs.cose import public_pem

    from .cli import _errors

    @_errors
    def run() -> None:
        if not kid or "/" in kid or kid.startswith("."):
            raise click.BadParameter("a plain file name", param_hint="--kid")
        (out_dir / "keys").mkdir(parents=True, exist_ok=True, mode=0o700)
        scope = out_dir / "scope.key"
        private, public = out_dir / f"{kid}.pem", out_dir / "keys" / f"{kid}.pem"
        for p in ([] if no_scope_key else [scope]) + [private, public]:
            if p.exists():
                raise InputError(f"{p} exists: not overwriting a key")
        key = ec.generate_private_key(ec.SECP256R1()) if alg == "p256" \
            else ed25519.Ed25519PrivateKey.generate()
        _write_private(private, key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        public.write_bytes(public_pem(key))
        if not no_scope_key:
            secret = generate_scope_key()
            write_scope_key(scope, secret)
            click.echo(f"scope key  {scope} (Scope ID {scope_id(secret).hex()})")
        click.echo(f"private    {private} ({alg}, kid {kid!r})")
        click.echo(f"public     {public}")

    run()


__all__ = ["describe", "inspect_file", "keygen"]
