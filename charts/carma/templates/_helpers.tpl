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
- name: CARMA_MAX_TELEMETRY_AGE_SECONDS
  value: {{ .Values.placement.maxTelemetryAgeSeconds | toString | quote }}
- name: CARMA_PACK_AGING_SECONDS
  value: {{ .Values.placement.packAgingSeconds | toString | quote }}
- name: CARMA_PACK_CROWDING_LIMIT
  value: {{ .Values.placement.packCrowdingLimit | toString | quote }}
{{- end }}

{{/* Learned reservations (MemoryHistory) as the extender's environment variables. */}}
{{- define "carma.learnedReservationsEnv" -}}
- name: CARMA_HISTORY_DISABLED
  value: {{ not .Values.learnedReservations.enabled | toString | quote }}
- name: CARMA_HISTORY_HEADROOM_PERCENT
  value: {{ .Values.learnedReservations.headroomPercent | toString | quote }}
- name: CARMA_HISTORY_HEADROOM_MIN_MIB
  value: {{ .Values.learnedReservations.headroomMinMiB | toString | quote }}
- name: CARMA_HISTORY_MIN_SAMPLES
  value: {{ .Values.learnedReservations.minSamples | toString | quote }}
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
{{/* Whether the admission policies steer GPU pods of other schedulers to carma's profile:
admissionPolicy.otherScheduler=steer on a cluster that serves MutatingAdmissionPolicy v1 (Kubernetes
1.36+, where it is GA); otherwise such pods are refused (NOTES.txt says which applies). */}}
{{- define "carma.steerOtherSchedulers" -}}
{{- $p := .Values.admissionPolicy -}}
{{- $served := or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}
{{- /* With gpuClaims=dra the webhook takes carma.io/gpu out of such pods: no scheduler name to fix. */ -}}
{{- if and $p.enabled (eq $p.otherScheduler "steer") $served (ne $p.gpuClaims "dra") }}true{{ end }}
{{- end }}
{{/* CEL, per container `c` of a pod: the container requests (or limits) carma.io/gpu. The admission
policies and the DRA-claims webhook match pods with it over containers and init containers. */}}
{{- define "carma.celRequestsCarmaGpu" -}}
(has(c.resources) && ((has(c.resources.limits) && 'carma.io/gpu' in c.resources.limits) || (has(c.resources.requests) && 'carma.io/gpu' in c.resources.requests)))
{{- end }}
{{/* Whether the extender serves the DRA-claims webhook (admissionPolicy.gpuClaims=dra; the
refusals of what it needs are in templates/admission-webhook.yaml). */}}
{{- define "carma.draClaimsWebhook" -}}
{{- if eq .Values.admissionPolicy.gpuClaims "dra" }}true{{ end }}
{{- end }}
{{/* Port of the extender's /metrics: the separate plain listener with TLS, else the main port. */}}
{{- define "carma.extenderMetricsPort" -}}
{{- ternary .Values.extender.metricsPort .Values.extender.port .Values.extender.tls.enabled }}
{{- end }}

{{/*
extender.tls.source=helm: the CA and the two certificates, as JSON {ca, server, client: {name, what,
data: {tls.crt, tls.key[, ca.crt]}}} (client only with clientAuth), made once per render and remembered
in .Values._carmaExtenderCerts so that the Secrets and the pods' checksum annotations agree. Upgrades
reuse the Secrets in the cluster (lookup); a missing certificate is signed again by the stored CA; a
missing CA replaces everything.
*/}}
{{- define "carma.extenderHelmCerts" -}}
{{- if not (hasKey .Values "_carmaExtenderCerts") }}
{{- $tls := .Values.extender.tls }}
{{- $ns := .Release.Namespace }}
{{- $days := int $tls.validityDays }}
{{- $svc := include "carma.componentName" (dict "root" . "component" "scheduler-extender") }}
{{- $host := include "carma.extenderServiceHost" . }}
{{- $caName := include "carma.extenderCASecret" . }}
{{- $ca := dict }}
{{- $caData := dict }}
{{- $stored := lookup "v1" "Secret" $ns $caName }}
{{- if and $stored $stored.data (index $stored.data "tls.crt") (index $stored.data "tls.key") }}
{{- $ca = buildCustomCert (index $stored.data "tls.crt") (index $stored.data "tls.key") }}
{{- $caData = dict "tls.crt" (index $stored.data "tls.crt") "tls.key" (index $stored.data "tls.key") }}
{{- else }}
{{- $ca = genCA (printf "%s-extender-ca" (include "carma.fullname" .)) $days }}
{{- $caData = dict "tls.crt" ($ca.Cert | b64enc) "tls.key" ($ca.Key | b64enc) }}
{{- end }}
{{- $out := dict "ca" (dict "name" $caName "what" "The CA of the certificates between kube-scheduler and the extender" "data" $caData) }}
{{- $leaves := list (list "server" (include "carma.extenderTLSSecret" .) "The extender's serving certificate" $svc (list $svc (printf "%s.%s" $svc $ns) $host (printf "%s.cluster.local" $host))) }}
{{- if $tls.clientAuth }}
{{- $leaves = append $leaves (list "client" (include "carma.schedulerClientSecret" .) "kube-scheduler's client certificate" (include "carma.componentName" (dict "root" . "component" "scheduler")) list) }}
{{- end }}
{{- range $leaves }}
{{- $name := index . 1 }}
{{- $data := dict }}
{{- $existing := lookup "v1" "Secret" $ns $name }}
{{- if and $existing $existing.data (eq (index $existing.data "ca.crt" | default "") (index $caData "tls.crt")) }}
{{- $data = dict "tls.crt" (index $existing.data "tls.crt") "tls.key" (index $existing.data "tls.key") "ca.crt" (index $existing.data "ca.crt") }}
{{- else }}
{{- $cert := genSignedCert (index . 3) list (index . 4) $days $ca }}
{{- $data = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" (index $caData "tls.crt") }}
{{- end }}
{{- $_ := set $out (index . 0) (dict "name" $name "what" (index . 2) "data" $data) }}
{{- end }}
{{- $_ := set .Values "_carmaExtenderCerts" $out }}
{{- end }}
{{- toJson .Values._carmaExtenderCerts }}
{{- end }}

{{/* Pod annotation that changes when the CA kube-scheduler trusts changes (it reads caFile once). */}}
{{- define "carma.extenderCAChecksum" -}}
{{- if and .Values.extender.tls.enabled (eq .Values.extender.tls.source "helm") -}}
checksum/extender-ca: {{ (index (include "carma.extenderHelmCerts" . | fromJson) "ca" "data" "tls.crt") | sha256sum }}
{{- end }}
{{- end }}

{{/*
The device plugin's affinity: devicePlugin.affinity, and with dra.enabled also off the nodes the DRA
driver runs on (one GPU path per node: both would hand out the same GPUs). A node is a DRA node when it
carries every label of dra.nodeSelector, so it is excluded by any one of them being different: each
required term of devicePlugin.affinity (or an empty one) becomes one term per dra.nodeSelector label,
with that label NotIn its value.
*/}}
{{- define "carma.devicePluginAffinity" -}}
{{- $affinity := deepCopy (.Values.devicePlugin.affinity | default dict) -}}
{{- if and .Values.dra.enabled .Values.dra.nodeSelector -}}
{{- $node := deepCopy (get $affinity "nodeAffinity" | default dict) -}}
{{- $required := deepCopy (get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict) -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $merged := list -}}
{{- range $term := $terms -}}
{{- range $key, $value := $.Values.dra.nodeSelector -}}
{{- $off := dict "key" $key "operator" "NotIn" "values" (list (toString $value)) -}}
{{- $expressions := append (get $term "matchExpressions" | default list) $off -}}
{{- $merged = append $merged (set (deepCopy $term) "matchExpressions" $expressions) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $merged -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if $affinity -}}
{{ toYaml $affinity }}
{{- end -}}
{{- end }}
