{{/*
Names, labels, the image reference, duration arithmetic and the pod parts
shared by the API, the worker and the migration Job.
*/}}

{{- define "jobqueue.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jobqueue.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "jobqueue.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "jobqueue.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: jobqueue
{{- end -}}

{{/* Selector labels of one component: pass (dict "root" $ "component" "api"). */}}
{{- define "jobqueue.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jobqueue.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "jobqueue.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "jobqueue.secretName" -}}
{{- default (include "jobqueue.fullname" .) .Values.secret.existingSecret -}}
{{- end -}}

{{/*
A value as an environment variable string. YAML numbers arrive as float64,
which toString would print as 1.048576e+06.
*/}}
{{- define "jobqueue.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/*
Seconds in a duration written as the services read it: Go style (500ms, 20s,
1m30s) or a plain number of seconds. Anything else stops the render.
*/}}
{{- define "jobqueue.seconds" -}}
{{- $text := include "jobqueue.envValue" . | trim -}}
{{- $part := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h)" -}}
{{- if regexMatch "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)$" $text -}}
{{- $text -}}
{{- else if regexMatch (printf "^(%s)+$" $part) $text -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll $part $text -1 -}}
{{- $number := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf $number (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $total -}}
{{- else -}}
{{- fail (printf "%q is not a duration (examples: 500ms, 20s, 1m30s)" $text) -}}
{{- end -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the longest a graceful shutdown may take, plus
a margin for releasing unfinished jobs and exiting. The API first answers
/readyz 503 for DRAIN_DELAY, then gives in-flight requests up to
SHUTDOWN_TIMEOUT; the worker gives running jobs SHUTDOWN_TIMEOUT, then
releases them.
*/}}
{{- define "jobqueue.workerGracePeriod" -}}
{{- $shutdown := include "jobqueue.seconds" .Values.config.SHUTDOWN_TIMEOUT -}}
{{- addf $shutdown .Values.terminationGraceMarginSeconds | ceil | int -}}
{{- end -}}

{{- define "jobqueue.apiGracePeriod" -}}
{{- $shutdown := include "jobqueue.seconds" .Values.config.SHUTDOWN_TIMEOUT -}}
{{- $drain := include "jobqueue.seconds" .Values.config.DRAIN_DELAY -}}
{{- addf $drain $shutdown .Values.terminationGraceMarginSeconds | ceil | int -}}
{{- end -}}

{{/* Pod-level fields every jobqueue pod shares. */}}
{{- define "jobqueue.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/*
Environment of the API or the worker: the ConfigMap, DATABASE_URL and
DATABASE_LISTEN_URL from the Secret (the latter optional: empty or absent, the
LISTEN connections use DATABASE_URL), and what only that component needs. Pass
(dict "root" $ "component" "api").
*/}}
{{- define "jobqueue.env" -}}
{{- $root := .root -}}
envFrom:
  - configMapRef:
      name: {{ include "jobqueue.fullname" $root }}
env:
  - name: DATABASE_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "jobqueue.secretName" $root }}
        key: DATABASE_URL
  - name: DATABASE_LISTEN_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "jobqueue.secretName" $root }}
        key: DATABASE_LISTEN_URL
        optional: true
{{- if eq .component "api" }}
  - name: API_TOKENS
    valueFrom:
      secretKeyRef:
        name: {{ include "jobqueue.secretName" $root }}
        key: API_TOKENS
        optional: true
{{- else }}
  # The pod's in-memory "prometheus" volume, for the children's metric files.
  - name: PROMETHEUS_MULTIPROC_DIR
    value: /var/lib/jobqueue/prometheus
{{- end }}
{{- range $name, $value := $root.Values.extraEnv }}
  - name: {{ $name }}
    value: {{ include "jobqueue.envValue" $value | quote }}
{{- end }}
{{- end -}}

{{/*
KEDA's query: the due pending jobs of the queues the workers serve (config.QUEUES, default
"default"; "name:slots" items give their name). It counts entries of the claim index
jobs_claim_queue_idx (queue, priority DESC, run_at, id) WHERE status = 'pending', queue by
queue, without reading a finished row. Queue names are checked by values.schema.json. The
table is named with its schema (config.DATABASE_SCHEMA, default "jobqueue").
*/}}
{{- define "jobqueue.pendingDueQuery" -}}
{{- $queues := list -}}
{{- range splitList "," (toString (default "default" .Values.config.QUEUES)) -}}
{{- $queues = append $queues (printf "'%s'" (trim (first (splitList ":" .)))) -}}
{{- end -}}
SELECT count(*) FROM {{ default "jobqueue" .Values.config.DATABASE_SCHEMA }}.jobs WHERE status = 'pending' AND queue IN ({{ join ", " $queues }}) AND run_at <= now()
{{- end -}}
