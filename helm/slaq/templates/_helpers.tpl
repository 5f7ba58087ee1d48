{{/*
The chart name, overridable for charts that vendor this one.
*/}}
{{- define "slaq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The base name of every object; kept under 63 characters because it ends up in DNS labels.
The release name alone is enough when it already contains the chart name ("slaq", "slaq-prod").
*/}}
{{- define "slaq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The operator's object name (Deployment, ServiceAccount, RBAC).
*/}}
{{- define "slaq.operator.fullname" -}}
{{- printf "%s-operator" (include "slaq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slaq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object the chart renders.
*/}}
{{- define "slaq.labels" -}}
helm.sh/chart: {{ include "slaq.chart" . }}
app.kubernetes.io/name: {{ include "slaq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slaq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The operator pod's selector: stable across upgrades, so never includes the version.
*/}}
{{- define "slaq.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slaq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "slaq.operator.labels" -}}
{{ include "slaq.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "slaq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slaq.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator image: a digest, when given, pins the image and wins over the tag. No image is
published for slaq: the chart refuses to render until one built from the repository is named.
*/}}
{{- define "slaq.image" -}}
{{- $repository := required (printf "image.repository is required: no slaq image is published. Build the operator image from the slaq repository (docker build -f operator/Dockerfile -t REGISTRY/slaq-operator:%s .), push it, and install with --set image.repository=REGISTRY/slaq-operator (helm/slaq/README.md, Images)" .Chart.AppVersion) .Values.image.repository }}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/*
The namespace for an optional add-on object: its own value when set, else the release's.
Usage: include "slaq.namespaceOr" (list . .Values.some.namespace)
*/}}
{{- define "slaq.namespaceOr" -}}
{{- $root := index . 0 }}
{{- default $root.Release.Namespace (index . 1) }}
{{- end }}

{{/*
The pool pods' selector (the labels the operator puts on every InferencePool pod).
*/}}
{{- define "slaq.poolPodSelector" -}}
{{- toYaml .Values.pools.podLabels }}
{{- end }}

{{/*
"true" when the chart renders the PodMonitor: asked for, and the cluster serves the kind.
*/}}
{{- define "slaq.podMonitor.rendered" -}}
{{- if and .Values.monitoring.podMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor") }}true{{ end }}
{{- end }}

{{/*
"true" when the chart renders the PrometheusRule: alerts.enabled true, or "auto" (the default)
and the PodMonitor is rendered, so that whatever scrapes the pools also alerts on them.
*/}}
{{- define "slaq.alerts.rendered" -}}
{{- $enabled := .Values.alerts.enabled }}
{{- if or (eq (toString $enabled) "true") (and (eq (toString $enabled) "auto") (include "slaq.podMonitor.rendered" .)) }}true{{ end }}
{{- end }}
