{{/* The service's HTTP port: /healthz, /readyz and /metrics (requests themselves arrive over NATS);
the gateway's MCP port beside it where the chart has `mcpPort`, the approval console's where it is on. */}}
{{- define "toolbus.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "toolbus.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "toolbus.labels" . | nindent 4 }}
  {{- with .Values.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ .Values.service.type }}
  selector:
    {{- include "toolbus.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ .Values.service.port }}
      targetPort: http
      protocol: TCP
    {{- if .Values.mcpPort }}
    - name: mcp
      port: {{ .Values.service.mcpPort | default .Values.mcpPort }}
      targetPort: mcp
      protocol: TCP
    {{- end }}
    {{- with .Values.console }}{{ if .enabled }}
    - name: console
      port: {{ .port }}
      targetPort: console
      protocol: TCP
    {{- end }}{{ end }}
{{- end -}}
