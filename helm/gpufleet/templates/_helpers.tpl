{{- define "gpufleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "gpufleet.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "gpufleet.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "gpufleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpufleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* selector labels; call with (dict "ctx" $ "component" "server") */}}
{{- define "gpufleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpufleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpufleet.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "gpufleet.fullname" .)) }}
{{- end }}

{{- define "gpufleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "gpufleet.fullname" .) }}
{{- else }}
{{- .Values.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}

{{- define "gpufleet.collectorUrl" -}}
{{- .Values.agent.collectorUrl | default (printf "http://%s-server.%s.svc:%d" (include "gpufleet.fullname" .) .Release.Namespace (int .Values.server.service.port)) }}
{{- end }}

{{/* Fail early, with the fix in the message, instead of pods crash-looping. */}}
{{- define "gpufleet.validate" -}}
{{- if and .Values.config.alertRules (include "gpufleet.secretRules" .) }}
{{- fail "set the alert rules in config.alertRules or in the Secret (secrets.alertRules / secrets.existingSecretHasAlertRules), not both" }}
{{- end }}
{{- if not .Values.secrets.existingSecret }}
{{- if not .Values.secrets.databaseUrl }}
{{- fail "set secrets.databaseUrl (postgresql://...) or secrets.existingSecret" }}
{{- end }}
{{- if not .Values.secrets.redisUrl }}
{{- fail "set secrets.redisUrl (redis://...) or secrets.existingSecret" }}
{{- end }}
{{- if and .Values.agent.enabled (not .Values.secrets.agentToken) }}
{{- fail "set secrets.agentToken (create one with `gpufleet token`), secrets.existingSecret, or agent.enabled=false" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Environment of the server-side processes (serve, worker, beat, migrate). */}}
{{- define "gpufleet.serverEnv" -}}
- name: GPUFLEET_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ include "gpufleet.secretName" . }}, key: database-url}
- name: GPUFLEET_REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ include "gpufleet.secretName" . }}, key: redis-url}
- name: GPUFLEET_SLACK_WEBHOOK_URL
  valueFrom:
    secretKeyRef: {name: {{ include "gpufleet.secretName" . }}, key: slack-webhook-url, optional: true}
# Anything a process keeps on local disk goes to the writable /tmp (read-only root filesystem).
- name: GPUFLEET_DATA_DIR
  value: /tmp/gpufleet-data
- name: GPUFLEET_ALLOW_ANONYMOUS
  value: {{ ternary "1" "0" .Values.config.allowAnonymous | quote }}
{{- with .Values.config.publicUrl }}
- name: GPUFLEET_PUBLIC_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.config.grafanaUrl }}
- name: GPUFLEET_GRAFANA_URL
  value: {{ . | quote }}
{{- end }}
{{- if include "gpufleet.secretRules" . }}
- name: GPUFLEET_ALERT_RULES
  value: /etc/gpufleet/secret/alert-rules.yaml
{{- else if .Values.config.alertRules }}
- name: GPUFLEET_ALERT_RULES
  value: /etc/gpufleet/config/rules.yaml
{{- end }}
{{- if .Values.config.thresholds }}
- name: GPUFLEET_THRESHOLDS
  value: /etc/gpufleet/config/thresholds.toml
{{- end }}
{{- if .Values.config.catalog }}
- name: GPUFLEET_CATALOG
  value: /etc/gpufleet/config/catalog.toml
{{- end }}
{{- include "gpufleet.podJobPatternsEnv" . }}
{{- with .Values.config.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Alert rules whose routes name per-team Slack webhooks are secrets: they live in the Secret. */}}
{{- define "gpufleet.secretRules" -}}
{{- if .Values.secrets.existingSecret }}
{{- if .Values.secrets.existingSecretHasAlertRules }}true{{ end }}
{{- else if .Values.secrets.alertRules }}true{{ end }}
{{- end }}

{{- define "gpufleet.hasConfig" -}}
{{- if or .Values.config.alertRules .Values.config.thresholds .Values.config.catalog }}true{{ end }}
{{- end }}

{{/* Volumes every server-side pod mounts: a writable /tmp on a read-only root, and the config. */}}
{{- define "gpufleet.serverVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if include "gpufleet.hasConfig" . }}
- name: config
  configMap:
    name: {{ include "gpufleet.fullname" . }}-config
{{- end }}
{{- if include "gpufleet.secretRules" . }}
- name: secret-rules
  secret:
    secretName: {{ include "gpufleet.secretName" . }}
    items:
      - {key: alert-rules.yaml, path: alert-rules.yaml}
{{- end }}
{{- end }}

{{- define "gpufleet.serverVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "gpufleet.hasConfig" . }}
- name: config
  mountPath: /etc/gpufleet/config
  readOnly: true
{{- end }}
{{- if include "gpufleet.secretRules" . }}
- name: secret-rules
  mountPath: /etc/gpufleet/secret
  readOnly: true
{{- end }}
{{- end }}

{{/* Restart pods when the Secret or ConfigMap the chart renders changes. */}}
{{- define "gpufleet.checksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}

{{/* config.kubernetesJobPatterns for the server side and the agents alike: one job id both ways. */}}
{{- define "gpufleet.podJobPatternsEnv" -}}
{{- with .Values.config.kubernetesJobPatterns }}
- name: GPUFLEET_KUBERNETES_JOB_PATTERNS
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
