"""The supervisor's HTTP front: one relay's listener for N workers (relay/workers.py).

On the configured metrics listener it answers as a single relay would, from what the workers
answer on their own listeners:

* ``/metrics``: every worker's, summed by name and labels (relay/merge.py), with
  ``kvcs_relay_workers_up``, the workers that answered, and the admin refusals counted here;
* ``/healthz`` and ``/readyz``: 200 only if every worker's are (and the relay is not
  stopping); ``/workers``: the workers as JSON;
* ``/admin/``: refused here without the token, else sent to every worker and the answers
  merged (a purge also withdraws the siblings' routes before it is answered).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Protocol

from relay.admin import PREFIX as ADMIN_PREFIX
from relay.admin import SIBLING_ROUTES, AdminAuth
from relay.http import Answer, Listener, read_body, request, text
from relay.logs import reason_of
from relay.merge import merge_admin_purge, merge_admin_state, merge_metrics
from relay.metrics import admin_unauthorized_metric

log = logging.getLogger("kvcs.relay")

_SCRAPE_TIMEOUT = 3.0
_ADMIN_TIMEOUT = 30.0  # a worker's purge may wait for its LMDB writer


class Workers(Protocol):
    """What the front asks of the supervisor (relay/workers.py)."""

    @property
    def n(self) -> int:
        """The workers there are, indexed 0 .. n-1."""

    @property
    def stopping(self) -> bool: ...

    def infos(self) -> dict[int, dict[str, Any]]:
        """The ready file of each worker that is alive and ready, by index."""

    def workers_json(self) -> list[dict[str, Any]]: ...


class Front:
    """The supervisor's listener: /metrics, /healthz, /readyz, /workers and /admin/."""

    def __init__(self, workers: Workers, admin_token: str | None) -> None:
        self._workers = workers
        # /admin/ requests are refused here, before reaching any worker, when they lack the
        # token; counted into kvcs_relay_admin_unauthorized_total with the workers' own
        self._auth = AdminAuth(admin_token) if admin_token else None
        self.admin_unauthorized = 0
        self._http = Listener(self._route, "supervisor's listener", self._head_too_large)

    async def start(self, host: str, port: int) -> None:
        await self._http.start(host, port)

    async def close(self) -> None:
        await self._http.close()

    @property
    def address(self) -> tuple[str, int]:
        return self._http.address

    async def _get(self, port: int, path: str) -> tuple[int, str]:
        status, body = await request(port, "GET", path, timeout=_SCRAPE_TIMEOUT)
        return status, body.decode("utf-8", "replace")

    async def _scrape_all(self, path: str) -> list[tuple[int, str] | None]:
        infos = self._workers.infos()

        async def one(index: int) -> tuple[int, str] | None:
            port = infos.get(index, {}).get("metrics_port")
            if port is None:
                return None
            try:
                return await self._get(int(port), path)
            except (OSError, TimeoutError, ValueError, IndexError):
                return None

        return list(await asyncio.gather(*(one(i) for i in range(self._workers.n))))

    async def metrics_text(self) -> str:
        answers = await self._scrape_all("/metrics")
        ok = [a[1] for a in answers if a is not None and a[0] == 200]
        return merge_metrics(ok, [admin_unauthorized_metric(self.admin_unauthorized)],
                             up=len(ok))

    def _head_too_large(self, method: str, path: str) -> None:
        if self._auth is not None and path.startswith(ADMIN_PREFIX):
            self._refused(method, path, "request head too large")

    def _refused(self, method: str, path: str, why: str) -> None:
        self.admin_unauthorized += 1
        log.warning("admin request refused: %s (%s %s)", why, method[:16], path[:64])

    async def _route(self, method: str, path: str, headers: dict[str, str],
                     reader: asyncio.StreamReader) -> Answer:
        if path.startswith(ADMIN_PREFIX):
            if self._auth is None:  # off: as if it did not exist, as on a single relay
                return text(404, "not found")
            # the token first, from the headers alone, as a single relay does
            if not self._auth.authorized(headers):
                self._refused(method, path, "missing or wrong token")
                return text(401, "unauthorized")
            return await self._admin(method, path, headers, await read_body(headers, reader))
        if not path or method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", \
                (await self.metrics_text()).encode()
        if path in ("/healthz", "/readyz"):
            answers = await self._scrape_all(path)
            bad = [f"worker {i}: {'down' if a is None else a[1].strip()}"
                   for i, a in enumerate(answers) if a is None or a[0] != 200]
            if self._workers.stopping:
                bad.append("stopping")
            if bad:
                return text(503, "\n".join(bad))
            # the same words as a single relay's listener (relay/metrics.py)
            return text(200, "ok" if path == "/healthz" else "ready")
        if path == "/workers":
            listed = json.dumps(self._workers.workers_json()) + "\n"
            return 200, "application/json", listed.encode()
        return text(404, "not found")

    async def _admin(self, method: str, path: str, headers: dict[str, str], body: bytes
                     ) -> Answer:
        """One admin surface: the request goes to every worker (in index order, so a purge
        reaches them all), and their answers are merged; any worker's refusal is the
        answer (they share one configuration, so they refuse alike).

        A purge is answered once every worker has purged *and* has forgotten its routes to
        siblings for the namespaces the purge withdrew (``SIBLING_ROUTES``): only then does
        a FETCH of a purged Track get DOES_NOT_EXIST on every worker."""
        infos = self._workers.infos()
        if len(infos) < self._workers.n:
            return text(503, "a worker is restarting")
        passed = {k: v for k, v in headers.items() if k in ("authorization", "content-type")}
        answers = await self._on_every_worker(infos, method, path, passed, body)
        if isinstance(answers, tuple):
            return answers
        if path == SIBLING_ROUTES:  # not ours to send, but harmless: merged as the others
            merged = {"routes_removed": sum(a["routes_removed"] for a in answers),
                      "namespaces_done": sorted({ns for a in answers
                                                 for ns in a["namespaces_done"]})}
        elif path.endswith("/state"):
            merged = merge_admin_state(answers)
        else:
            merged = merge_admin_purge(answers)
            if merged["namespaces_done"]:
                routes = await self._on_every_worker(
                    infos, "POST", SIBLING_ROUTES, passed,
                    json.dumps({"namespaces": merged["namespaces_done"]}).encode())
                if isinstance(routes, tuple):
                    return routes
        return 200, "application/json", (json.dumps(merged, indent=1) + "\n").encode()

    async def _on_every_worker(self, infos: dict[int, dict[str, Any]], method: str,
                               path: str, headers: dict[str, str], body: bytes
                               ) -> list[dict[str, Any]] | Answer:
        """Each worker's JSON answer, in index order; or the answer to give instead (the
        first refusal, or 502 for a worker that did not answer)."""
        answers = []
        for i in sorted(infos):
            try:
                code, data = await request(int(infos[i]["metrics_port"]), method, path,
                                           headers=headers, body=body,
                                           timeout=_ADMIN_TIMEOUT)
                if code != 200:
                    return code, "text/plain; charset=utf-8", data
                answers.append(json.loads(data))
            except (OSError, TimeoutError, ValueError) as e:
                log.warning("admin %s %s: worker %d did not answer: %s", method, path, i,
                            reason_of(e))
                return text(502, f"worker {i} did not answer")
        return answers
