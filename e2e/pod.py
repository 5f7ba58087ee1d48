"""Run a pool pod's containers as local processes, exactly as the operator rendered them.

What is taken from the rendered Deployment: each container's `command` + `args` (the `slaq`
console script), its `env` (fieldRef values filled in as the kubelet would: pod name and
namespace), and the tenant-table file content from the rendered table Secret.

What is remapped, and only this:
- ports: the sidecar's `--port` and the engine's `--port` (and the sidecar's `--engine-url`
  that names it) become free ports on 127.0.0.1, so tests can run beside anything else;
- the pod's address, for tests that run several pods: given a `pod_ip` (another loopback address,
  127.0.0.2...), the sidecar listens there (`--host`), as a pod listens on its own IP, so pods can
  share the pool's metrics port as they do in a cluster (the operator reads each at its pod IP);
- volume mounts: each mounted path (`/etc/slaq/tenants`, `/etc/slaq/engine`, `/var/cache/slaq`,
  `/tmp`) becomes a temporary directory, as the kubelet would back it, and args/env values under
  a mount path point into that directory. The table Secret's keys are written into the volumes
  that project them, atomically (rename), as the kubelet updates a Secret volume.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slaq.api.runtime import ENGINE_PORT, HEALTH_PATH, READY_PATH
from slaq.local.processes import Child, free_port, start_child

POD_NAME = "tiny-cpu-e2e-0"


@dataclass
class PodSpecRun:
    """The local stand-in of one pod: a directory per volume and the two containers' processes."""

    template: dict[str, Any]  # the Deployment's spec.template
    namespace: str
    pod_name: str = POD_NAME  # metadata.name, as the Downward API gives it (POD_NAME: whose quota shares)
    pod_ip: str | None = None  # None: the sidecar listens as rendered (all addresses); else only here
    image_env: dict[str, str] = field(default_factory=dict)  # the image's environment, beside this process's
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="slaq-e2e-pod-")))
    sidecar_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    engine_port: int = field(default_factory=free_port)
    children: dict[str, Child] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.pod_ip or '127.0.0.1'}:{self.sidecar_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.pod_ip or '127.0.0.1'}:{self.metrics_port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    def container(self, name: str) -> dict[str, Any]:
        return next(c for c in self.template["spec"]["containers"] if c["name"] == name)

    def volume_dir(self, volume: str) -> Path:
        path = self.root / "volumes" / volume
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _mounts(self, container: dict[str, Any]) -> list[tuple[str, Path]]:
        mounts = [(m["mountPath"], self.volume_dir(m["name"])) for m in container.get("volumeMounts", [])]
        return sorted(mounts, key=lambda m: -len(m[0]))  # the longest mount path wins

    def _local_path(self, value: str, mounts: list[tuple[str, Path]]) -> str:
        for mount_path, directory in mounts:
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(directory) + value[len(mount_path.rstrip("/")):]
        return value

    def _remap_ports(self, name: str, args: list[str]) -> list[str]:
        out = list(args)
        for i, arg in enumerate(out[:-1]):
            if arg == "--port":
                out[i + 1] = str(self.sidecar_port if name == "sidecar" else self.engine_port)
            if arg == "--metrics-port":
                out[i + 1] = str(self.metrics_port)
            if arg == "--engine-url":
                assert out[i + 1].endswith(f":{ENGINE_PORT}"), out[i + 1]
                out[i + 1] = out[i + 1][: -len(str(ENGINE_PORT))] + str(self.engine_port)
        return out

    def command(self, name: str) -> tuple[list[str], dict[str, str]]:
        container = self.container(name)
        mounts = self._mounts(container)
        program = shutil.which(container["command"][0])
        assert program, f"{container['command'][0]} is not on PATH (scripts/setup.sh installs it)"
        rest = [*container["command"][1:], *self._remap_ports(name, container["args"])]
        if name == "sidecar" and self.pod_ip is not None:
            rest += ["--host", self.pod_ip]
        argv = [program, *(self._local_path(a, mounts) for a in rest)]  # the program is this machine's, not the image's
        env = {**os.environ, **self.image_env}  # the image's environment
        field_values = {"metadata.name": self.pod_name, "metadata.namespace": self.namespace}
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = self._local_path(entry["value"], mounts)
            else:
                env[entry["name"]] = field_values[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        # envFrom: the optional model-hub credentials Secret does not exist here (optional: true).
        assert all(src.get("secretRef", {}).get("optional") for src in container.get("envFrom", []))
        return argv, env

    def write_secret(self, secret_name: str, files: dict[str, str]) -> None:
        """A Secret's content into every volume the pod takes from it, each with only the keys its
        `items` project (all when none), written atomically as the kubelet swaps a Secret volume.
        Secret volumes and the Secret sources of projected volumes alike."""
        for volume in self.template["spec"]["volumes"]:
            sources = [{"name": volume["secret"]["secretName"], **volume["secret"]}] if "secret" in volume else \
                [src["secret"] for src in (volume.get("projected") or {}).get("sources") or [] if "secret" in src]
            for source in sources:
                if source["name"] == secret_name:
                    self._project(volume["name"], source, files)

    def _project(self, volume: str, source: dict[str, Any], files: dict[str, str]) -> None:
        directory = self.volume_dir(volume)
        for item in source.get("items") or [{"key": key, "path": key} for key in files]:
            staging = directory / f".{item['path']}.tmp"
            staging.write_text(files[item["key"]], encoding="utf-8")
            staging.replace(directory / item["path"])

    def start(self, name: str) -> Child:
        argv, env = self.command(name)
        self.commands[name] = argv
        ready = f"{self.url}{READY_PATH}" if name == "sidecar" else f"{self.engine_url}{HEALTH_PATH}"
        # A restarted container's log goes on in the same file: a test that fails after a restart keeps what came before it.
        child = start_child(name, argv, self.root / f"{name}.log", ready, env=env, stop_timeout_s=40.0, append_log=True)
        self.children[name] = child
        return child

    def stop(self) -> None:
        for name in ("sidecar", "engine"):
            if name in self.children:
                self.children[name].stop()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
