{{/* The chart's name, overridable. */}}
{{- define "rm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The release's base name for namespaced objects. A release named like the chart (the default,
`runner-manager`) keeps the plain names the binaries default to (runner-manager-operator, …).
*/}}
{{- define "rm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects (ClusterRoles and their bindings) carry the namespace too, so two releases in two namespaces never share one. */}}
{{- define "rm.clusterName" -}}
{{- printf "%s-%s" (include "rm.fullname" .) .Release.Namespace | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "rm.operatorName" -}}{{ include "rm.fullname" . }}-operator{{- end -}}
{{- define "rm.agentName" -}}{{ include "rm.fullname" . }}-node-agent{{- end -}}
{{- define "rm.brokerService" -}}{{ include "rm.fullname" . }}-broker{{- end -}}
{{- define "rm.webhookService" -}}{{ include "rm.fullname" . }}-webhook{{- end -}}
{{- define "rm.metricsService" -}}{{ include "rm.fullname" . }}-metrics{{- end -}}
{{- define "rm.webhookSecret" -}}{{ default (printf "%s-webhook" (include "rm.fullname" .)) .Values.webhook.secretName }}{{- end -}}

{{- define "rm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "rm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rm.labels" -}}
helm.sh/chart: {{ include "rm.chart" . }}
{{ include "rm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: runner-manager
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* An image reference: [registry/]repository, then @digest when set, else :tag (default appVersion). Call with (dict "image" .Values.image.operator "root" .). */}}
{{- define "rm.image" -}}
{{- $registry := default .root.Values.global.imageRegistry .image.registry -}}
{{- $repo := .image.repository -}}
{{- if $registry -}}{{- $repo = printf "%s/%s" $registry $repo -}}{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "rm.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* OpenTelemetry: the standard OTEL_* variables when telemetry.otlpEndpoint is set (traces
only, OTLP over HTTP/protobuf). Takes (dict "root" . "service" NAME). */}}
{{- define "rm.otelEnv" -}}
{{- with .root.Values.telemetry.otlpEndpoint }}
- {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: {{ . | quote }}}
- {name: OTEL_EXPORTER_OTLP_PROTOCOL, value: http/protobuf}
- {name: OTEL_SERVICE_NAME, value: {{ $.service | quote }}}
{{- with $.root.Values.telemetry.resourceAttributes }}
- {name: OTEL_RESOURCE_ATTRIBUTES, value: {{ . | quote }}}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The proxy variables of both binaries (`proxy`): set only when a proxy is. Their HTTP clients read
HTTPS_PROXY, HTTP_PROXY and NO_PROXY; the Kubernetes client reads none of them (the crate's proxy
support is not built in), so the API server is always reached directly. NO_PROXY always holds
the cluster's own names and ranges: the agents reach the broker by its Service's name, and a
proxy outside the cluster could not.
*/}}
{{- define "rm.proxyEnv" -}}
{{- if or .Values.proxy.https .Values.proxy.http }}
{{- $no := list "localhost" "127.0.0.1" "::1" ".svc" ".cluster.local" (printf "%s.%s.svc" (include "rm.brokerService" .) .Release.Namespace) }}
{{- $no = concat $no .Values.nodeAgent.runnerNetwork.podCIDRs .Values.nodeAgent.runnerNetwork.serviceCIDRs .Values.proxy.noProxy }}
{{- with .Values.proxy.https }}
- {name: HTTPS_PROXY, value: {{ . | quote }}}
{{- end }}
{{- with .Values.proxy.http }}
- {name: HTTP_PROXY, value: {{ . | quote }}}
{{- end }}
- {name: NO_PROXY, value: {{ join "," $no | quote }}}
{{- end }}
{{- end -}}

{{/* The PriorityClass of placeholder pods (cluster-scoped, so named with the namespace). */}}
{{- define "rm.placeholderPriorityClass" -}}{{ include "rm.clusterName" . }}-placeholder{{- end -}}
{{/*
Whether the agents watch their node's pods (placeholders or OCI runner pods are on): then they read
pods (get, list, watch). They never write one: the operator makes and removes them when an agent
orders them through the broker (issue 28 item 1), on every server version.
*/}}
{{- define "rm.agentWatchesPods" -}}
{{- if or .Values.placeholders.enabled .Values.nodeAgent.oci.enabled -}}true{{- end -}}
{{- end -}}

{{/*
Where the CA bundle of `caBundle` is mounted in the operator's and the agent's containers, and
the file its key becomes.
*/}}
{{- define "rm.caBundleDir" -}}/etc/runner-manager/ca{{- end -}}
{{- define "rm.caBundleFile" -}}{{ include "rm.caBundleDir" . }}/{{ .Values.caBundle.key }}{{- end -}}
{{- define "rm.caBundleVolume" -}}
- name: ca-bundle
  configMap:
    name: {{ .Values.caBundle.configMap | quote }}
    items: [{key: {{ .Values.caBundle.key | quote }}, path: {{ .Values.caBundle.key | quote }}}]
{{- end -}}
