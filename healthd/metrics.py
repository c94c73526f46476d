"""Prometheus metrics (prometheus-client), served on localhost by default."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from clusterctl import __version__
from clusterctl.healthd.policy import POLICY_VERSION


class Metrics:
    """healthd's metrics in their own registry (tests create several daemons in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.findings = Counter("healthd_findings", "Findings by kind and the action the policy chose",
                                ["kind", "action"], registry=self.registry)
        self.drain_actions = Counter("healthd_drain_actions", "Slurm actions by outcome", ["op", "result"],
                                     registry=self.registry)
        self.last_event = Gauge("healthd_last_event_timestamp_seconds", "When the last GPU event was seen",
                                registry=self.registry)
        self.nvml_latency = Histogram("healthd_nvml_call_seconds", "NVML call latency", ["function"],
                                      buckets=(0.0001, 0.001, 0.01, 0.1, 1, 5, 30), registry=self.registry)
        self.nvml_hangs = Counter("healthd_nvml_hangs", "NVML calls that did not return in time", ["function"],
                                  registry=self.registry)
        self.gpu_verdict = Gauge("healthd_gpu_verdict", "Worst current action per GPU (0 ignore .. 6 drain-rma)",
                                 ["gpu"], registry=self.registry)
        self.breaker_open = Gauge("healthd_breaker_open", "1 when a drain was refused by the breaker",
                                  registry=self.registry)
        Info("healthd_build", "The running healthd's version and fault policy",
             registry=self.registry).info({"version": __version__, "policy": POLICY_VERSION})

    def observe_call(self, function: str, seconds: float, finished: bool) -> None:
        self.nvml_latency.labels(function).observe(seconds)
        if not finished:
            self.nvml_hangs.labels(function).inc()

    def serve(self, address: str) -> None:
        """Serve /metrics on host:port (an empty address serves nothing)."""
        if not address:
            return
        host, _, port = address.rpartition(":")  # checked by the config: host:port, IPv6 in brackets
        start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry)
