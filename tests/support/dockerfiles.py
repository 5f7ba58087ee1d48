"""The project's Dockerfiles as tests read them (no container runtime here): each stage's base image,
what it copies, what its `pip install`s name, and what those installs bring by the components'
declared dependencies (pyproject.toml), followed from component to component."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.layout import COMPONENTS, pyproject

# What the base images themselves carry, of what matters to the checks: a stage FROM an image not
# listed here fails the tests until someone says what it holds.
BASE_IMAGE_PACKAGES: dict[str, frozenset[str]] = {
    "python:3.11-slim-bookworm": frozenset(),
    "vllm/vllm-openai:v0.32.0": frozenset({"vllm", "torch", "triton"}),
}
_PIP = re.compile(r"^(?:python3?(?:\.\d+)? -m )?pip3? (install|uninstall)\b")
_PIP_OPTIONS_WITH_VALUE = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-t", "--target"}


class DockerfileError(Exception):
    """A Dockerfile the parser cannot read; the message names the file and line."""


@dataclass
class PipCommand:
    verb: str  # install or uninstall
    targets: list[str]  # what it names: paths (with [extras]) or requirement strings
    options: list[str]


@dataclass
class Stage:
    base: str
    name: str | None
    copies: dict[str, str] = field(default_factory=dict)  # destination -> source in the build context
    pip: list[PipCommand] = field(default_factory=list)
    user: str | None = None
    entrypoint: list[str] | None = None


def logical_lines(text: str) -> list[str]:
    """Instructions one per line: comments and blank lines dropped, `\\` continuations joined."""
    lines, pending = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending.strip())
    return lines


def _pip_commands(script: str) -> list[PipCommand]:
    found = []
    for command in re.split(r"&&|;|\|\|", script):
        command = " ".join(command.split())
        match = _PIP.match(command)
        if not match:
            continue
        words = shlex.split(command[match.end():])
        targets, options, skip = [], [], False
        for word in words:
            if skip:
                options[-1] += f" {word}"
                skip = False
            elif word.startswith("-"):
                options.append(word)
                skip = word in _PIP_OPTIONS_WITH_VALUE
            else:
                targets.append(word)
        found.append(PipCommand(match[1], targets, options))
    return found


def parse(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    for line in logical_lines(path.read_text(encoding="utf-8")):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
            continue
        if not stages:
            raise DockerfileError(f"{path}: {instruction} before the first FROM")
        stage = stages[-1]
        if instruction == "COPY":
            words = [w for w in rest.split() if not w.startswith("--")]
            *sources, destination = words
            for source in sources:
                stage.copies[destination.rstrip("/")] = source.rstrip("/")
        elif instruction == "RUN":
            stage.pip += _pip_commands(rest)
        elif instruction == "USER":
            stage.user = rest.strip()
        elif instruction == "ENTRYPOINT":
            stage.entrypoint = json.loads(rest)
    return stages


@dataclass(frozen=True)
class Installed:
    """What a stage ends up with, by declared dependencies: slaq components and other distributions."""

    components: frozenset[str]
    distributions: frozenset[str]  # canonical names, the base image's included; uninstalled ones left out


def _component_of(target: str, stage: Stage) -> tuple[str, frozenset[str]] | None:
    """(component, extras) for a pip target that is a copied component folder (`/tmp/slaq/engine[cpu]`)."""
    match = re.fullmatch(r"(?P<path>[^\[]+)(?:\[(?P<extras>[^\]]*)\])?", target)
    if match is None:
        return None
    source = stage.copies.get(match["path"].rstrip("/"))
    if source is None or source not in COMPONENTS:
        return None
    extras = frozenset(e.strip() for e in (match["extras"] or "").split(",") if e.strip())
    return source, extras


def _component_named(requirement: Requirement) -> str | None:
    name = canonicalize_name(requirement.name)
    return next((c for c in COMPONENTS if name == f"slaq-{c}"), None)


def resolve(stage: Stage) -> Installed:
    """Follow each installed component's declared dependencies (and the extras asked for) through
    the other components; requirements guarded by a marker that names an extra count only when
    that extra is asked for."""
    components: set[str] = set()
    distributions: set[str] = set(BASE_IMAGE_PACKAGES[stage.base])
    todo: list[tuple[str, frozenset[str]]] = []
    for command in stage.pip:
        for target in command.targets:
            if command.verb == "uninstall":
                distributions.discard(canonicalize_name(target))
                continue
            component = _component_of(target, stage)
            if component is not None:
                todo.append(component)
            else:
                distributions.add(canonicalize_name(Requirement(target).name))
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        component, extras = todo.pop()
        if (component, extras) in seen:
            continue
        seen.add((component, extras))
        components.add(component)
        project = pyproject(component)["project"]
        requirements = list(project.get("dependencies", []))
        for extra in extras:
            optional = project.get("optional-dependencies", {})
            if extra not in optional:
                raise DockerfileError(f"{component} has no extra [{extra}]")
            requirements += optional[extra]
        for text in requirements:
            requirement = Requirement(text)
            named = _component_named(requirement)
            if named is not None:
                todo.append((named, frozenset(requirement.extras)))
            else:
                distributions.add(canonicalize_name(requirement.name))
    for command in stage.pip:
        if command.verb == "uninstall":
            distributions -= {canonicalize_name(t) for t in command.targets}
    return Installed(frozenset(components), frozenset(distributions))
