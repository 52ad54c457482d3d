{{/*
Shared template helpers. Roles are router, prefill, decode, attention and
controller; "component" in labels is the role, and the metrics `job` is the
binary (prefill and decode pods both run `worker`).
*/}}

{{- define "trident.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
`<release>-<chart>`, or the release name alone when it already holds the
chart's name. Cut to 40 characters, so that `<fullname>-attention` (a
StatefulSet, whose pods' revision label adds 11 characters) stays within
Kubernetes' 63.
*/}}
{{- define "trident.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of a role's workload and Service: (dict "root" $ "role" "decode"). */}}
{{- define "trident.componentName" -}}
{{- printf "%s-%s" (include "trident.fullname" .root) .role }}
{{- end }}

{{- define "trident.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select a role's pods: (dict "root" $ "role" "decode"). */}}
{{- define "trident.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trident.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end }}

{{/* Every label of a role's objects: (dict "root" $ "role" "decode"). */}}
{{- define "trident.labels" -}}
helm.sh/chart: {{ include "trident.chart" .root }}
{{ include "trident.selectorLabels" . }}
app.kubernetes.io/part-of: trident
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* Labels of objects that belong to no one role (ConfigMaps, the claim). */}}
{{- define "trident.commonLabels" -}}
helm.sh/chart: {{ include "trident.chart" . }}
app.kubernetes.io/name: {{ include "trident.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: trident
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The binary a role runs. */}}
{{- define "trident.binary" -}}
{{- if or (eq . "prefill") (eq . "decode") }}worker{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* A role's image: (dict "root" $ "spec" .Values.decode). */}}
{{- define "trident.image" -}}
{{- $registry := .root.Values.image.registry }}
{{- $tag := default (default .root.Chart.AppVersion .root.Values.image.tag) .spec.image.tag }}
{{- if $registry }}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .spec.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .spec.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The model directory the router and workers get as --model. */}}
{{- define "trident.modelDir" -}}
{{- $model := .Values.model }}
{{- $mount := trimSuffix "/" $model.mountPath }}
{{- if $model.path }}
{{- printf "%s/%s" $mount (trimPrefix "/" $model.path) }}
{{- else if eq $model.volume.type "generated" }}
{{- printf "%s/%s" $mount $model.volume.generated.preset }}
{{- else }}
{{- $mount }}
{{- end }}
{{- end }}

{{/*
A flags map rendered as one `--name=value` list item per entry, in key
order. Whole numbers print without an exponent (YAML numbers reach templates
as float64, which %v would print as 1e+06); null entries are left out.
*/}}
{{- define "trident.flagArgs" -}}
{{- range $name, $value := . }}
{{- if not (kindIs "invalid" $value) }}
{{- if and (kindIs "float64" $value) (eq $value (floor $value)) }}
- {{ printf "--%s=%d" $name (int64 $value) | quote }}
{{- else }}
- {{ printf "--%s=%v" $name $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Flags every service takes (common/service/service_runtime.cc), with the TLS
flags while tls.enabled: (dict "root" $ "role" "router" "spec" .Values.router).
*/}}
{{- define "trident.serviceArgs" -}}
- {{ printf "--port=%d" (int64 .spec.port) | quote }}
- {{ printf "--metrics_port=%d" (int64 .spec.metricsPort) | quote }}
- {{ printf "--drain_timeout=%ds" (int64 .spec.drainTimeoutSeconds) | quote }}
{{- $tls := .root.Values.tls }}
{{- if $tls.enabled }}
{{- $dir := trimSuffix "/" $tls.mountPath }}
- {{ printf "--tls_cert_file=%s/tls.crt" $dir | quote }}
- {{ printf "--tls_key_file=%s/tls.key" $dir | quote }}
- {{ printf "--tls_ca_file=%s/ca.crt" $dir | quote }}
- {{ printf "--tls_client_auth=%s" (ternary $tls.router.clientAuth $tls.clientAuth (eq .role "router")) | quote }}
- {{ printf "--tls_refresh_interval=%s" $tls.refreshInterval | quote }}
{{- end }}
{{- end }}

{{/*
The Secret (tls.crt, tls.key, ca.crt) the services' certificates come from:
tls.secretName, else the one the cert-manager Certificate writes. Takes the
root context.
*/}}
{{- define "trident.tlsSecretName" -}}
{{- if .Values.tls.secretName }}
{{- .Values.tls.secretName }}
{{- else if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "trident.fullname" .) }}
{{- else }}
{{- fail "tls.enabled: set tls.secretName (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt) or enable tls.certManager" }}
{{- end }}
{{- end }}

{{/*
The TLS volume's entry under `volumes:`, while tls.enabled: the Secret as a
directory, never with subPath (whose files never update), so that renewed
certificates reach the running process. A router with a Secret of its own
(tls.router.secretName) gets a projected volume: its certificate and key,
and the shared Secret's CA bundle. (dict "root" $ "role" "router").
*/}}
{{- define "trident.tlsVolume" -}}
{{- $tls := .root.Values.tls }}
{{- if $tls.enabled }}
{{- $shared := include "trident.tlsSecretName" .root }}
- name: tls
{{- if and (eq .role "router") $tls.router.secretName }}
  projected:
    sources:
      - secret:
          name: {{ $tls.router.secretName }}
          items:
            - key: tls.crt
              path: tls.crt
            - key: tls.key
              path: tls.key
      - secret:
          name: {{ $shared }}
          items:
            - key: ca.crt
              path: ca.crt
{{- else }}
  secret:
    secretName: {{ $shared }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/* The TLS volume's entry under a container's `volumeMounts:`, while tls.enabled (no subPath). */}}
{{- define "trident.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
In-cluster DNS names of every service, for the Certificate: the router's and
the controller's Services, and the pods of the headless Services
(`*.<service>.<namespace>.svc.<clusterDomain>`, the names peers dial), then
tls.certManager.extraDnsNames. Takes the root context.
*/}}
{{- define "trident.tlsDnsNames" -}}
{{- $root := . }}
{{- $namespace := .Release.Namespace }}
{{- $names := list }}
{{- $services := list "router" }}
{{- if .Values.controller.enabled }}{{ $services = append $services "controller" }}{{ end }}
{{- range $role := $services }}
{{- $service := include "trident.componentName" (dict "root" $root "role" $role) }}
{{- $names = concat $names (list $service (printf "%s.%s" $service $namespace) (printf "%s.%s.svc" $service $namespace) (printf "%s.%s.svc.%s" $service $namespace $root.Values.clusterDomain)) }}
{{- end }}
{{- $pools := list "prefill" "decode" }}
{{- if .Values.attention.enabled }}{{ $pools = append $pools "attention" }}{{ end }}
{{- range $role := $pools }}
{{- $service := include "trident.componentName" (dict "root" $root "role" $role) }}
{{- $names = append $names (printf "%s.%s.svc.%s" $service $namespace $root.Values.clusterDomain) }}
{{- $names = append $names (printf "*.%s.%s.svc.%s" $service $namespace $root.Values.clusterDomain) }}
{{- end }}
{{- concat $names .Values.tls.certManager.extraDnsNames | uniq | toYaml }}
{{- end }}

{{/*
The controller's gRPC address (its Service's DNS name), which workers,
attention services and routers get as --controller_address when the
controller is enabled; empty otherwise. Takes the root context.
*/}}
{{- define "trident.controllerAddress" -}}
{{- if .Values.controller.enabled }}
{{- $name := include "trident.componentName" (dict "root" . "role" "controller") }}
{{- printf "%s.%s.svc.%s:%d" $name .Release.Namespace .Values.clusterDomain (int64 .Values.controller.port) }}
{{- end }}
{{- end }}

{{/*
Comma-separated gRPC addresses of a StatefulSet's pods, through its headless
Service: (dict "root" $ "role" "decode" "replicas" 2 "port" 50052).
*/}}
{{- define "trident.podAddresses" -}}
{{- $name := include "trident.componentName" (dict "root" .root "role" .role) }}
{{- $suffix := printf "%s.%s.svc.%s" $name .root.Release.Namespace .root.Values.clusterDomain }}
{{- $addresses := list }}
{{- range $i := until (int .replicas) }}
{{- $addresses = append $addresses (printf "%s-%d.%s:%d" $name $i $suffix (int64 $.port)) }}
{{- end }}
{{- join "," $addresses }}
{{- end }}

{{/*
Probes: (dict "root" $ "spec" .Values.router). Without TLS, gRPC health
probes (grpc.health.v1, the server's overall status: SERVING from the moment
the gRPC port opens until the drain). The kubelet's gRPC probe cannot speak
TLS, so while tls.enabled the startup and readiness probes open a TCP
connection to the gRPC port instead (it opens only once the service serves,
e.g. after a worker has loaded the model), and the liveness probe GETs
/metrics on the plain HTTP metrics port (the process answering in user
space, which a TCP handshake alone does not show).
*/}}
{{- define "trident.probes" -}}
{{- $port := int64 .spec.port }}
{{- $tls := .root.Values.tls.enabled }}
{{- range $kind := list "startup" "liveness" "readiness" }}
{{- $probe := index $.spec.probes $kind }}
{{ $kind }}Probe:
{{- if not $tls }}
  grpc:
    port: {{ $port }}
{{- else if eq $kind "liveness" }}
  httpGet:
    path: /metrics
    port: metrics
{{- else }}
  tcpSocket:
    port: grpc
{{- end }}
  periodSeconds: {{ int64 $probe.periodSeconds }}
  failureThreshold: {{ int64 $probe.failureThreshold }}
  timeoutSeconds: {{ int64 $probe.timeoutSeconds }}
{{- end }}
{{- end }}

{{/* Container ports: (dict "spec" .Values.router). */}}
{{- define "trident.containerPorts" -}}
- name: grpc
  containerPort: {{ int64 .spec.port }}
  protocol: TCP
- name: metrics
  containerPort: {{ int64 .spec.metricsPort }}
  protocol: TCP
{{- end }}

{{/* Service ports: (dict "spec" .Values.router). */}}
{{- define "trident.servicePorts" -}}
- name: grpc
  port: {{ int64 .spec.port }}
  targetPort: grpc
  protocol: TCP
  appProtocol: grpc
- name: metrics
  port: {{ int64 .spec.metricsPort }}
  targetPort: metrics
  protocol: TCP
  appProtocol: http
{{- end }}

{{/* Pod annotations (scrape hints, the role's own): (dict "root" $ "spec" .Values.router). */}}
{{- define "trident.podAnnotations" -}}
{{- if .root.Values.monitoring.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .spec.metricsPort | int64 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .spec.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Environment of every container: the pod's name and namespace, the node's
name (NODE_NAME: members register it with the controller), then the role's
env.
*/}}
{{- define "trident.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- with .spec.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Scheduling and pod-level settings shared by every role's pod spec:
(dict "root" $ "spec" .Values.router).
*/}}
{{- define "trident.podSettings" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
terminationGracePeriodSeconds: {{ add (int64 .spec.drainTimeoutSeconds) 15 }}
{{- with .spec.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .spec.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A container's security context: the role's, else the chart-wide one. */}}
{{- define "trident.containerSecurityContext" -}}
{{- $context := .spec.securityContext | default .root.Values.containerSecurityContext }}
{{- with $context }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The model volume's entry under `volumes:`. */}}
{{- define "trident.modelVolume" -}}
{{- $volume := .Values.model.volume }}
- name: model
{{- if eq $volume.type "pvc" }}
  persistentVolumeClaim:
    claimName: {{ $volume.pvc.claimName }}
    readOnly: true
{{- else if eq $volume.type "hostPath" }}
  hostPath:
    path: {{ $volume.hostPath.path }}
    type: {{ $volume.hostPath.type }}
{{- else }}
  emptyDir:
    sizeLimit: {{ $volume.generated.sizeLimit }}
{{- end }}
{{- end }}

{{/* The model volume's entry under a container's `volumeMounts:`. */}}
{{- define "trident.modelVolumeMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}

{{/*
With a generated model: the init container that writes it into the pod's
emptyDir (make_model ships in the worker image). Its resources match the
main container's so that it does not lower the pod's QoS class.
*/}}
{{- define "trident.modelInitContainers" -}}
{{- $root := .root }}
{{- $volume := $root.Values.model.volume }}
{{- if eq $volume.type "generated" }}
initContainers:
  - name: make-model
    image: {{ include "trident.image" (dict "root" $root "spec" $root.Values.decode) }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: ["/usr/local/bin/make_model"]
    args:
      - {{ printf "--preset=%s" $volume.generated.preset | quote }}
      - {{ printf "--out_dir=%s" (include "trident.modelDir" $root) | quote }}
      {{- with $volume.generated.dtype }}
      - {{ printf "--dtype=%s" . | quote }}
      {{- end }}
    {{- with include "trident.containerSecurityContext" $ | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with .spec.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: model
        mountPath: {{ $root.Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget for a role: (dict "root" $ "role" "decode" "spec" .Values.decode). */}}
{{- define "trident.pdb" -}}
{{- if .spec.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "trident.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "trident.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ int64 .spec.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "trident.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}

{{/* The QoS classes file's JSON. */}}
{{- define "trident.qosJson" -}}
{{- dict "classes" .Values.qos.classes | toPrettyJson }}
{{- end }}

{{/* The ConfigMap holding qos_classes.json; empty when the router runs without one. */}}
{{- define "trident.qosConfigMapName" -}}
{{- if .Values.qos.existingConfigMap }}
{{- .Values.qos.existingConfigMap }}
{{- else if .Values.qos.classes }}
{{- printf "%s-qos" (include "trident.fullname" .) }}
{{- end }}
{{- end }}
