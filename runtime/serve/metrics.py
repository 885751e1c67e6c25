"""`/metrics`: the server's Prometheus metrics (`prometheus_client`, one registry per server).

Read from the engine at scrape time: running and waiting requests, KV blocks and state slots in
use, prefix-cache lookups, hits
and token hit rate, speculative drafts proposed and accepted and the steps that drafted, the
latest step's wall time.
Read from the engine thread (`AsyncEngine`): compile seconds as wall time (the warm-up's, then
each step's that compiled on first use), the step variants compiled, the compiles after ready,
requests aborted before they finished.
Observed by the handlers as requests finish: time to first token, time per output token (after
the first), end-to-end latency, requests by finish reason, prompt and generated tokens; and by
`CountRejections`, every request answered with an error, by status.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.serve.async_engine import AsyncEngine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _EngineCollector(Collector):
    """Gauges and counters read from the engine when Prometheus scrapes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        now = self.engine.engine.snapshot()
        yield GaugeMetricFamily(
            "jmamba_requests_running", "Requests being served.", now.num_running
        )
        yield GaugeMetricFamily("jmamba_requests_waiting", "Requests queued.", now.num_waiting)
        yield GaugeMetricFamily(
            "jmamba_step_seconds", "Wall time of the latest engine step.", self.engine.step_seconds
        )
        yield GaugeMetricFamily(
            "jmamba_kv_blocks_used",
            "KV blocks held (by requests or the prefix cache).",
            now.kv_blocks_used,
        )
        yield GaugeMetricFamily(
            "jmamba_state_slots_used",
            "State slots held (by requests or the prefix cache).",
            now.state_slots_used,
        )
        cache = now.prefix_cache
        if cache is not None:
            yield CounterMetricFamily(
                "jmamba_prefix_cache_lookups", "Admissions looked up.", cache.lookups
            )
            yield CounterMetricFamily(
                "jmamba_prefix_cache_hits", "Admissions that hit a prefix.", cache.hits
            )
            yield GaugeMetricFamily(
                "jmamba_prefix_cache_hit_rate",
                "Share of looked-up prompt tokens a hit skipped.",
                cache.token_hit_rate,
            )
        spec = now.speculation
        yield CounterMetricFamily("jmamba_spec_drafted", "Drafts verified.", spec.num_drafted)
        yield CounterMetricFamily("jmamba_spec_accepted", "Drafts accepted.", spec.num_accepted)
        yield CounterMetricFamily(
            "jmamba_spec_drafting_steps",
            "Engine steps that drafted (the draft gate's choice; the others ran without drafts).",
            now.num_drafting_steps,
        )


class _ThreadCollector(Collector):
    """What the engine thread counts: compiles (wall time) and aborts."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        yield CounterMetricFamily(
            "jmamba_compile_seconds",
            "Wall seconds spent compiling step variants (the warm-up, then first uses).",
            engine.compile_seconds,
        )
        now = engine.engine.snapshot()
        yield GaugeMetricFamily(
            "jmamba_step_variants", "Step variants ready to run.", now.num_variants
        )
        yield GaugeMetricFamily(
            "jmamba_step_programs_possible",
            "Step programs a step can run without top-k / top-p, penalties, stop masks or "
            "log-probabilities (what --warmup all makes ready).",
            now.programs_possible,
        )
        yield GaugeMetricFamily(
            "jmamba_step_variants_loaded",
            "Step variants loaded from the step store instead of compiled.",
            now.num_loaded,
        )
        yield CounterMetricFamily(
            "jmamba_compiles_after_ready",
            "Steps that compiled a variant after the server was ready (every request waited).",
            engine.num_late_compiles,
        )
        yield CounterMetricFamily(
            "jmamba_requests_aborted",
            "Requests aborted before they finished (clients that left).",
            engine.num_aborted,
        )


class Metrics:
    """The server's registry and the histograms and counters its handlers observe; the
    engine's metrics join once the model is loaded (`watch`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "jmamba_time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "jmamba_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "jmamba_request_latency_seconds",
            "Time from a request's arrival to its last token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "jmamba_requests_finished",
            "Completions finished, by reason.",
            ["finish_reason"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "jmamba_prompt_tokens", "Prompt tokens received.", registry=self.registry
        )
        self.generation_tokens = Counter(
            "jmamba_generation_tokens", "Tokens generated.", registry=self.registry
        )
        self.rejected = Counter(
            "jmamba_requests_rejected",
            "Requests answered with an error, by HTTP status.",
            ["status"],
            registry=self.registry,
        )

    def watch(self, engine: AsyncEngine) -> None:
        """Add the engine's metrics (once it is loaded)."""
        self.registry.register(_EngineCollector(engine))
        self.registry.register(_ThreadCollector(engine))

    def finish(self, reason: str, ttft: float | None, latency: float, num_tokens: int) -> None:
        """Count one finished completion."""
        self.finished.labels(reason).inc()
        self.generation_tokens.inc(num_tokens)
        self.latency.observe(latency)
        if ttft is not None:
            self.ttft.observe(ttft)
            if num_tokens > 1:
                self.tpot.observe((latency - ttft) / (num_tokens - 1))

    def text(self) -> bytes:
        return generate_latest(self.registry)


class CountRejections:
    """ASGI middleware: counts every response of status 400 or more in `metrics.rejected`, but
    `/health`'s (a probe's 503 while starting refuses no request)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                self.metrics.rejected.labels(str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
