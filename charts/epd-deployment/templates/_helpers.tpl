{{/* The EPDDeployment's name: it prefixes every child object, so the API caps it at 47 characters. */}}
{{- define "epd-deployment.name" -}}
{{- $name := default .Release.Name .Values.fullnameOverride -}}
{{- if gt (len $name) 47 -}}
{{- fail (printf "EPDDeployment name %q is %d characters; the limit is 47 (child objects append suffixes). Set fullnameOverride to a shorter name." $name (len $name)) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "EPDDeployment name %q must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter). Set fullnameOverride." $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The settings block that goes with each EC connector (only that one is sent). */}}
{{- define "epd-deployment.ecBlock" -}}
{{- get (dict "SharedStorage" "sharedStorage" "Mooncake" "mooncake" "CPU" "cpu") . -}}
{{- end -}}
