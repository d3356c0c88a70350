{{- define "rm.labels" -}}
app.kubernetes.io/name: runner-manager
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "rm.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
