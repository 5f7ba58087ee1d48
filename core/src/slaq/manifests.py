"""Reading manifests from files and validating slaq's kinds against the API models."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import yaml
from pydantic import BaseModel, ValidationError

from slaq.api.common import API_VERSION, ObjectMeta
from slaq.api.pool import InferencePool
from slaq.api.tenant import TenantSLA

MODELS: dict[str, type[BaseModel]] = {"InferencePool": InferencePool, "TenantSLA": TenantSLA}


@dataclass(frozen=True)
class Manifest:
    source: str
    index: int
    body: Any

    @property
    def label(self) -> str:
        if isinstance(self.body, dict):
            name = (self.body.get("metadata") or {}).get("name", "?") if isinstance(self.body.get("metadata"), dict) else "?"
            return f"{self.source}[{self.index}] {self.body.get('kind', '?')}/{name}"
        return f"{self.source}[{self.index}]"


@dataclass(frozen=True)
class FieldError:
    manifest: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.manifest}: {self.field}: {self.message}"


def load_manifests(paths: Iterable[str | Path]) -> Iterator[Manifest]:
    """Every YAML document in the given files (directories: their *.yaml and *.yml files)."""
    for path in paths:
        path = Path(path)
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
        for file in files:
            with file.open(encoding="utf-8") as handle:
                for index, doc in enumerate(yaml.safe_load_all(handle)):
                    if doc is not None:
                        yield Manifest(str(file), index, doc)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part not in ("function-after",)) or "(document)"


def validate_manifest(manifest: Manifest) -> list[FieldError]:
    """Field-level errors of one document; kinds slaq does not own are checked only for shape."""
    body, label = manifest.body, manifest.label
    if not isinstance(body, dict):
        return [FieldError(label, "(document)", "a manifest must be a mapping")]
    kind = body.get("kind")
    if kind in MODELS:
        if body.get("apiVersion") != API_VERSION:
            return [FieldError(label, "apiVersion", f"must be {API_VERSION!r} for kind {kind}, got {body.get('apiVersion')!r}")]
        try:
            model = MODELS[kind].model_validate(body)
        except ValidationError as exc:
            return [FieldError(label, _field(e["loc"]), e["msg"]) for e in exc.errors()]
        if kind == "TenantSLA" and model.metadata.namespace:
            return [FieldError(label, "metadata.namespace", "TenantSLA is cluster-scoped; remove the namespace")]
        return []
    if kind == "Secret":
        return _validate_secret(label, body)
    return []


def _validate_secret(label: str, body: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    try:
        ObjectMeta.model_validate(body.get("metadata") or {})
    except ValidationError as exc:
        errors += [FieldError(label, "metadata." + _field(e["loc"]), e["msg"]) for e in exc.errors()]
    for section in ("data", "stringData"):
        entries = body.get(section)
        if entries is None:
            continue
        if not isinstance(entries, dict):
            errors.append(FieldError(label, section, "must be a mapping of key to string"))
            continue
        errors += [FieldError(label, f"{section}.{k}", "must be a string") for k, v in entries.items() if not isinstance(v, str)]
    return errors


def validate_paths(paths: Iterable[str | Path]) -> tuple[int, list[FieldError]]:
    """(documents read, errors) over every document in the given files."""
    count, errors = 0, []
    for manifest in load_manifests(paths):
        count += 1
        errors += validate_manifest(manifest)
    return count, errors


class ManifestError(ValueError):
    """A set of manifests that cannot be used; the message names the file, document and field."""


@dataclass(frozen=True)
class TenantKeys:
    """TenantSLAs and their plain API keys, as read from manifest files (memory only)."""

    tenants: list[TenantSLA]
    keys: dict[str, list[str]]  # tenant name -> its keys, ordered by the Secret's entry names


def _secret_values(label: str, body: dict[str, Any]) -> dict[str, str]:
    values = {str(k): str(v) for k, v in (body.get("stringData") or {}).items()}
    for key, encoded in (body.get("data") or {}).items():
        try:
            values.setdefault(str(key), base64.b64decode(str(encoded), validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ManifestError(f"{label}: data.{key} is not base64 of UTF-8 text: {exc}") from exc
    return values


SecretRef = tuple[str | None, str | None]  # (namespace, name)


@dataclass(frozen=True)
class ManifestSet:
    """slaq's kinds and the Secrets among a set of manifest files (other kinds are ignored).

    Secret values are plain text (`data` decoded, `stringData` merged in as the API server does);
    `sources` says which file and document each object came from, for error messages.
    """

    pools: list[InferencePool]
    tenants: list[TenantSLA]
    secrets: dict[SecretRef, dict[str, str]]
    sources: dict[tuple[str, SecretRef], str]  # (kind, (namespace, name)) -> manifest label


def _parse(model: type[BaseModel], manifest: Manifest) -> Any:
    try:
        return model.model_validate(manifest.body)
    except ValidationError as exc:
        fields = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ManifestError(f"{manifest.label}: not a valid {model.__name__}: {fields}") from exc


def read_manifest_set(paths: Iterable[Path]) -> ManifestSet:
    """InferencePools, TenantSLAs and Secrets from files or directories; ManifestError names the bad one."""
    paths = list(paths)
    for path in paths:
        if not path.exists():
            raise ManifestError(f"{path} does not exist")
    try:
        manifests = list(load_manifests(paths))
    except Exception as exc:  # YAML syntax errors name the file and line
        raise ManifestError(f"cannot read the manifests: {exc}") from exc
    found = ManifestSet([], [], {}, {})
    for manifest in manifests:
        body = manifest.body
        if not isinstance(body, dict):
            continue
        kind = body.get("kind")
        if kind == "InferencePool":
            pool = _parse(InferencePool, manifest)
            found.pools.append(pool)
            found.sources[(kind, (pool.metadata.namespace, pool.metadata.name))] = manifest.label
        elif kind == "TenantSLA":
            tenant = _parse(TenantSLA, manifest)
            found.tenants.append(tenant)
            found.sources[(kind, (None, tenant.metadata.name))] = manifest.label
        elif kind == "Secret":
            meta = body.get("metadata") or {}
            ref = (meta.get("namespace"), meta.get("name"))
            found.secrets[ref] = _secret_values(manifest.label, body)
            found.sources[(kind, ref)] = manifest.label
    return found


def read_tenant_keys(paths: Iterable[Path]) -> TenantKeys:
    """TenantSLAs and the keys in the Secrets they reference, from files or directories.

    Other kinds are ignored; a TenantSLA whose Secret is not among the files is an error.
    """
    paths = list(paths)
    found = read_manifest_set(paths)
    tenants, secrets = found.tenants, found.secrets
    if not tenants:
        raise ManifestError(f"no TenantSLA documents in {', '.join(map(str, paths))}")
    keys: dict[str, list[str]] = {}
    for tenant in tenants:
        ref = tenant.spec.api_key_secret_ref
        values = secrets.get((ref.namespace, ref.name))
        if not values:
            raise ManifestError(f"TenantSLA {tenant.metadata.name}: spec.apiKeySecretRef names Secret "
                                f"{ref.namespace}/{ref.name}, which is not in the given files")
        keys[tenant.metadata.name] = [values[k] for k in sorted(values) if values[k]]
        if not keys[tenant.metadata.name]:
            raise ManifestError(f"Secret {ref.namespace}/{ref.name} (tenant {tenant.metadata.name}) holds no keys")
    return TenantKeys(tenants, keys)
