{{/*
One of deploy/'s manifest files (files/ links to deploy/), as the release installs it: the
operator's namespace is the release's, and each object's labels gain the chart's and the
release's. Nothing else changes, so the chart and `kubectl apply -k deploy/` stay one source.
Usage: include "stateward.manifest" (list $ "files/operator/service.yaml")
*/}}
{{- define "stateward.manifest" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $root.Files.Get $path -}}
{{- if not $text }}{{ fail (printf "chart file %s is missing or empty (files/ links to deploy/)" $path) }}{{ end -}}
{{- $labels := printf "\n  labels:\n    helm.sh/chart: %s-%s\n    app.kubernetes.io/instance: %s\n" $root.Chart.Name $root.Chart.Version $root.Release.Name -}}
{{- $text | replace "stateward-system" $root.Release.Namespace | replace "\n  labels:\n" $labels -}}
{{- end -}}

{{/* The operator's environment added by values, before deploy/'s own entries (where kustomize's
patches of deploy/rbac/namespaced and deploy/observability/operator-otel put them). */}}
{{- define "stateward.extraEnv" -}}
{{- if eq .Values.scope "namespace" }}
            - name: STATEWARD_NAMESPACE
              value: {{ include "stateward.watched" . | fromJsonArray | join "," | quote }}
{{- end }}
{{- with .Values.otlp.endpoint }}
            - name: OTEL_EXPORTER_OTLP_ENDPOINT
              value: {{ . | quote }}
            - name: OTEL_EXPORTER_OTLP_PROTOCOL
              value: http/protobuf
            - name: OTEL_SERVICE_NAME
              value: stateward
            - name: OTEL_TRACES_SAMPLER
              value: {{ $.Values.otlp.sampler | quote }}
{{- with $.Values.otlp.samplerArg }}
            - name: OTEL_TRACES_SAMPLER_ARG
              value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The operator's arguments added by values, after deploy/'s own. */}}
{{- define "stateward.extraArgs" -}}
{{- if .Values.requirePluginPins }}
            - --require-plugin-pins
{{- end }}
{{- range .Values.pluginPins }}
            - --pin-plugin={{ . }}
{{- end }}
{{- end -}}

{{/* The policy-floor data ConfigMap's name: its content's digest makes a change a new object. */}}
{{- define "stateward.policyDataName" -}}
stateward-policy-data-{{ .Values.policyFloorData | sha256sum | trunc 10 }}
{{- end -}}

{{- /* The namespaces watched in scope namespace, as a JSON array: watchNamespaces, or watchNamespace alone. */ -}}
{{- define "stateward.watched" -}}
{{- if .Values.watchNamespaces }}{{ toJson .Values.watchNamespaces }}{{ else }}{{ list .Values.watchNamespace | toJson }}{{ end -}}
{{- end }}
