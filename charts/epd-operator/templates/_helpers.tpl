{{/* Names, labels and small derived values shared by the templates. */}}

{{- define "epd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epd-operator.fullname" -}}
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

{{- define "epd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "epd-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "epd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: epd-operator
{{- end -}}

{{- define "epd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "epd-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image; a digest pins it and wins over the tag. */}}
{{- define "epd-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The RBAC rules the operator needs in every namespace it serves. Kept in one place so the
ClusterRole (all namespaces) and the per-namespace Roles (watchNamespaces) cannot drift apart.
The router Role the operator creates grants get/list/watch on pods and endpointslices; the
operator holds exactly those permissions itself, so it needs neither `escalate` nor `bind`.
*/}}
{{- define "epd-operator.namespacedRules" -}}
- apiGroups: ["serving.epd.dev"]
  resources: ["epddeployments"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["serving.epd.dev"]
  resources: ["epddeployments/status"]
  verbs: ["get", "patch", "update"]
# Children's ownerReferences set blockOwnerDeletion, which clusters enforcing
# OwnerReferencesPermissionEnforcement allow only with update on the owner's finalizers.
- apiGroups: ["serving.epd.dev"]
  resources: ["epddeployments/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# The reconciler posts core/v1 Events about EPDDeployments itself (kopf's poster is off).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# Pods: read to say why a tier has no ready pod. Pods and EndpointSlices: the operator grants the
# routers it creates read access to both, and RBAC lets it grant only what it holds itself.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Multi-node tiers (nodesPerReplica > 1) are LeaderWorkerSets.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Tiers scaled by KEDA (autoscaling.engine: KEDA) get a ScaledObject; the HPA KEDA creates is KEDA's.
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end -}}

{{/* Cluster-scoped reads kopf makes when it serves all namespaces. */}}
{{- define "epd-operator.clusterRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end -}}
