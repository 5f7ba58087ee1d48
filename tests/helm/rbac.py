"""Kubernetes RBAC semantics, small enough to check rendered rules against recorded API calls.

An `ApiCall` is what the API server authorizes: a verb on a (group, resource[/subresource]) in a
namespace or cluster-wide. `Grants` holds the rules a ServiceAccount gets from the rendered
ClusterRoles, Roles and their bindings, and answers whether a call is allowed, as the RBAC
authorizer does (union of rules; ClusterRoleBinding rules hold everywhere, RoleBinding rules only
in the binding's namespace).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


@dataclass(frozen=True, order=True)
class ApiCall:
    verb: str
    group: str
    resource: str  # "deployments", or "inferencepools/status" for a subresource
    namespace: str | None  # None for cluster-scoped objects and all-namespace lists/watches

    def __str__(self) -> str:
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {where}"


@dataclass(frozen=True)
class Rule:
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]

    @classmethod
    def parse(cls, rule: dict[str, Any]) -> "Rule":
        if rule.get("nonResourceURLs") or rule.get("resourceNames"):
            raise ValueError(f"rule shape not handled by this checker: {rule}")
        return cls(frozenset(rule.get("apiGroups") or ()), frozenset(rule.get("resources") or ()), frozenset(rule.get("verbs") or ()))

    def allows(self, call: ApiCall) -> bool:
        resource_ok = call.resource in self.resources or "*" in self.resources or (
            "/" in call.resource and f"*/{call.resource.split('/', 1)[1]}" in self.resources)
        return (call.group in self.groups or "*" in self.groups) and resource_ok and (call.verb in self.verbs or "*" in self.verbs)

    def triples(self) -> set[tuple[str, str, str]]:
        return {(g, r, v) for g in self.groups for r in self.resources for v in self.verbs}


@dataclass
class Grants:
    cluster_wide: list[Rule] = field(default_factory=list)
    by_namespace: dict[str, list[Rule]] = field(default_factory=dict)

    def allows(self, call: ApiCall) -> bool:
        if any(rule.allows(call) for rule in self.cluster_wide):
            return True
        return call.namespace is not None and any(rule.allows(call) for rule in self.by_namespace.get(call.namespace, ()))

    def rules(self) -> list[Rule]:
        return [*self.cluster_wide, *(r for rules in self.by_namespace.values() for r in rules)]


def grants_for(objects: Iterable[dict[str, Any]], service_account: str, namespace: str) -> Grants:
    """The rules the rendered objects grant to one ServiceAccount."""
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): [Rule.parse(r) for r in o.get("rules") or []]
             for o in objects if o["kind"] in ("ClusterRole", "Role")}
    grants = Grants()
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
        if not any(all(s.get(k) == v for k, v in subject.items()) for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        bound_ns = binding["metadata"].get("namespace")
        role_ns = None if ref["kind"] == "ClusterRole" else bound_ns
        rules = roles.get((ref["kind"], role_ns, ref["name"]))
        if rules is None:
            raise ValueError(f"{binding['kind']} {binding['metadata']['name']} refers to a {ref['kind']} {ref['name']} the chart does not render")
        if binding["kind"] == "ClusterRoleBinding":
            grants.cluster_wide.extend(rules)
        else:
            grants.by_namespace.setdefault(bound_ns, []).extend(rules)
    return grants


def verbs_of(method: str, name: str | None, watch: bool, content_type: str) -> set[str]:
    """The RBAC verbs the API server checks for one HTTP request on a resource URL."""
    method = method.upper()
    if method == "GET":
        return {"watch"} if watch else ({"get"} if name else {"list"})
    if method == "POST":
        return {"create"}
    if method == "PUT":
        return {"update"}
    if method == "PATCH":
        # Server-side apply of an object that does not exist yet creates it: the server then
        # checks `create` as well (kubernetes.io/docs/reference/using-api/server-side-apply).
        return {"patch", "create"} if content_type.startswith(APPLY_CONTENT_TYPE) else {"patch"}
    if method == "DELETE":
        return {"delete"} if name else {"deletecollection"}
    raise ValueError(f"no RBAC verb for HTTP {method}")
