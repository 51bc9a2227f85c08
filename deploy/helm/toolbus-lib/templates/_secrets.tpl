{{/*
References to Secrets that already exist (the charts create none: secrets come from your secret
store). Each entry of .Values.secrets names an existingSecret and a key in it; an empty
existingSecret leaves the setting unset. Values become environment variables; NATS and Redis
credential and TLS files are mounted read-only under toolbus.secretsDir and their paths passed.
*/}}

{{/* Secret values given to the service as environment variables: values key -> variable. */}}
{{- define "toolbus.secretEnvNames" -}}
secretKey: TOOLBUS_SECRET_KEY
webhookSecret: TOOLBUS_WEBHOOK_SECRET
natsPassword: TOOLBUS_NATS_PASSWORD
natsToken: TOOLBUS_NATS_TOKEN
redisPassword: TOOLBUS_REDIS_PASSWORD
redisSentinelPassword: TOOLBUS_REDIS_SENTINEL_PASSWORD
consoleOidcClientSecret: TOOLBUS_CONSOLE_OIDC_CLIENT_SECRET
{{- end -}}

{{/* Secret files: values key -> (variable, file name) for each key of the Secret that is mounted. */}}
{{- define "toolbus.secretFiles" -}}
natsCredentials:
  key: TOOLBUS_NATS_CREDS_FILE
natsNkey:
  key: TOOLBUS_NATS_NKEY_FILE
natsTls:
  caKey: TOOLBUS_NATS_TLS_CA_FILE
  certKey: TOOLBUS_NATS_TLS_CERT_FILE
  keyKey: TOOLBUS_NATS_TLS_KEY_FILE
redisTls:
  caKey: TOOLBUS_REDIS_TLS_CA_FILE
  certKey: TOOLBUS_REDIS_TLS_CERT_FILE
  keyKey: TOOLBUS_REDIS_TLS_KEY_FILE
{{- end -}}

{{- define "toolbus.secretEnv" -}}
{{- $secrets := .Values.secrets | default dict -}}
{{- range $name, $variable := include "toolbus.secretEnvNames" . | fromYaml }}
{{- $ref := get $secrets $name }}
{{- if and $ref $ref.existingSecret }}
- name: {{ $variable }}
  valueFrom:
    secretKeyRef:
      name: {{ tpl $ref.existingSecret $ | quote }}
      key: {{ $ref.key | quote }}
      {{- if $ref.optional }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}
{{- $dir := include "toolbus.secretsDir" . -}}
{{- range $name, $fields := include "toolbus.secretFiles" . | fromYaml }}
{{- $ref := get $secrets $name }}
{{- if and $ref $ref.existingSecret }}
{{- range $field, $variable := $fields }}
{{- with get $ref $field }}
- name: {{ $variable }}
  value: {{ printf "%s/%s/%s" $dir (kebabcase $name) . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "toolbus.secretVolumes" -}}
{{- $secrets := .Values.secrets | default dict -}}
{{- range $name, $fields := include "toolbus.secretFiles" . | fromYaml }}
{{- $ref := get $secrets $name }}
{{- if and $ref $ref.existingSecret }}
- name: {{ kebabcase $name }}
  secret:
    secretName: {{ tpl $ref.existingSecret $ | quote }}
    defaultMode: 0440
    items:
      {{- range $field, $_ := $fields }}
      {{- with get $ref $field }}
      - key: {{ . | quote }}
        path: {{ . | quote }}
      {{- end }}
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "toolbus.secretVolumeMounts" -}}
{{- $secrets := .Values.secrets | default dict -}}
{{- $dir := include "toolbus.secretsDir" . -}}
{{- range $name, $_ := include "toolbus.secretFiles" . | fromYaml }}
{{- $ref := get $secrets $name }}
{{- if and $ref $ref.existingSecret }}
- name: {{ kebabcase $name }}
  mountPath: {{ printf "%s/%s" $dir (kebabcase $name) | quote }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}
