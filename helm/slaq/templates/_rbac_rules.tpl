{{/*
The operator's rights, one rule per kind of object, each verb one the operator (or kopf for it)
sends. tests/helm/test_chart_rbac.py records the real operator's requests and fails on a
request these rules refuse and on a rule no request uses.
*/}}
{{- define "slaq.rbac.operatorRules" -}}
# kopf lists, watches and patches pools (finalizer, progress annotations); the operator's own
# informers list and watch both kinds; it patches a TenantSLA only to release the finalizer
# earlier versions put on it.
- apiGroups: ["slaq.dev"]
  resources: ["inferencepools"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["slaq.dev"]
  resources: ["tenantslas"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["slaq.dev"]
  resources: ["inferencepools/status", "tenantslas/status"]
  verbs: ["patch"]
# A pool's children are created when absent; one that exists is first checked to be the pool's
# (a JSON-patch `test` of its owner reference: `patch`, no read) and then server-side applied.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
# Each pool's NetworkPolicy (netpol.py), in the pool's namespace.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
# The HPA is deleted when a pool turns autoscaling off, or when another HPA (KEDA's) scales the
# pool, which the operator finds by listing the namespace's HPAs; the other children go with the
# pool through their owner references (garbage collection), not through the operator.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "create", "patch", "delete"]
# Each pool's running pods, whose sidecars report per-tenant usage and SLA risk.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# A pool with spec.gateway.inferencePool owns a Gateway API Inference Extension InferencePool:
# read first (one the pool does not own is left alone), server-side applied, deleted when switched off.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "patch", "delete"]
# ... and one llm-d router InferenceObjective per tier over it: server-side applied, deleted when
# switched off.
- apiGroups: ["llm-d.ai"]
  resources: ["inferenceobjectives"]
  verbs: ["create", "patch", "delete"]
# An Event on a TenantSLA each time its AtRisk condition turns True or stops being True.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# kopf watches CRDs to notice resources that appear or go. (kopf posts log messages as Events
# only when settings.posting.loggers is on; the Events above are the operator's own.)
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}

{{/*
Secret reads, only in the namespaces rbac.secretNamespaces names and the release namespace, which
holds the operator's cache-salt key: the key Secrets are listed and watched per namespace, so a
rotated key reaches the tables at once.
*/}}
{{- define "slaq.rbac.secretReaderRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/*
Secret writes: the tenant-table Secrets beside each pool (delete: the parts a shrunk table no
longer needs) and the cache-salt key Secret in the release namespace. Granted by a Role in the
release namespace and each of rbac.poolNamespaces, or cluster-wide with rbac.clusterWideSecretWrites.
*/}}
{{- define "slaq.rbac.secretWriterRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch", "delete"]
{{- end }}
