{{/* The release's full name: the chart's name, prefixed by the release's unless it already holds it. */}}
{{- define "bko.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "bko.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bko.labels" -}}
{{ include "bko.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "bko.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "bko.fullname" .) -}}
{{- end -}}

{{- define "bko.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The webhook configurations keep the operator's fixed name (webhook.DefaultWebhookConfigName):
the operator keeps their caBundle current, and its ClusterRole may touch only them. */}}
{{- define "bko.webhookConfigName" -}}buildkite-operator{{- end -}}
{{- define "bko.webhookService" -}}{{ include "bko.fullname" . }}-webhook{{- end -}}
{{- define "bko.webhookSecret" -}}{{ include "bko.fullname" . }}-webhook-tls{{- end -}}

{{/* The rules `make generate` collects from the +kubebuilder:rbac markers (files/rbac/role.yaml),
for the ClusterRole ("ClusterRole"), or for a Role ("Role") by the namespace its markers name:
"buildkite" for the operator's own namespace, "buildkite-jobs" for the job namespace. */}}
{{- define "bko.generatedRules" -}}
{{- $kind := .kind -}}
{{- $ns := .markerNamespace | default "" -}}
{{- range regexSplit "(?m)^---\\s*$" (.root.Files.Get "files/rbac/role.yaml") -1 -}}
{{- $doc := fromYaml . -}}
{{- if and (eq (get $doc "kind") $kind) (or (eq $kind "ClusterRole") (eq (get (get $doc "metadata") "namespace") $ns)) -}}
{{- toYaml (get $doc "rules") -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of BuildJobs, BuildEnvironments and job pods: never the release's, whose
Secrets (registration token, slot state, webhook CA key) no job may read. */}}
{{- define "bko.jobNamespace" -}}
{{- $ns := .Values.jobNamespace.name | default (printf "%s-jobs" .Release.Namespace) -}}
{{- if eq $ns .Release.Namespace -}}
{{- fail (printf "jobNamespace.name is the release namespace %q: give jobs a namespace of their own, so that they cannot read the operator's Secrets" $ns) -}}
{{- end -}}
{{- $ns -}}
{{- end -}}
