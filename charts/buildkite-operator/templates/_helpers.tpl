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

{{/* The operator's image: repository@digest when image.digest pins it (the tag ignored),
else repository:tag. */}}
{{- define "bko.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The agent image job pods get buildkite-agent from, pinned the same way. */}}
{{- define "bko.agentImage" -}}
{{- if .Values.agentImage.digest -}}
{{- printf "%s@%s" .Values.agentImage.repository .Values.agentImage.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.agentImage.repository .Values.agentImage.tag -}}
{{- end -}}
{{- end -}}

{{/* The name of a cluster-scoped object of the release: the full name and the release
namespace, so that releases of the same name in two namespaces never share one. */}}
{{- define "bko.clusterName" -}}
{{- printf "%s-%s" (include "bko.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Both webhook configurations: the operator keeps their caBundle current
(--webhook-configuration-name), and its ClusterRole may touch only them. */}}
{{- define "bko.webhookConfigName" -}}{{ include "bko.clusterName" . }}{{- end -}}
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

{{/* A Kubernetes memory quantity (such as 512Mi, 1.5Gi, 500M or 536870912) in bytes, for
PromQL, which knows no units. */}}
{{- define "bko.bytes" -}}
{{- $q := toString . -}}
{{- if kindIs "float64" . }}{{ $q = printf "%.0f" . }}{{ end -}}
{{- $m := regexFindAll "^([0-9]+(?:\\.[0-9]+)?)([KMGTPE]i|[kMGTPE])?$" $q 1 -}}
{{- if not $m -}}
{{- fail (printf "resources.limits.memory %q is not a quantity the PrometheusRule's memory alert can read: write it as a number of bytes or with one of the suffixes Ki, Mi, Gi, Ti, k, M, G, T" $q) -}}
{{- end -}}
{{- $num := regexReplaceAll "[^0-9.]" $q "" -}}
{{- $unit := regexReplaceAll "^[0-9.]+" $q "" -}}
{{- $factors := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 -}}
{{- printf "%.0f" (mulf (float64 $num) (get $factors $unit)) -}}
{{- end -}}
