{{/* Voluntary disruptions (drains, upgrades) take down at most this many pods at once. */}}
{{- define "toolbus.pdb" -}}
{{- if .Values.podDisruptionBudget.enabled -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "toolbus.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "toolbus.labels" . | nindent 4 }}
spec:
  {{- if not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable) }}
  minAvailable: {{ .Values.podDisruptionBudget.minAvailable }}
  {{- else }}
  maxUnavailable: {{ .Values.podDisruptionBudget.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "toolbus.selectorLabels" . | nindent 6 }}
{{- end -}}
{{- end -}}
