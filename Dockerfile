# kvcs-relay: a caching MOQT relay. Build: docker build -t kvcs-relay .
# Run:   docker run -p 4433:4433/udp -p 9464:9464 -v kvcs-data:/var/lib/kvcs kvcs-relay

# --- build: wheels for the project and its dependencies -----------------------------------------
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY relay ./relay
COPY storage ./storage
# with the `fast` extra: the image runs the relay on qh3's native QUIC core (below)
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[fast]'

# --- runtime: no compiler, no sources, a non-root user ------------------------------------------
FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/kvcs kvcs \
    && mkdir -p /var/lib/kvcs /etc/kvcs && chown kvcs:kvcs /var/lib/kvcs
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl && rm -rf /wheels
# Inside a container the relay listens on every interface; everything else is configurable
# (flags, KVCS_RELAY_* variables, or --config /etc/kvcs/relay.toml).
ENV KVCS_RELAY_LISTEN=0.0.0.0:4433 \
    KVCS_RELAY_METRICS_LISTEN=0.0.0.0:9464 \
    KVCS_RELAY_DATA_DIR=/var/lib/kvcs \
    KVCS_RELAY_LOG_FORMAT=json \
    KVCS_RELAY_QUIC_BACKEND=qh3 \
    PYTHONUNBUFFERED=1
USER kvcs
VOLUME ["/var/lib/kvcs"]
# MOQT over raw QUIC and WebTransport (UDP), Prometheus /metrics and probes (TCP)
EXPOSE 4433/udp 9464/tcp
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2)"]
# SIGTERM drains (GOAWAY, in-flight fills/fetches, LMDB commits); give it drain_timeout + a bit
STOPSIGNAL SIGTERM
ENTRYPOINT ["kvcs", "relay"]
