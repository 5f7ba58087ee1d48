{{/*
Rules for cluster-scoped work; see rbac.yaml for how they are bound.
*/}}
{{- define "slaq.rbac.clusterRules" -}}
# TenantSLAs: kopf lists and watches them, patches finalizers and its progress annotations.
- apiGroups: ["slaq.dev"]
  resources: ["tenantslas"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["slaq.dev"]
  resources: ["tenantslas/status"]
  verbs: ["get", "patch"]
# The API-key Secrets named by TenantSLAs (only their hashes leave them).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
# kopf reports handler outcomes as events (for cluster-scoped objects in "default").
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
Rules for InferencePools and their children, bound cluster-wide or per watched namespace.
*/}}
{{- define "slaq.rbac.poolRules" -}}
- apiGroups: ["slaq.dev"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["slaq.dev"]
  resources: ["inferencepools/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pool pods: the operator reads each sidecar's usage report at the pod's address.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
