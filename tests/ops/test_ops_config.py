"""Configuration: flag > env > file > default, secrets masked, one-line errors with exit 2,
every key documented; logs in JSON with tokens scrubbed."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from relay import logs
from relay.admin_client import admin
from relay.config import KEYS, ConfigError, load, render
from relay.options import PASSED_ON, LaunchOptions, RelayConfig, RelayOptions, settings_table
from relay.transport import QuicSettings

ROOT = Path(__file__).resolve().parents[2]
KVCS = [sys.executable, "-m", "relay.cli"]


def _file(tmp: Path, text: str) -> Path:
    p = tmp / "relay.toml"
    p.write_text(text)
    return p


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    f = _file(tmp_path, 'listen = "127.0.0.1:1111"\nmemory_bytes = 100\nlmdb_bytes = 200\n'
              'upstream = ["moqt://127.0.0.1:7/"]\n')
    env = {"KVCS_RELAY_MEMORY_BYTES": "300", "KVCS_RELAY_LMDB_BYTES": "400"}
    s = load({"lmdb_bytes": "500"}, env, f)
    assert s.lmdb_bytes == 500 and s.sources["lmdb_bytes"] == "flag --lmdb-bytes"
    assert s.memory_bytes == 300 and s.sources["memory_bytes"] == "env KVCS_RELAY_MEMORY_BYTES"
    assert s.listen == ("127.0.0.1", 1111) and s.sources["listen"].startswith("file ")
    assert s.upstream == ["moqt://127.0.0.1:7/"]
    assert s.drain_timeout == 10.0 and s.sources["drain_timeout"] == "default"
    # env lists are comma-separated; env may name the file
    s = load({}, {"KVCS_RELAY_CONFIG": str(f),
                  "KVCS_RELAY_UPSTREAM": "moqt://a:1/, https://b:2/moq"})
    assert s.upstream == ["moqt://a:1/", "https://b:2/moq"] and s.memory_bytes == 100
    cfg = load({"metrics_listen": "off", "fill_timeout": "2.5"}, {}).relay_config()
    assert cfg.metrics_listen is None and cfg.options.default_fill_timeout == 2.5


def test_max_datagram_size_takes_auto_or_bytes_from_flag_env_and_file(tmp_path: Path) -> None:
    assert load({}, {}).relay_config().max_datagram_size == "auto"  # the default
    assert load({"max_datagram_size": "AUTO"}, {}).max_datagram_size == "auto"
    assert load({}, {"KVCS_RELAY_MAX_DATAGRAM_SIZE": "auto"},
                _file(tmp_path, "max_datagram_size = 1200\n")).max_datagram_size == "auto"
    assert load({}, {}, _file(tmp_path, 'max_datagram_size = "auto"\n')).max_datagram_size \
        == "auto"
    s = load({}, {"KVCS_RELAY_MAX_DATAGRAM_SIZE": "1200"}, _file(tmp_path, 'max_datagram_size'
                                                                 ' = "auto"\n'))
    assert s.relay_config().max_datagram_size == 1200
    assert load({}, {}, _file(tmp_path, "max_datagram_size = 8952\n")).max_datagram_size == 8952


@pytest.mark.parametrize(("flags", "env", "text", "needle"), [
    ({"listen": "nope"}, {}, "", "listen (flag --listen)"),
    ({}, {"KVCS_RELAY_MEMORY_BYTES": "lots"}, "", "memory_bytes (env KVCS_RELAY_MEMORY_BYTES)"),
    ({}, {}, "colour = 1\n", "unknown key 'colour'"),
    ({}, {}, "listen = [\n", "relay.toml"),
    ({}, {}, '[[auth.tokens]]\ntoken = "t"\nroles = ["admin"]\n', "unknown role"),
    ({"cert": __file__}, {}, "", "cert and key go together"),
    ({}, {"KVCS_RELAY_LOG_FORMAT": "xml"}, "", "log_format"),
    ({}, {}, "max_datagram_size = 1100\n", "max_datagram_size (file "),
    ({"max_datagram_size": "jumbo"}, {}, "", "max_datagram_size (flag --max-datagram-size)"),
])
def test_invalid_values_name_the_key_and_source(tmp_path: Path, flags: dict[str, str],
                                                env: dict[str, str], text: str,
                                                needle: str) -> None:
    f = _file(tmp_path, text) if text else None
    with pytest.raises(ConfigError) as e:
        load(flags, env, f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KVCS_RELAY_")}
    full.update(env)
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run(KVCS + args, env=full, cwd=cwd, capture_output=True, text=True,
                          timeout=30)


def test_print_config_masks_secrets_and_shows_sources(tmp_path: Path) -> None:
    f = _file(tmp_path, 'memory_bytes = 100\n[[auth.tokens]]\ntoken = "hunter2-secret"\n'
              'prefixes = ["kvcs-1"]\nroles = ["publish"]\n')
    p = _run(["relay", "--config", str(f), "--print-config", "--listen", "127.0.0.1:5"],
             {"KVCS_RELAY_LOG_FORMAT": "json"}, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "hunter2-secret" not in p.stdout + p.stderr
    assert 'token = "***"' in p.stdout
    assert 'listen = "127.0.0.1:5"  # flag --listen' in p.stdout
    assert 'log_format = "json"  # env KVCS_RELAY_LOG_FORMAT' in p.stdout
    assert "memory_bytes = 100  # file" in p.stdout
    assert not (tmp_path / "data").exists()  # printing starts nothing


def test_invalid_configuration_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, env in ((["relay", "--drain-timeout", "-1"], {}),
                      (["relay"], {"KVCS_RELAY_LISTEN": "127.0.0.1:99999"}),
                      (["relay", "--config", str(tmp_path / "missing.toml")], {})):
        p = _run(args, env, tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
        assert "Traceback" not in p.stderr


@pytest.mark.parametrize(("listen", "upstream", "own"), [
    ("127.0.0.1:4433", "moqt://127.0.0.1:4433/", True),
    ("127.0.0.1:4433", "moqt://LocalHost:4433/", True),
    ("127.0.0.1:4433", "https://127.0.0.1:4433/moq", True),  # one port serves both
    ("127.0.0.1:4433", "moqt://0.0.0.0:4433/", True),
    ("[::1]:4433", "moqt://[::1]:4433/", True),
    ("0.0.0.0:4433", "moqt://127.0.0.1:4433/", True),
    ("0.0.0.0:4433", "moqt://127.0.0.9:4433/", True),  # the whole 127/8 is this host's
    ("[::]:443", "https://localhost/moq", True),  # https's default port
    ("127.0.0.1:4433", "moqt://127.0.0.1:4434/", False),
    ("127.0.0.1:4433", "moqt://127.0.0.2:4433/", False),  # not where the listener is bound
    ("0.0.0.0:4433", "moqt://[::1]:4433/", False),  # an IPv4 listener
    ("127.0.0.1:4433", "moqt://relay.example:4433/", False),  # names are not resolved
    ("127.0.0.1:0", "moqt://127.0.0.1:443/", False),
])
def test_an_upstream_that_is_the_own_listener_is_refused(listen: str, upstream: str,
                                                           own: bool) -> None:
    flags = {"listen": listen, "upstream": [upstream]}
    if not own:
        assert load(flags, {}).upstream == [upstream]
        return
    with pytest.raises(ConfigError) as e:
        load(flags, {})
    assert str(e.value).startswith("upstream (flag --upstream): ")
    assert "own listener" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("upstream", ["moqt://:4433/", "tcp://relay:4433/",
                                      "moqt://relay:99999/"])
def test_an_upstream_that_names_no_relay_is_refused(upstream: str) -> None:
    with pytest.raises(ConfigError) as e:
        load({"upstream": [upstream]}, {})
    assert str(e.value).startswith("upstream (flag --upstream): ")


def test_kvcs_relay_refuses_to_be_its_own_upstream(tmp_path: Path) -> None:
    for extra in ([], ["--print-config"]):
        p = _run(["relay", "--listen", "127.0.0.1:4999", "--upstream",
                  "moqt://localhost:4999/", *extra], {}, tmp_path)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: upstream"), p.stderr
        assert "own listener" in lines[0] and p.stdout == ""
        assert not (tmp_path / "data").exists()  # nothing started


def test_tokens_file_adds_tokens(tmp_path: Path) -> None:
    t = tmp_path / "tokens.toml"
    t.write_text('[[auth.tokens]]\ntoken = "b"\nprefixes = ["kvcs-1"]\nroles = ["subscribe"]\n')
    f = _file(tmp_path, f'tokens_file = "{t}"\n[[auth.tokens]]\ntoken = "a"\n')
    s = load({}, {}, f)
    assert [x["token"] for x in s.auth_tokens] == ["a", "b"]
    assert "\"b\"" not in render(s)
    t.write_text('listen = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match="holds only"):
        load({}, {}, f)


def test_the_docs_table_is_what_the_settings_render() -> None:
    """docs/configuration.md holds exactly the table relay/options.py renders, and no other
    key row: a new setting without docs, or docs of a setting that changed, fail here."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    table = settings_table()
    assert table in doc, "run scripts/config_table.py and paste its table into the docs"
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    assert [ln for ln in doc.splitlines() if ln.startswith("| `")] == rows
    assert [r.split("|")[1].strip() for r in rows] == [f"`{k.name}`" for k in KEYS]
    assert "[[auth.tokens]]" in doc


def test_every_setting_of_the_relay_has_a_key_and_the_keys_set_it() -> None:
    """Configuration defined once: every field of RelayConfig and RelayOptions a user may
    set carries setting metadata (so it has a flag, an env var and a TOML key), and a value
    given for each key reaches its field."""
    not_settings = {"listen_host", "listen_port",  # `listen`
                    "upstream_token", "peer_token", "auth_tokens", "admin_token",  # files
                    "scope_quotas",  # files
                    "quic_backend", "metrics_listen",  # the launcher's, passed on
                    "options", "worker", "clock",  # composition, workers, tests
                    "options.session"}  # the session's own settings (SessionConfig)
    fields = {f.name for f in dataclasses.fields(RelayConfig)} | \
        {f"options.{f.name}" for f in dataclasses.fields(RelayOptions)}
    keyed = {("options." if k.owner is RelayOptions else "") + k.field.name
             for k in KEYS if k.owner is not LaunchOptions}
    assert fields - not_settings == keyed
    assert set(PASSED_ON) <= {f.name for f in dataclasses.fields(LaunchOptions)}
    cfg = load({"send_buffer_bytes": "4096", "wt_path": "/kv", "fill_timeout": "2.5",
                "in_flight_wait": "0.25", "max_sessions": "7", "upstream_push": True,
                "listen": "127.0.0.1:7", "quic_backend": "qh3",
                "metrics_listen": "127.0.0.1:9"}, {}).relay_config()
    assert (cfg.send_buffer_bytes, cfg.wt_path, cfg.options.default_fill_timeout) == \
        (4096, "/kv", 2.5)
    assert (cfg.options.max_sessions, cfg.options.upstream_push) == (7, True)
    assert cfg.options.in_flight_wait == 0.25
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 7)
    assert (cfg.quic_backend, cfg.metrics_listen) == ("qh3", ("127.0.0.1", 9))


def test_the_relay_defaults_are_the_transports() -> None:
    """relay/options.py cannot import the transport, so it writes QUIC's defaults itself:
    they must stay the transport's own (the relay has no reason to differ)."""
    quic = {f.name: f.default for f in dataclasses.fields(QuicSettings)}
    assert RelayConfig.max_datagram_size == quic["max_datagram_size"]
    assert RelayConfig.congestion_control == quic["congestion_control"]


def test_render_round_trips_through_the_file_loader(tmp_path: Path) -> None:
    s = load({"upstream": ("moqt://127.0.0.1:7/",), "metrics_listen": "off"}, {})
    f = _file(tmp_path, render(s))
    again = load({}, {}, f)
    assert again.values == s.values


def test_json_logs_scrub_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.setup("INFO", "json", secrets=["tok-123"])
        logging.getLogger("kvcs.relay").info("session closed: code 0x%x %s", 0x3, "tok-123",
                                             extra={"code": 3})
        line = capsys.readouterr().err.strip()
        rec = json.loads(line)
        assert rec["msg"] == "session closed: code 0x3 ***" and rec["code"] == 3
        assert rec["level"] == "info" and rec["logger"] == "kvcs.relay"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_admin_token_file_is_read_checked_and_never_rendered(tmp_path: Path) -> None:
    t = tmp_path / "admin.token"
    t.write_text("  admin-secret-0123456789\n")
    s = load({"admin_token_file": str(t)}, {})
    assert s.admin_token == "admin-secret-0123456789"
    assert s.relay_config().admin_token == "admin-secret-0123456789"
    assert "admin-secret" not in render(s)
    assert load({}, {}).relay_config().admin_token is None
    for text in ("", "short", "two tokens-0123456789"):
        t.write_text(text)
        with pytest.raises(ConfigError, match="admin_token_file"):
            load({}, {"KVCS_RELAY_ADMIN_TOKEN_FILE": str(t)})


def test_every_token_file_is_read_alike(tmp_path: Path) -> None:
    """One reader (relay/session/tokens.py) for the relay's admin, upstream and peer token
    files and for `kvcs admin --token-file`: the same file, the same one-line refusal."""
    two = tmp_path / "two.token"
    two.write_text("first-token-0123456789 second-token-0123456789\n")
    reason = "must hold exactly one token"
    for key in ("admin_token_file", "upstream_token", "peer_token"):
        with pytest.raises(ConfigError, match=f"^{key} .*{reason}$"):
            load({key: str(two)}, {})
    res = CliRunner().invoke(admin, ["state", "--relay-admin", "http://127.0.0.1:1",
                                     "--token-file", str(two)])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and reason in res.output


def test_token_prefixes_are_namespace_text_and_a_malformed_one_is_refused(
        tmp_path: Path) -> None:
    ok = _file(tmp_path, '[[auth.tokens]]\ntoken = "a"\nprefixes = ["kvcs-1/hex:00FF"]\n')
    assert load({}, {}, ok).auth_tokens[0]["prefixes"] == ["kvcs-1/hex:00FF"]
    bad = _file(tmp_path, '[[auth.tokens]]\ntoken = "a"\nprefixes = ["kvcs-1/hex:0g"]\n')
    with pytest.raises(ConfigError, match=r"auth.tokens\[0\].prefixes: field 'hex:0g'"):
        load({}, {}, bad)


def test_scope_quotas_and_max_sessions(tmp_path: Path) -> None:
    f = _file(tmp_path, 'scope_memory_bytes = 100\nmax_sessions = 7\n'
              '[scopes."00ff"]\nmemory_bytes = 5\n[scopes."ab"]\nlmdb_bytes = 6\n')
    s = load({}, {"KVCS_RELAY_SCOPE_LMDB_BYTES": "200"}, f)
    cfg = s.relay_config()
    q = cfg.scope_quotas
    assert cfg.options.max_sessions == 7
    assert (q.limit(b"\x00\xff", "memory"), q.limit(b"\x00\xff", "lmdb")) == (5, 200)
    assert (q.limit(b"\xab", "memory"), q.limit(b"\xcd", "lmdb")) == (100, 200)
    assert load({}, {}, _file(tmp_path, render(s))).scope_overrides == s.scope_overrides
    assert load({}, {}).relay_config().scope_quotas is None
    for text in ('[scopes."zz"]\nmemory_bytes = 1\n', '[scopes."00"]\ncolour = 1\n',
                 '[scopes."00"]\nmemory_bytes = -1\n'):
        with pytest.raises(ConfigError, match="scopes"):
            load({}, {}, _file(tmp_path, text))


def test_peers_need_the_tiers_token_with_tokens_on_and_one_worker(tmp_path: Path) -> None:
    """docs/relay.md, "A root of several replicas": a peer's link needs a grant for
    everything where tokens are on, and lands on one worker of a relay with several."""
    t = tmp_path / "peer.token"
    t.write_text("tier-secret-0123\n")
    peers = {"KVCS_RELAY_PEER": "moqt://127.0.0.1:7/, moqt://127.0.0.1:8/"}
    s = load({"peer_token": str(t)}, peers)
    cfg = s.relay_config()
    assert cfg.peer == ["moqt://127.0.0.1:7/", "moqt://127.0.0.1:8/"]
    assert cfg.peer_token == b"tier-secret-0123" and "tier-secret" not in render(s)
    tokens = _file(tmp_path, '[[auth.tokens]]\ntoken = "a"\nprefixes = ["kvcs-1"]\n')
    assert load({"peer_token": str(t)}, peers, tokens).peer_token == b"tier-secret-0123"
    with pytest.raises(ConfigError, match=r"peer \(env KVCS_RELAY_PEER\).*peer_token"):
        load({}, peers, tokens)
    with pytest.raises(ConfigError, match="workers > 1"):
        load({"workers": "2"}, peers)
    load({}, {}, tokens)  # no peers: no peer token needed
