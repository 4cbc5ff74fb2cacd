{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "mocker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless the release already holds it. */}}
{{- define "mocker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "mocker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mocker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mocker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mocker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding api_key / admin_token: an existing one or the chart's. */}}
{{- define "mocker.secretName" -}}
{{- default (printf "%s-secret" (include "mocker.fullname" .)) .Values.secret.existingSecret }}
{{- end }}

{{/* One settings value as an env var's text: lists joined by commas, maps as JSON.
Helm reads every number of a values file as a float64, which prints 1000000 as "1e+06":
a whole number is printed as an integer. */}}
{{- define "mocker.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
{{- int64 . | toString | quote }}
{{- else if kindIs "slice" . }}
{{- join "," . | quote }}
{{- else if kindIs "map" . }}
{{- toJson . | quote }}
{{- else }}
{{- toString . | quote }}
{{- end }}
{{- end }}

{{/* The first KV-event port (tcp endpoint's port), or nothing when events are off. */}}
{{- define "mocker.kvEventsPort" -}}
{{- $kv := .Values.settings.kv_events_config }}
{{- if kindIs "string" $kv }}{{ $kv = fromJson $kv }}{{ end }}
{{- if and (kindIs "map" $kv) $kv.enable_kv_cache_events }}
{{- $endpoint := default "tcp://*:5557" $kv.endpoint }}
{{- if hasPrefix "tcp://" $endpoint }}
{{- regexFind "[0-9]+$" $endpoint }}
{{- end }}
{{- end }}
{{- end }}

{{/* Engine cores per pod (each publishes KV events on its own port). */}}
{{- define "mocker.dataParallelSize" -}}
{{- default 1 .Values.settings.data_parallel_size | int }}
{{- end }}

{{/* Servers in one pod (settings.replicas, mocker serve --replicas). */}}
{{- define "mocker.replicas" -}}
{{- default 1 .Values.settings.replicas | int }}
{{- end }}

{{/* KV-event sockets in one pod: every replica's data-parallel ranks. */}}
{{- define "mocker.kvEventsSockets" -}}
{{- mul (include "mocker.dataParallelSize" . | int) (include "mocker.replicas" . | int) }}
{{- end }}

{{/* The Deployments to run, as a YAML list of {suffix, component, replicas, settings}: one
(no suffix, the shared settings), or with pd.enabled a prefill and a decode one whose
settings are each role's merged over the shared ones, kv_transfer_config set to vLLM's
NixlConnector in that role unless the role's settings give one. */}}
{{- define "mocker.roles" -}}
{{- if and .Values.pd.enabled (gt (include "mocker.replicas" . | int) 1) }}
{{- fail "settings.replicas > 1 is not for a P/D rig (pd.enabled): each server would need a side channel of its own" }}
{{- end }}
{{- if not .Values.pd.enabled }}
{{- list (dict "suffix" "" "component" "" "replicas" .Values.replicaCount "settings" .Values.settings) | toYaml }}
{{- else }}
{{- $roles := list }}
{{- range $name, $kvRole := dict "prefill" "kv_producer" "decode" "kv_consumer" }}
{{- $spec := get $.Values.pd $name }}
{{- $nixl := dict "kv_connector" "NixlConnector" "kv_role" $kvRole }}
{{- $settings := mergeOverwrite (deepCopy $.Values.settings) (dict "kv_transfer_config" $nixl) (deepCopy (default dict $spec.settings)) }}
{{- $roles = append $roles (dict "suffix" (printf "-%s" $name) "component" $name "replicas" $spec.replicas "settings" $settings) }}
{{- end }}
{{- toYaml $roles }}
{{- end }}
{{- end }}

