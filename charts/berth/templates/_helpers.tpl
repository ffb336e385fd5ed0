{{/* Names and labels. */}}
{{- define "berth.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "berth.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "root" $ "component" "controller"). */}}
{{- define "berth.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "berth.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (printf "%s-controller" (include "berth.fullname" .)) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "berth.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (printf "%s-agent" (include "berth.fullname" .)) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "berth.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The FRR sidecar's image: berth's own (which carries FRR) unless agent.frr.image names one. */}}
{{- define "berth.frrImage" -}}
{{- if .Values.agent.frr.image.repository -}}
{{- printf "%s:%s" .Values.agent.frr.image.repository (default .Chart.AppVersion .Values.agent.frr.image.tag) -}}
{{- else -}}
{{- include "berth.image" . -}}
{{- end -}}
{{- end -}}

{{- define "berth.membershipSecretName" -}}
{{- default (printf "%s-membership" (include "berth.fullname" .)) .Values.agent.membership.existingSecret -}}
{{- end -}}

{{/* The controller's flags with the chart's own choices filled in. */}}
{{- define "berth.controller.config" -}}
{{- $config := deepCopy .Values.controller.config -}}
{{- $_ := set $config "leaseNamespace" (default .Release.Namespace $config.leaseNamespace) -}}
{{- /* The controller reports on each Service what the agents leave out: their values. */ -}}
{{- range $key := list "externalIpCidrs" "maxServicePorts" "maxEndpointsPerServicePort" "maxServiceEndpoints" -}}
{{- $_ := set $config $key (get $.Values.agent.config $key) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The agent's flags with the chart's own choices filled in. */}}
{{- define "berth.agent.config" -}}
{{- $config := deepCopy .Values.agent.config -}}
{{- $_ := set $config "leaseNamespace" (default .Release.Namespace $config.leaseNamespace) -}}
{{- /* The agent programs only node ports the controller would accept. */ -}}
{{- $_ := set $config "nodePortRange" .Values.controller.config.nodePortRange -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The port of an admin address such as 0.0.0.0:9090 or [::]:9090. */}}
{{- define "berth.port" -}}
{{- splitList ":" . | last -}}
{{- end -}}

{{/*
One BERTH_<FLAG> variable per value of a flag section (every flag also reads its variable);
empty values are left out so that the binary's default applies. Lists are joined with commas.
*/}}
{{- define "berth.flagEnv" -}}
{{- range $key, $value := . }}
{{- if not (or (kindIs "invalid" $value) (eq (toString $value) "")) }}
- name: BERTH_{{ snakecase $key | upper }}
  value: {{ if kindIs "slice" $value }}{{ join "," $value | quote }}{{ else }}{{ toString $value | quote }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* KUBERNETES_SERVICE_HOST/PORT pointing at the API server itself, when apiServer.host is set. */}}
{{- define "berth.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | toString | quote }}
{{- end }}
{{- end -}}

{{/* Prefix of each agent's liveness Lease, berth-agent-<node> (berth-api's lease::AGENT_PREFIX). */}}
{{- define "berth.agentLeasePrefix" -}}
berth-agent-
{{- end -}}
