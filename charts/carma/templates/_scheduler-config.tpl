{{/* KubeSchedulerConfiguration of the second scheduler: one profile, carma as its extender. */}}
{{- define "carma.schedulerConfig" -}}
{{- $s := .Values.scheduler -}}
{{- $ex := .Values.extender -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ $s.leaderElection.enabled }}
  resourceLock: leases
  resourceName: {{ $s.leaderElection.resourceName }}
  resourceNamespace: {{ .Release.Namespace }}
{{- with $s.clientConnection }}
{{- if or .qps .burst }}
clientConnection:
  {{- with .qps }}
  qps: {{ . }}
  {{- end }}
  {{- with .burst }}
  burst: {{ . }}
  {{- end }}
{{- end }}
{{- end }}
{{- with $s.percentageOfNodesToScore }}
percentageOfNodesToScore: {{ . }}
{{- end }}
{{- with $s.podMaxBackoffSeconds }}
{{- /* The initial backoff (1 s) may not exceed the maximum. */}}
podMaxBackoffSeconds: {{ . }}
{{- end }}
profiles:
  - schedulerName: {{ $s.schedulerName }}
    {{- with $s.plugins }}
    plugins:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $s.pluginConfig }}
    pluginConfig:
      {{- toYaml . | nindent 6 }}
    {{- end }}
extenders:
  - urlPrefix: {{ include "carma.extenderURL" . }}
    {{- if eq $s.extenderConfig.mode "rank" }}
    filterVerb: filter
    prioritizeVerb: prioritize
    {{- else }}
    {{- /* One call per pod: the answer is the one node carma chose, so kube-scheduler scores nothing. */}}
    filterVerb: choose
    {{- end }}
    bindVerb: bind
    weight: {{ $s.extenderConfig.weight }}
    httpTimeout: {{ $s.extenderConfig.httpTimeout }}
    nodeCacheCapable: true
    ignorable: {{ $s.extenderConfig.ignorable }}
    enableHTTPS: {{ $ex.tls.enabled }}
    {{- if $ex.tls.enabled }}
    tlsConfig:
      caFile: /etc/kubernetes/carma-extender-tls/ca.crt
      {{- if include "carma.extenderClientAuth" . }}
      certFile: /etc/kubernetes/carma-extender-tls/client.crt
      keyFile: /etc/kubernetes/carma-extender-tls/client.key
      {{- end }}
      serverName: {{ include "carma.extenderServiceHost" . }}
    {{- end }}
    managedResources:
      - name: carma.io/gpu
        ignoredByScheduler: {{ $s.extenderConfig.ignoredByScheduler }}
{{- end }}
