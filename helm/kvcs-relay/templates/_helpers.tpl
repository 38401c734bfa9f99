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

{{- define "kvcs-relay.upstreamTokenSecret" -}}
{{- if .Values.upstreamTokenSecret -}}{{ .Values.upstreamTokenSecret }}{{- else if .Values.upstreamToken -}}{{ include "kvcs-relay.fullname" . }}-upstream-token{{- end -}}
{{- end -}}

{{- /* A root tier of several linked replicas: replicas 1..N-1 take replica 0 as upstream. */}}
{{- define "kvcs-relay.linkedRoot" -}}
{{- if and (not .Values.upstream) (gt (int .Values.replicaCount) 1) .Values.rootReplicas.link -}}
{{- if not (or .Values.upstreamCASecret (include "kvcs-relay.tlsSecret" .) .Values.upstreamInsecure) -}}
{{- fail "a root tier of several replicas links replicas 1..N-1 to replica 0: give tls (a certificate valid for the headless names), upstreamCASecret, or upstreamInsecure; or set rootReplicas.link=false" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{- define "kvcs-relay.rootUrl" -}}
{{- $full := include "kvcs-relay.fullname" . -}}
moqt://{{ $full }}-0.{{ $full }}-headless.{{ .Release.Namespace }}.svc.cluster.local:{{ .Values.relay.port }}/
{{- end -}}
