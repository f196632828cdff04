{{- define "tokengate-rls.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tokengate-rls.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tokengate-rls.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokengate-rls.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: rls
{{- end -}}

{{- define "tokengate-rls.labels" -}}
{{ include "tokengate-rls.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tokengate-rls.redisName" -}}
{{- printf "%s-redis" (include "tokengate-rls.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tokengate-rls.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "tokengate-rls.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end -}}

{{- define "tokengate-rls.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tokengate-rls.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tokengate-rls.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The -redis addresses, comma-separated. */}}
{{- define "tokengate-rls.redisAddrs" -}}
{{- if .Values.redis.internal.enabled -}}
{{- printf "%s:6379" (include "tokengate-rls.redisName" .) -}}
{{- else -}}
{{- if not .Values.redis.external.addresses -}}
{{- fail "redis.external.addresses: give at least one host:port, or set redis.internal.enabled" -}}
{{- end -}}
{{- join "," .Values.redis.external.addresses -}}
{{- end -}}
{{- end -}}

{{- define "tokengate-rls.configMapName" -}}
{{- default (printf "%s-config" (include "tokengate-rls.fullname" .)) .Values.existingConfigMap -}}
{{- end -}}
