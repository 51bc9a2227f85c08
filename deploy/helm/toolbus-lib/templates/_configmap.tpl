{{/*
The service's non-secret settings: TOOLBUS_* environment variables, read through envFrom.
Secrets never go here (see toolbus.env in _deployment.tpl).
*/}}
{{- define "toolbus.configmap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "toolbus.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "toolbus.labels" . | nindent 4 }}
data:
  TOOLBUS_HTTP_HOST: "0.0.0.0"
  TOOLBUS_HTTP_PORT: {{ .Values.containerPort | quote }}
  {{- if .Values.mcpPort }}
  TOOLBUS_GATEWAY_HOST: "0.0.0.0"
  TOOLBUS_GATEWAY_PORT: {{ .Values.mcpPort | quote }}
  {{- end }}
  {{- with .Values.console }}{{ if .enabled }}
  TOOLBUS_CONSOLE_HOST: "0.0.0.0"
  TOOLBUS_CONSOLE_PORT: {{ .port | quote }}
  {{- end }}{{ end }}
  {{- with .Values.nats.user }}
  TOOLBUS_NATS_USER: {{ . | quote }}
  {{- end }}
  {{- with .Values.nats.inboxPrefix }}
  TOOLBUS_NATS_INBOX_PREFIX: {{ . | quote }}
  {{- end }}
  {{- range $name, $value := .Values.config }}
  {{- if not (kindIs "invalid" $value) }}
  {{ $name }}: {{ $value | toString | quote }}
  {{- end }}
  {{- end }}
{{- end -}}
