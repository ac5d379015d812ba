{{/* The EPDDeployment's name. Its limits (47 characters, DNS-1035) are the API's rules
(operator/epd_operator/api/rules.py), enforced by the API server from the CRD; not repeated here. */}}
{{- define "epd-deployment.name" -}}
{{- default .Release.Name .Values.fullnameOverride -}}
{{- end -}}

{{/* The settings block that goes with each EC connector (only that one is sent). */}}
{{- define "epd-deployment.ecBlock" -}}
{{- get (dict "SharedStorage" "sharedStorage" "Mooncake" "mooncake" "CPU" "cpu") . -}}
{{- end -}}
