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

{{- define "kvcs-relay.peerTokenSecret" -}}
{{- if .Values.rootReplicas.peerTokenSecret -}}{{ .Values.rootReplicas.peerTokenSecret }}{{- else if .Values.rootReplicas.peerToken -}}{{ include "kvcs-relay.fullname" . }}-peer-token{{- end -}}
{{- end -}}

{{- /* A root tier of several linked replicas: every replica a peer of every other
(docs/relay.md, "A root of several replicas"). */}}
{{- define "kvcs-relay.linkedRoot" -}}
{{- if and (not .Values.upstream) (gt (int .Values.replicaCount) 1) .Values.rootReplicas.link -}}
{{- if not (or .Values.upstreamCASecret (include "kvcs-relay.tlsSecret" .) .Values.upstreamInsecure) -}}
{{- fail "a root tier of several replicas links them as peers: give tls (a certificate valid for the headless names), upstreamCASecret, or upstreamInsecure; or set rootReplicas.link=false" -}}
{{- end -}}
{{- if and (include "kvcs-relay.tokensSecret" .) (not (include "kvcs-relay.peerTokenSecret" .)) -}}
{{- fail "a root tier of several replicas with auth tokens needs the token its peers share: give rootReplicas.peerToken or rootReplicas.peerTokenSecret" -}}
{{- end -}}
{{- if ne (toString .Values.relay.workers) "1" -}}
{{- fail "a root tier of several linked replicas runs one worker per pod (a peer's link would see one worker): scale it with replicaCount, or set rootReplicas.link=false" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{- /* Every replica's URL through the headless Service: a linked root tier's peers (each
replica recognises and skips its own). */}}
{{- define "kvcs-relay.peerUrls" -}}
{{- $full := include "kvcs-relay.fullname" . -}}
{{- $port := .Values.relay.port -}}
{{- $ns := .Release.Namespace -}}
{{- range $i := until (int .Values.replicaCount) -}}
{{- if $i }}, {{ end -}}
"moqt://{{ $full }}-{{ $i }}.{{ $full }}-headless.{{ $ns }}.svc.cluster.local:{{ $port }}/"
{{- end -}}
{{- end -}}
