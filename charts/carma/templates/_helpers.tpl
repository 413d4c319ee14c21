{{/* Chart name. */}}
{{- define "carma.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource-name prefix. Release "carma" gives "carma". */}}
{{- define "carma.fullname" -}}
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

{{/* Name of one component's objects: <fullname>-<component>. */}}
{{- define "carma.componentName" -}}
{{- printf "%s-%s" (include "carma.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "carma.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; call with (dict "root" $ "component" "x"). */}}
{{- define "carma.labels" -}}
helm.sh/chart: {{ include "carma.chart" .root }}
{{ include "carma.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: carma
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels; call with (dict "root" $ "component" "x"). */}}
{{- define "carma.selectorLabels" -}}
app.kubernetes.io/name: {{ include "carma.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{/* The carma image reference. */}}
{{- define "carma.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* kube-scheduler image: explicit tag, else the cluster's vX.Y.Z without vendor suffix. */}}
{{- define "carma.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag }}
{{- if not $tag }}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- end }}
{{- if not $tag }}
{{- fail "scheduler.image.tag is empty and the cluster version could not be parsed; set scheduler.image.tag" }}
{{- end }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{/* Environment shared by every carma component. */}}
{{- define "carma.commonEnv" -}}
- name: CARMA_LOG
  value: {{ .Values.logLevel | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: CARMA_SCHEDULER_NAME
  value: {{ .Values.scheduler.schedulerName | quote }}
{{- end }}

{{/* Placement thresholds as environment variables, named after carma-core's PlacementConfig fields
(read by the extender; the device plugin exports the cap as carma_gpu_sm_activity_cap_ratio). */}}
{{- define "carma.placementEnv" -}}
- name: CARMA_SM_ACTIVITY_CAP
  value: {{ .Values.placement.smActivityCap | toString | quote }}
- name: CARMA_SM_OCCUPANCY_CAP
  value: {{ .Values.placement.smOccupancyCap | toString | quote }}
- name: CARMA_DRAM_ACTIVITY_CAP
  value: {{ .Values.placement.dramActivityCap | toString | quote }}
- name: CARMA_MEMORY_MARGIN_MIB
  value: {{ .Values.placement.memoryMarginMiB | toString | quote }}
- name: CARMA_TELEMETRY_RESERVE_MIB
  value: {{ .Values.placement.telemetryReserveMiB | toString | quote }}
- name: CARMA_WARMUP_MS
  value: {{ mul (int .Values.placement.warmupSeconds) 1000 | toString | quote }}
{{- end }}

{{/* Extender URL as kube-scheduler sees it. */}}
{{- define "carma.extenderURL" -}}
{{- with .Values.scheduler.extenderConfig.urlPrefix }}{{ . }}{{- else }}
{{- $scheme := ternary "https" "http" .Values.extender.tls.enabled }}
{{- printf "%s://%s.%s.svc:%d" $scheme (include "carma.componentName" (dict "root" . "component" "scheduler-extender")) .Release.Namespace (int .Values.extender.port) }}
{{- end }}
{{- end }}

{{/* Namespace helpers. */}}
{{- define "carma.dashboardsNamespace" -}}
{{- .Values.dashboards.namespace | default .Release.Namespace }}
{{- end }}
{{- define "carma.dcgmNamespace" -}}
{{- .Values.dcgmCounters.namespace | default .Release.Namespace }}
{{- end }}

{{/* Extender TLS: Secret names (see values extender.tls). */}}
{{- define "carma.extenderTLSSecret" -}}
{{- .Values.extender.tls.secretName | default (printf "%s-extender-tls" (include "carma.fullname" .)) }}
{{- end }}
{{- define "carma.schedulerClientSecret" -}}
{{- .Values.extender.tls.clientSecretName | default (printf "%s-scheduler-client-tls" (include "carma.fullname" .)) }}
{{- end }}
{{/* The CA of source=helm (and of source=certManager without an issuerRef). */}}
{{- define "carma.extenderCASecret" -}}
{{- printf "%s-extender-ca" (include "carma.fullname" .) }}
{{- end }}
{{/* The extender Service's in-cluster DNS name, as its certificate names it. */}}
{{- define "carma.extenderServiceHost" -}}
{{- printf "%s.%s.svc" (include "carma.componentName" (dict "root" . "component" "scheduler-extender")) .Release.Namespace }}
{{- end }}
{{/* Whether kube-scheduler presents a client certificate. */}}
{{- define "carma.extenderClientAuth" -}}
{{- if and .Values.extender.tls.enabled .Values.extender.tls.clientAuth }}true{{ end }}
{{- end }}
{{/* Port of the extender's /metrics: the separate plain listener with TLS, else the main port. */}}
{{- define "carma.extenderMetricsPort" -}}
{{- ternary .Values.extender.metricsPort .Values.extender.port .Values.extender.tls.enabled }}
{{- end }}
