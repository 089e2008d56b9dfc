{{/* The chart's name, 63 characters at most. */}}
{{- define "nicop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The name of the operator's objects: the release name, with the chart name appended unless the
release name already holds it ("nicop" -> "nicop", "net" -> "net-nicop").
*/}}
{{- define "nicop.fullname" -}}
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

{{/* Where the operator runs and deploys its components: the release namespace by default. */}}
{{- define "nicop.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "nicop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nicop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "nicop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nicop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "nicop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nicop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nicop.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The node agents whose pods serve /metrics on a port named `metrics`, as a Prometheus
relabel regex over "<nvidia.com/ofed-driver present>;<app label>": the driver (any pod with the
label nvidia.com/ofed-driver), the RDMA and SR-IOV device plugins (a NicNodePolicy's RDMA
plugin has the policy's name appended), the SR-IOV config daemon, the CNI daemon, multus and the DRA
driver (its name too).
*/}}
{{- define "nicop.agentPodsRegex" -}}
true;.*|.*;(rdma-shared-dp(-.+)?|sriovdp|sriov-device-plugin|sriov-network-config-daemon|nicop-cni-daemon|multus|nicop-dra-driver(-.+)?)
{{- end }}
