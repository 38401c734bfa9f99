{{- define "kvcs-relay.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvcs-relay.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvcs-relay.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvcs-relay.tlsSecret" -}}
{{- if .Values.tls.existingSecret -}}{{ .Values.tls.existingSecret }}{{- else if .Values.tls.cert -}}{{ include "kvcs-relay.fullname" . }}-tls{{- end -}}
{{- end -}}

{{- define "kvcs-relay.tokensSecret" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecret }}{{- else if .Values.auth.tokens -}}{{ include "kvcs-relay.fullname" . }}-tokens{{- end -}}
{{- end -}}
