"""``kvcs publish``, ``kvcs subscribe`` and ``kvcs fetch``: thin click wrappers over the
libraries. Every failure is one line on stderr and a documented non-zero exit code."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from relay.kvcs.cose import KeyStore, load_private_key
from relay.kvcs.descriptor import Descriptor
from relay.kvcs.errors import KvcsError
from relay.kvcs.kvfile import read_kvfile, write_kvfile
from relay.kvcs.plan import SPLIT_RAW, PublicationPlan, TrackSpec
from relay.kvcs.registry import Codec, Component
from relay.kvcs.synthetic import synthetic_descriptor, synthetic_layers, synthetic_tokens
from relay.session.errors import SessionFailure
from relay.session.tokens import read_token_file
from relay.transport import TransportError
from relay.transport.backend import (
    BACKENDS,
    DEFAULT_BACKEND,
    BackendUnavailable,
    default_backend,
    get_backend,
    set_default_backend,
)
from relay.transport.config import CONGESTION_CONTROLS, parse_datagram_size

from .connect import PEER_SETTINGS, RelayAccess
from .engine_options import engine_options
from .engines import MODELS
from .errors import EXIT_ERROR, EXIT_USAGE, PeerError
from .inputs import format_namespace, load_descriptor, load_key, load_tokens, parse_namespace_text
from .output import OutputFile
from .progress import Progress

EXIT_CODES_HELP = """\b
Exit codes:
  0  every layer of the reused prefix retrieved and verified
  1  error (no relay reachable, unreadable input, ...)
  2  bad usage
  3  no publication of the prompt's prefix found
  4  partial: the layers listed in the report (recompute_layers) must be
     recomputed; also when --deadline-ms passed first (deadline_passed)
  5  publications found but refused (manifest compat, manifest.cose absent or bad)
  7  --require-cose: Objects arrived that no signed manifest version listed in
     time (report: unverified_objects); their layers must be recomputed
  8  the relays refused the requests as UNAUTHORIZED (--token missing or wrong)
  9  nothing found, and a relay could not reach its upstream relay to look
     (REQUEST_ERROR TIMEOUT): not "no publication"; retry later or another relay"""


def _fail(message: str, code: int = EXIT_ERROR) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _failure(e: BaseException) -> tuple[str, int] | None:
    """The one line and the exit code a command ends with for ``e``; None for what ends the
    command otherwise (a closed pipe, click's own exits, ``sys.exit``)."""
    if isinstance(e, PeerError):
        return str(e), e.exit_code
    if isinstance(e, KvcsError):
        return str(e), EXIT_ERROR
    if isinstance(e, BrokenPipeError):
        return None  # the reader went (`| head`): click ends quietly, as a pipe stage should
    if isinstance(e, OSError):
        return f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}", EXIT_ERROR
    if isinstance(e, (SessionFailure, TransportError)):
        return f"session: {e}", EXIT_ERROR
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(e, click.ClickException):  # click prints it itself (usage errors exit 2)
        return e.format_message(), e.exit_code
    if isinstance(e, Exception):  # no traceback reaches a user: one line, exit 1
        return f"internal error: {type(e).__name__}: {e}", EXIT_ERROR
    return None


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # aioquic logs a refused handshake itself (no handler configured: Python's last
        # resort prints it); the command says what went wrong in its own one line.
        logging.getLogger("quic").setLevel(logging.CRITICAL)
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click prints these itself (usage errors exit 2)
        except BaseException as e:
            failure = _failure(e)
            if failure is None:
                raise
            _fail(*failure)
    return wrapper


def _access(relay: tuple[str, ...], ca: Path | None, insecure: bool, connect_ms: float,
            token: Path | None = None) -> RelayAccess:
    if not relay:
        raise click.UsageError("give at least one --relay URL")
    if ca is None and not insecure:
        raise click.UsageError("give --ca FILE (or --insecure for loopback development)")
    if ca is not None and not insecure:  # --insecure never reads it
        _check_ca(ca)
    value = None
    if token is not None:
        try:
            value = read_token_file(token)
        except ValueError as e:
            raise PeerError(f"--token: {e}", EXIT_USAGE) from None
    settings = PEER_SETTINGS
    if _congestion_control is not None:
        settings = dataclasses.replace(settings, congestion_control=_congestion_control)
    if _max_datagram_size is not None:
        settings = dataclasses.replace(settings, max_datagram_size=_max_datagram_size)
    return RelayAccess(tuple(relay), ca_file=ca, insecure=insecure, timeout=connect_ms / 1000,
                       token=value, settings=settings)


# --congestion-control of the command running (one per process); None: QuicSettings' default
_congestion_control: str | None = None
# --max-datagram-size likewise: "auto", a number of bytes, or None (QuicSettings' default)
_max_datagram_size: int | str | None = None


def receiver_backend(congestion_control: str | None) -> str:
    """The QUIC backend of a peer command that mostly receives (fetch, subscribe) when none
    is named: qh3 where it is installed, else aioquic. What such a peer sends is requests and
    ACKs, so its own congestion control hardly matters (the relay's governs the bytes that
    flow to it), and qh3 receives at a fraction of aioquic's CPU per packet
    (docs/transport.md, "Which backend by default"). Naming an aioquic controller asks for
    aioquic."""
    if congestion_control is None:
        try:
            get_backend("qh3")
        except BackendUnavailable:
            pass
        else:
            return "qh3"
    return "aioquic"


def _with_quic_backend(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Take --quic-backend and --congestion-control off the command's arguments: the
    backend becomes the process's client backend (every session of a peer command is a
    client), the controller goes into the sessions' QUIC settings (``_access``). A backend
    of None (a receiving command's default) is :func:`receiver_backend`'s choice."""
    @functools.wraps(fn)
    def wrapper(*args: Any, quic_backend: str | None, congestion_control: str | None,
                max_datagram_size: str | None = None, **kwargs: Any) -> Any:
        global _congestion_control, _max_datagram_size
        if quic_backend is None:
            quic_backend = receiver_backend(congestion_control)
        try:
            get_backend(quic_backend)
        except BackendUnavailable as e:
            _fail(str(e), 2)
        if congestion_control is not None and quic_backend != "aioquic":
            _fail(f"--congestion-control applies to aioquic only: {quic_backend}'s native "
                  "core has its own congestion control and no choice", 2)
        set_default_backend(client=quic_backend)
        _congestion_control = congestion_control
        try:
            _max_datagram_size = None if max_datagram_size is None \
                else parse_datagram_size(max_datagram_size)
        except ValueError as e:
            _fail(f"--max-datagram-size: {e}", 2)
        return fn(*args, **kwargs)
    return wrapper


def _check_ca(ca: Path) -> None:
    """Load the CA file now: a file that is no certificate is a usage error named at once,
    not a handshake failure (and a timeout) later."""
    try:
        ssl.create_default_context(cafile=str(ca))
    except ssl.SSLError as e:
        raise PeerError(f"--ca {ca}: not a PEM certificate ({e.reason or e})",
                        EXIT_USAGE) from None
    except OSError as e:
        raise PeerError(f"--ca {ca}: {e.strerror or e}", EXIT_USAGE) from None


def relay_options(fn: Callable[..., Any], *, receives: bool = False) -> Callable[..., Any]:
    """The options every peer command takes to reach relays. ``receives``: a command whose
    bytes flow from the relay (fetch, subscribe), whose default backend is
    :func:`receiver_backend`'s; a publishing command defaults to aioquic with bbr, which
    keeps its rate on lossy paths where qh3's controller collapses."""
    fn = _with_quic_backend(fn)
    backend_help = "QUIC library: aioquic, or qh3 (the fast extra)."
    if receives:
        backend_help += (" Default: qh3 where installed (a fetch's bytes are the relay's to "
                         "send; qh3 receives them at less CPU), aioquic if "
                         "--congestion-control is given or qh3 is not installed.")
    fn = click.option("--quic-backend", type=click.Choice(BACKENDS),
                      default=None if receives else DEFAULT_BACKEND,
                      show_default=not receives, envvar="KVCS_QUIC_BACKEND",
                      help=backend_help)(fn)
    fn = click.option("--congestion-control", type=click.Choice(CONGESTION_CONTROLS),
                      default=None, envvar="KVCS_CONGESTION_CONTROL",
                      help=f"aioquic congestion controller (default "
                           f"{PEER_SETTINGS.congestion_control}: paces at a model of the "
                           "path, random loss does not slow it). qh3 has no choice.")(fn)
    fn = click.option("--max-datagram-size", default=None, envvar="KVCS_MAX_DATAGRAM_SIZE",
                      metavar="auto|BYTES",
                      help="UDP payload size of the QUIC packets sent: auto (default: the MTU "
                           "of the route to the relay minus IP and UDP headers, up to 16384 on "
                           "aioquic, 65507 on qh3) "
                           "or 1200..16384 (1200: safe on any path). See docs/transport.md, "
                           '"Datagram size".')(fn)
    fn = click.option("--token", type=click.Path(dir_okay=False, path_type=Path),
                      envvar="KVCS_TOKEN_FILE",
                      help="File holding the authorization token sent to the relays "
                           "(a wrong one: exit 8).")(fn)
    fn = click.option("--connect-ms", type=float, default=10000, show_default=True,
                      help="Give up on a relay that has not completed SETUP by then.")(fn)
    fn = click.option("--insecure", is_flag=True,
                      help="Do not verify the relay certificate (loopback development only).")(fn)
    fn = click.option("--ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      help="CA / self-signed certificate of the relay.")(fn)
    fn = click.option("--relay", "relay", multiple=True, metavar="URL",
                      help="Relay URL, e.g. moqt://127.0.0.1:4433/ (repeatable, in order).")(fn)
    return fn


# -- publish ----------------------------------------------------------------------------------


def _parse_synthetic(spec: str) -> tuple[int, int, int, int, str, int]:
    parts = spec.split(",")
    if len(parts) != 6:
        raise click.BadParameter("expected LAYERS,HEADS,DIM,TOKENS,DTYPE,SEED",
                                 param_hint="--synthetic")
    try:
        layers, heads, dim, tokens, seed = (int(parts[i]) for i in (0, 1, 2, 3, 5))
    except ValueError:
        raise click.BadParameter("LAYERS, HEADS, DIM, TOKENS and SEED are integers",
                                 param_hint="--synthetic") from None
    return layers, heads, dim, tokens, parts[4], seed


def _segments(spec: str | None, chunk_blocks: int | None, total: int) -> list[int] | None:
    if spec:
        try:
            return [int(x) for x in spec.split(",")]
        except ValueError:
            raise click.BadParameter("a comma-separated list of block counts",
                                     param_hint="--segments") from None
    if chunk_blocks:
        sizes = [chunk_blocks] * (total // chunk_blocks)
        if total % chunk_blocks:
            sizes.append(total % chunk_blocks)
        return sizes
    return None


@click.command("publish")
@relay_options
@click.option("--kvfile", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="KV cache file (safetensors, see relay/kvcs/kvfile.py).")
@click.option("--synthetic", metavar="LAYERS,HEADS,DIM,TOKENS,DTYPE,SEED",
              help="Generate a deterministic synthetic cache instead of reading a file.")
@click.option("--block-tokens", type=int, default=16, show_default=True,
              help="Block size of a synthetic cache's descriptor.")
@click.option("--descriptor", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Compatibility Descriptor (JSON); default: the file's or the synthetic one.")
@click.option("--scope-key", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tokens", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Token IDs (one per line or a JSON array); default: the file's / synthetic.")
@click.option("--producer-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM private key (P-256 or Ed25519): publish manifest.cose.")
@click.option("--kid", help="Key identifier for manifest.cose (default: the key file stem).")
@click.option("--extra-codec", type=click.Choice(["zstd", "int8"]),
              help="Also publish a kv.<codec> track next to k.raw / v.raw.")
@click.option("--segments", help="Chunked prefill: blocks per segment, e.g. 4,4,2.")
@click.option("--chunk-blocks", type=int, help="Chunked prefill: blocks per chunk.")
@click.option("--deterministic", is_flag=True, help='Set "deterministic": true in the manifest.')
@click.option("--layer-ms", type=float, default=0.0, show_default=True,
              help="Emulated prefill time per layer, waited before publishing it.")
@click.option("--confirm", type=click.Choice(["fetch", "status", "none"]), default="fetch",
              show_default=True, help="How to confirm that each relay holds every Object.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the published cache (K/V, descriptor, tokens) as a KV file.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the publication summary as JSON.")
@click.option("--quiet", is_flag=True, help="No progress line (there is none off a terminal).")
@_errors
def publish(relay: tuple[str, ...], ca: Path | None, insecure: bool, connect_ms: float,
            token: Path | None, kvfile: Path | None,
            synthetic: str | None, block_tokens: int, descriptor: Path | None, scope_key: Path,
            tokens: Path | None, producer_key: Path | None, kid: str | None,
            extra_codec: str | None, segments: str | None, chunk_blocks: int | None,
            deterministic: bool, layer_ms: float, confirm: str, out: Path | None,
            report: Path | None, quiet: bool = False) -> None:
    """Publish a KV cache to the relay(s): PUBLISH every track, PUBLISH_NAMESPACE, then the
    Objects layer by layer. Exits 0 once every relay confirmed every Object (see --confirm);
    prints the namespace and a summary. Exit codes: 0 ok, 1 error, 2 usage, 6 unconfirmed,
    8 unauthorized (--token)."""
    from .publisher import PublishOptions, publish_plan

    access = _access(relay, ca, insecure, connect_ms, token)
    if (kvfile is None) == (synthetic is None):
        raise click.UsageError("give exactly one of --kvfile and --synthetic")
    desc = load_descriptor(descriptor) if descriptor is not None else None
    if kvfile is not None:
        f = read_kvfile(kvfile)
        k, v, file_tokens = f.k, f.v, f.tokens
        desc = desc or f.descriptor
    else:
        assert synthetic is not None
        layers, heads, dim, ntok, dtype, seed = _parse_synthetic(synthetic)
        try:
            # made layer by layer as published: the process never holds the whole cache
            k, v = synthetic_layers(layers, heads, dim, ntok, dtype, seed)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--synthetic") from None
        desc = desc or synthetic_descriptor(layers, heads, dim, dtype, block_tokens)
        file_tokens = synthetic_tokens(ntok, seed)
    tok = load_tokens(tokens) if tokens is not None else file_tokens
    if tok is None:
        raise click.UsageError("the KV file has no token IDs: give --tokens")
    specs: list[TrackSpec] = list(SPLIT_RAW)
    if extra_codec:
        specs.append(TrackSpec(Component.KV, Codec[extra_codec.upper()]))
    signer = None
    if producer_key is not None:
        signer = (load_private_key(producer_key), (kid or producer_key.stem).encode())
    total = min(k.shape[2], len(tok)) // desc.block_tokens
    try:
        plan = PublicationPlan(k, v, desc, load_key(scope_key), tok, tracks=specs,
                               segment_blocks=_segments(segments, chunk_blocks, total),
                               deterministic=deterministic, signer=signer)
    except ValueError as e:
        raise PeerError(str(e)) from None
    progress = Progress("publish", plan.descriptor.layers * len(plan.segments),
                        k.nbytes + v.nbytes, quiet=quiet)
    try:
        summary = asyncio.run(publish_plan(plan, access, PublishOptions(
            layer_ms=layer_ms, confirm=confirm, on_layer=progress.layer)))
    finally:
        progress.close()
    if out is not None:  # only once published: a failed publish leaves nothing behind
        write_kvfile(out, k, v, desc, tok)
    doc = summary.to_json()
    if report is not None:
        report.write_text(json.dumps(doc, indent=2) + "\n")
    click.echo(format_namespace(plan.namespace))
    click.echo(f"published {summary.objects} objects ({summary.bytes} bytes), "
               f"{summary.segments} segment(s) x {summary.layers} layers, "
               f"{len(summary.tracks)} tracks to {len(summary.relays)} relay(s) in "
               f"{summary.elapsed_s:.2f} s; confirmed: {summary.confirmed}", err=True)


# -- subscribe / fetch ------------------------------------------------------------------------


def consumer_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--descriptor", required=True,
                     type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="Compatibility Descriptor (JSON) of the consumer's model."),
        click.option("--scope-key", required=True,
                     type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("--tokens", required=True,
                     type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="The prompt's token IDs (one per line or a JSON array)."),
        click.option("--codec", default="raw", show_default=True,
                     help="Preferred codec of the data tracks (raw, zstd, int8)."),
        click.option("--joint", is_flag=True, help="Prefer the kv.<codec> track to k + v."),
        click.option("--require-cose", is_flag=True,
                     help="Refuse publications without a valid manifest.cose."),
        click.option("--keys", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     help="Producer key store: a directory of <kid>.pem public keys."),
        click.option("--namespace", "namespaces", multiple=True, metavar="NS",
                     help="A publication known from an index (kvcs-1/hex:<scope>/..., as "
                          "kvcs publish prints it), tried "
                          "before discovery (repeatable)."),
        click.option("--index-blocks", type=int,
                     help="Leading blocks the index says the --namespace publication shares "
                          "with the prompt (for a prompt that diverges inside a segment)."),
        click.option("--max-blocks", type=int, help="Reuse at most this many blocks."),
        click.option("--recompute-ms-per-layer", type=float, default=50.0, show_default=True,
                     help="Recomputation time per layer; bounds recovery (never below "
                          "10 round trips of the path, nor 250 ms)."),
        click.option("--wait-ms", type=float, help="Discovery wait for a NAMESPACE "
                     "(default 10000 for subscribe, 500 for fetch)."),
        click.option("--stall-ms", type=float, default=10000, show_default=True,
                     help="Live: no progress for this long counts as a failure."),
        click.option("--deadline-ms", type=click.FloatRange(min=0, min_open=True),
                     default=60000, show_default=True,
                     help="Give up on the whole retrieval after this long and report the "
                          "usable layers and those to recompute (exit 4); relays get "
                          "FILL_TIMEOUT from the time left."),
        click.option("--connections", type=click.IntRange(1, 16), default=1,
                     show_default=True,
                     help="QUIC connections to the relay for FETCHing layers, the layers "
                          "split across them: on a lossy path each has its own congestion "
                          "window, and a relay with --workers may serve each on its own "
                          "core; the report says what each carried (docs/deployment.md)."),
        click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
                     help="KV cache file for the reused prefix."),
        click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
                     help="JSON report: per-layer times, bytes, verification, recovery."),
        click.option("--quiet", is_flag=True,
                     help="No progress line (there is none off a terminal)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return relay_options(engine_options(fn), receives=True)


def _reported(mode: str, kw: dict[str, Any]) -> None:
    """`_consume`, whose ``--report`` is written on every exit code: a retrieval that ends
    in an error (nothing found: 3, upstream unreachable: 9, unauthorized: 8, ...) writes what
    it knows then (its decisions, the relays it tried), with the exit code and the line the
    command printed as ``error``. Those are the runs an operator most wants it for."""
    try:
        _consume(mode, **kw)
    except BaseException as e:
        report: Path | None = kw.get("report")
        failure = _failure(e)
        if report is not None and failure is not None:
            doc = dict(e.report if isinstance(e, PeerError) and e.report else {"mode": mode})
            doc.update(exit_code=failure[1], error=failure[0],
                       quic_backend=default_backend("client"))
            with contextlib.suppress(OSError):  # the command's own failure is what to say
                report.write_text(json.dumps(doc, indent=2) + "\n")
        raise


def _consume(mode: str, relay: tuple[str, ...], ca: Path | None, insecure: bool,
             connect_ms: float, token: Path | None,
             descriptor: Path, scope_key: Path, tokens: Path, codec: str, joint: bool,
             require_cose: bool, keys: Path | None, namespaces: tuple[str, ...],
             index_blocks: int | None, max_blocks: int | None, recompute_ms_per_layer: float,
             wait_ms: float | None, stall_ms: float, deadline_ms: float, out: Path | None,
             report: Path | None, engine: str, generate: int, threads: int | None,
             quiet: bool = False, connections: int = 1) -> None:
    from . import engine_options as eo
    from .errors import NotFound, UpstreamUnreachable
    from .subscriber import RetrieveOptions, retrieve

    if generate:
        eo.require(engine)  # a missing torch: exit 2 before anything else
    access = _access(relay, ca, insecure, connect_ms, token)
    desc: Descriptor = load_descriptor(descriptor)
    eng, load_ms = eo.load(engine, "smollm2", threads) if generate else (None, 0.0)
    if eng is not None:
        eo.check(eng, desc)  # a cache for another model or K layout is refused up front
    store = KeyStore.from_directory(keys) if keys is not None else None
    if require_cose and (store is None or len(store) == 0):
        raise click.UsageError("--require-cose needs --keys DIR with producer public keys")
    pubs = [(parse_namespace_text(n), index_blocks) for n in namespaces]
    window = (wait_ms if wait_ms is not None else (10000 if mode == "live" else 500)) / 1000
    opts = RetrieveOptions(access, desc, load_key(scope_key), load_tokens(tokens), mode=mode,
                           codec=codec, joint=joint, require_cose=require_cose, keys=store,
                           publications=pubs, max_blocks=max_blocks,
                           recompute_ms_per_layer=recompute_ms_per_layer,
                           discovery_window=window, stall_timeout=stall_ms / 1000,
                           deadline=deadline_ms / 1000, connections=connections)
    output = OutputFile(out, desc, opts.tokens) if out is not None else None
    if output is not None:  # filled as Objects arrive, in place when the retrieval ends
        opts.allocate = output.allocate
        opts.deliver = lambda res: output.write(res.k, res.v, res.tokens)
    progress = Progress("subscribe" if mode == "live" else "fetch", quiet=quiet)
    opts.progress = progress.retrieval
    t0 = time.perf_counter()
    try:
        res = asyncio.run(retrieve(opts))
    except (NotFound, UpstreamUnreachable):
        if eng is not None:  # nothing to reuse: the engine still answers, from its own prefill
            eo.echo(eo.consumer_continuation(eng, opts.tokens, generate, k=None, v=None,
                                             fetch_ms=(time.perf_counter() - t0) * 1000,
                                             timed=False), load_ms)
        raise
    finally:
        progress.close()
        if output is not None:
            output.discard()  # what a failed retrieval left (renamed away on success)
    fetch_ms = (time.perf_counter() - t0) * 1000
    if eng is not None:
        # Layers to recompute spoil the whole cache (each layer's K/V needs the layers below):
        # then the engine prefills the prompt itself.
        usable = not res.recompute_layers and not res.report["unverified_objects"]
        gen = eo.consumer_continuation(eng, opts.tokens, generate,
                                       k=res.k if usable else None,
                                       v=res.v if usable else None,
                                       fetch_ms=fetch_ms, timed=report is not None)
        res.report["generation"] = {**gen, "model_load_ms": load_ms}
        eo.echo(gen, load_ms)
    res.report["quic_backend"] = default_backend("client")  # the one this run chose
    if report is not None:
        report.write_text(json.dumps(res.report, indent=2) + "\n")
    r = res.report
    line = (f"{r['namespace']}: reused {r['reused_blocks']} of {r['prompt_blocks']} blocks, "
            f"{r['objects_verified']} objects verified, {r['objects_discarded']} discarded, "
            f"{r['retries']} retries")
    click.echo(line, err=True)
    if r["unverified_objects"]:
        _fail(f"no signed manifest version listed {len(r['unverified_objects'])} Objects; "
              f"layers to recompute: {res.recompute_layers}", res.exit_code)
    if r["deadline_passed"]:
        _fail(f"deadline of {deadline_ms:g} ms passed; layers to recompute: "
              f"{res.recompute_layers}", res.exit_code)
    if res.recompute_layers:
        _fail(f"layers to recompute: {res.recompute_layers}", res.exit_code)
    if res.exit_code:
        sys.exit(res.exit_code)


@click.command("subscribe", epilog=EXIT_CODES_HELP)
@consumer_options
@_errors
def subscribe(**kw: Any) -> None:
    """Retrieve a cache while it is produced (kvcs-draft 5.2): discover, SUBSCRIBE with Next
    Object + fill from {0,0}, verify, recover; falls back to FETCH if production is over."""
    _reported("live", kw)


@click.command("fetch", epilog=EXIT_CODES_HELP)
@consumer_options
@_errors
def fetch(**kw: Any) -> None:
    """Retrieve a completed cache (kvcs-draft 5.3): discover, FETCH layers in ascending order
    (OBJECTID_FILTER for a prompt that diverges inside a segment), verify, recover."""
    _reported("completed", kw)


# -- prefill (a real model computes the cache) ------------------------------------------------


@click.command("prefill")
@relay_options
@engine_options
@click.option("--model", "model_name", type=click.Choice(MODELS),
              default="smollm2", show_default=True,
              help="smollm2: SmolLM2-135M-Instruct (needs requirements-model.txt); "
                   "tiny: a seeded 2-layer random model (--engine numpy only).")
@click.option("--scope-key", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tokens", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The prompt's token IDs (one per line or a JSON array).")
@click.option("--text", help="The prompt as text (smollm2 only; the numpy engine's minimal "
              "tokenizer is relay/model/tokenizer.py, transformers' its own).")
@click.option("--block-tokens", type=int, default=16, show_default=True)
@click.option("--chunk-blocks", type=int,
              help="Chunked prefill: blocks per pass, one segment each (default: one pass).")
@click.option("--confirm", type=click.Choice(["fetch", "status", "none"]), default="fetch",
              show_default=True, help="How to confirm that each relay holds every Object.")
@click.option("--descriptor-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the model's Compatibility Descriptor (for subscribe/fetch).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the published cache (K/V, descriptor, tokens) as a KV file.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the publication summary (and --generate's tokens) as JSON.")
@_errors
def prefill(relay: tuple[str, ...], ca: Path | None, insecure: bool, connect_ms: float,
            token: Path | None, engine: str, generate: int, threads: int | None,
            model_name: str, scope_key: Path, tokens: Path | None, text: str | None,
            block_tokens: int, chunk_blocks: int | None, confirm: str,
            descriptor_out: Path | None, out: Path | None, report: Path | None) -> None:
    """Prefill a prompt with a real model and publish its KV cache, each layer as soon as
    it is computed. Prints the namespace, then (--generate N) the prompt's greedy
    continuation by the producer itself. Exit codes as publish."""
    from . import engine_options as eo
    from .engines.streaming import prefill_and_publish
    from .publisher import PublishOptions

    if engine == "transformers" and model_name == "tiny":
        raise click.UsageError("--model tiny runs on --engine numpy only")
    if (tokens is None) == (text is None):
        raise click.UsageError("give exactly one of --tokens and --text")
    if text is not None and model_name == "tiny":
        raise click.UsageError("--text needs --model smollm2")
    eo.require(engine)  # a missing torch: exit 2 before anything else
    access = _access(relay, ca, insecure, connect_ms, token)
    eng, load_ms = eo.load(engine, model_name, threads)
    desc = eng.descriptor(block_tokens)
    tok = load_tokens(tokens) if tokens is not None else eng.encode(text or "")
    if descriptor_out is not None:
        descriptor_out.write_bytes(desc.canonical_json() + b"\n")
    try:
        res = asyncio.run(prefill_and_publish(eng, desc, load_key(scope_key), tok, access,
                                              chunk_blocks=chunk_blocks,
                                              options=PublishOptions(confirm=confirm)))
    except ValueError as e:
        raise PeerError(str(e)) from None
    if out is not None:
        write_kvfile(out, res.plan.k, res.plan.v, desc, tok[:res.plan.k.shape[2]])
    doc = res.summary.to_json()
    click.echo(format_namespace(res.plan.namespace))
    s = res.summary
    click.echo(f"prefilled {len(tok)} tokens with {eng.name}; published {s.objects} objects "
               f"({s.bytes} bytes), {s.segments} segment(s) x {s.layers} layers in "
               f"{s.elapsed_s:.2f} s; confirmed: {s.confirmed}; "
               f"next token {int(res.logits.argmax())}", err=True)
    if generate:
        doc["generation"] = eo.producer_continuation(eng, res.cache, res.logits, generate)
        eo.echo(doc["generation"], load_ms)
    if report is not None:
        report.write_text(json.dumps(doc, indent=2) + "\n")


def register(main: click.Group) -> None:
    """Add the peer commands to the ``kvcs`` group."""
    for cmd in (publish, subscribe, fetch, prefill):
        main.add_command(cmd)
    from .tools import inspect_file, keygen

    main.add_command(inspect_file)
    main.add_command(keygen)
