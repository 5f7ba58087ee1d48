"""A real Prometheus (Debian's `prometheus` package) for e2e tests: a generated configuration, bound
to 127.0.0.1 on a free port, its TSDB in a temporary directory, stopped by pid.

`PrometheusServer.scrape` names the targets and the labels Prometheus gives each one, standing in for
the Kubernetes service discovery that a PodMonitor or the `prometheus.io/*` pod annotations drive
in a cluster (both end in target labels such as `namespace` and `pod`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from slaq.local.processes import Child, free_port, log_tail, start_child, wait_ready

START_TIMEOUT_S = 60.0
SCRAPE_INTERVAL = "1s"


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: list[str]
    labels: dict[str, str]

    def config(self) -> dict[str, Any]:
        return {"job_name": self.name, "scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL, "metrics_path": "/metrics",
                "static_configs": [{"targets": self.targets, "labels": self.labels}]}


@dataclass
class PrometheusServer:
    rule_groups: list[dict[str, Any]]
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="slaq-e2e-prometheus-")))
    port: int = field(default_factory=free_port)
    child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self, jobs: list[ScrapeJob]) -> Path:
        (self.root / "rules.yaml").write_text(yaml.safe_dump({"groups": self.rule_groups}), encoding="utf-8")
        config = {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
                  "rule_files": ["rules.yaml"], "scrape_configs": [job.config() for job in jobs]}
        path = self.root / "prometheus.yml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def start(self, jobs: list[ScrapeJob]) -> "PrometheusServer":
        binary = shutil.which("prometheus")
        if binary is None:
            raise AssertionError("prometheus is not on PATH: run scripts/setup.sh (Debian's `prometheus` package)")
        config = self._write_config(jobs)
        command = [binary, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'data'}",
                   f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        self.child = start_child("prometheus", command, self.root / "prometheus.log", f"{self.url}/-/ready")
        wait_ready([self.child], START_TIMEOUT_S)
        return self

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=30.0)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", f"{path} {params}: {response.status_code} {body}"
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {...}, "value": [time, "text"]}, ...]."""
        data = self._get("/api/v1/query", {"query": promql, **({"time": at} if at is not None else {})})
        assert data["resultType"] == "vector", data
        return data["result"]

    def series(self, match: str) -> list[dict[str, str]]:
        return self._get("/api/v1/series", {"match[]": match})

    def targets(self) -> list[dict[str, Any]]:
        """The active targets with their health, last error and last scrape duration."""
        return self._get("/api/v1/targets", {"state": "active"})["activeTargets"]

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._get("/api/v1/rules", {})["groups"] for rule in group["rules"]]

    def log(self) -> str:
        return log_tail(self.root / "prometheus.log")

    def close(self) -> None:
        if self.child is not None:
            self.child.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])

