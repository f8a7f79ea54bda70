{{/* Names and labels */}}

{{- define "dstl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dstl.fullname" -}}
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

{{- define "dstl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dstl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the pods (template metadata): the selector's and podLabels only,
never the chart's version or appVersion, so a chart bump alone does not roll
every sidecar (a new image or ConfigMap does, on purpose).
*/}}
{{- define "dstl.podLabels" -}}
{{ include "dstl.selectorLabels" . }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of the chart's own objects (not of their pods). */}}
{{- define "dstl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dstl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dstl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dstl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dstl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Name of the Secret holding the node secret (DSTL_AUTH_SECRET, for dstl-server
only); empty when auth is off.
*/}}
{{- define "dstl.authSecretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else if .Values.auth.secret }}
{{- printf "%s-auth" (include "dstl.fullname" .) }}
{{- end }}
{{- end }}

{{/* "true" when tcp.bindAddress is a loopback address (as dstl-server decides). */}}
{{- define "dstl.tcpLoopback" -}}
{{- $h := trimPrefix "[" (trimSuffix "]" .Values.tcp.bindAddress) }}
{{- if or (eq $h "localhost") (eq $h "::1") (hasPrefix "127." $h) }}true{{ end }}
{{- end }}

{{/* DSTL_LISTEN: host:port (IPv6 literals bracketed), empty when TCP is off. */}}
{{- define "dstl.listen" -}}
{{- if .Values.tcp.enabled }}
{{- $h := .Values.tcp.bindAddress }}
{{- if and (contains ":" $h) (not (hasPrefix "[" $h)) }}
{{- $h = printf "[%s]" $h }}
{{- end }}
{{- printf "%s:%d" $h (int .Values.tcp.port) }}
{{- end }}
{{- end }}

{{- define "dstl.socketPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.unixSocket.dir) .Values.unixSocket.name }}
{{- end }}

{{/* Local path of a file:// storage URL; empty for s3://. */}}
{{- define "dstl.filePath" -}}
{{- if hasPrefix "file://" .Values.storage.url }}
{{- trimPrefix "file://" .Values.storage.url }}
{{- end }}
{{- end }}

{{/*
The executors' state directory volume (executorPodTemplate.stateDir):
"hostPath", "emptyDir", or empty when the template sets no DSTL_STATE_DIR.
*/}}
{{- define "dstl.stateVolume" -}}
{{- $sd := .Values.executorPodTemplate.stateDir }}
{{- if and .Values.executorPodTemplate.enabled $sd.path (ne .Values.mode "tree") }}
{{- if eq $sd.volume "auto" }}
{{- ternary "hostPath" "emptyDir" (and (eq .Values.mode "daemonset") .Values.unixSocket.enabled) }}
{{- else }}
{{- $sd.volume }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dstl.terminationGracePeriodSeconds" -}}
{{- $grace := int (ceil (default 30 .Values.config.shutdownGraceS)) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $grace 15 }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
Checks the values cannot express in values.schema.json; every template
includes it, so a bad combination fails rendering with one clear message.
*/}}
{{- define "dstl.validate" -}}
{{- if not (or .Values.unixSocket.enabled .Values.tcp.enabled) }}
{{- fail "dstl: nothing to listen on: enable unixSocket and/or tcp" }}
{{- end }}
{{- $auth := .Values.auth }}
{{- if and $auth.existingSecret $auth.secret }}
{{- fail "dstl: give the node secret once: auth.existingSecret or auth.secret, not both" }}
{{- end }}
{{- with $auth.secret }}
{{- $chars := splitList "" (trim .) }}
{{- if or (lt (len $chars) 32) (lt (len (uniq $chars)) 12) }}
{{- fail (printf "dstl: auth.secret is too weak (%d characters, %d distinct): dstl-server needs at least 32 characters, 12 of them distinct; e.g. openssl rand -hex 32" (len $chars) (len (uniq $chars))) }}
{{- end }}
{{- end }}
{{- if or $auth.previousSecretKey $auth.previousSecretUntil }}
{{- if not (and $auth.previousSecretKey $auth.previousSecretUntil) }}
{{- fail "dstl: auth.previousSecretKey and auth.previousSecretUntil go together (the previous node secret, and when its tokens stop working)" }}
{{- end }}
{{- if not $auth.existingSecret }}
{{- fail "dstl: auth.previousSecretKey names a key of auth.existingSecret: set auth.existingSecret" }}
{{- end }}
{{- if eq $auth.previousSecretKey $auth.secretKey }}
{{- fail (printf "dstl: auth.previousSecretKey %s is auth.secretKey: the previous secret is another key of the Secret" $auth.secretKey) }}
{{- end }}
{{- end }}
{{- $nodeSecret := include "dstl.authSecretName" . }}
{{- if and $nodeSecret (eq $auth.jobTokenSecret.name $nodeSecret) }}
{{- fail (printf "dstl: auth.jobTokenSecret.name %s is the node secret's Secret: executors get a job's own token (dstl-server --print-token JOB_ID), never the node secret" $nodeSecret) }}
{{- end }}
{{- if eq .Values.mode "tree" }}
{{- $missing := list }}
{{- if not .Values.tcp.enabled }}{{ $missing = append $missing "tcp.enabled" }}{{ end }}
{{- if and .Values.tcp.enabled (include "dstl.tcpLoopback" .) }}{{ $missing = append $missing (printf "a non-loopback tcp.bindAddress (not %s)" .Values.tcp.bindAddress) }}{{ end }}
{{- if not .Values.tls.existingSecret }}{{ $missing = append $missing "tls.existingSecret" }}{{ end }}
{{- if not $nodeSecret }}{{ $missing = append $missing "auth.existingSecret (or auth.secret)" }}{{ end }}
{{- if $missing }}
{{- fail (printf "dstl: mode tree forwards between pods over TCP on the pod IP, so it needs TCP off loopback with both TLS and auth: set tcp.enabled=true, tls.existingSecret and auth.existingSecret (or auth.secret); missing: %s" (join ", " $missing)) }}
{{- end }}
{{- $c := .Values.config }}
{{- $set := list }}
{{- if $c.parent }}{{ $set = append $set "config.parent" }}{{ end }}
{{- if $c.parentCaFile }}{{ $set = append $set "config.parentCaFile" }}{{ end }}
{{- if and (not (kindIs "invalid" $c.treeIndex)) (ne (int $c.treeIndex) -1) }}{{ $set = append $set "config.treeIndex" }}{{ end }}
{{- if and (not (kindIs "invalid" $c.treeSize)) (ne (int $c.treeSize) 0) }}{{ $set = append $set "config.treeSize" }}{{ end }}
{{- if $c.treeAddressTemplate }}{{ $set = append $set "config.treeAddressTemplate" }}{{ end }}
{{- if $set }}
{{- fail (printf "dstl: mode tree derives the parent from tree.size, tree.fanout and each pod's ordinal (and its CA from tree.parentCa): leave %s unset" (join ", " $set)) }}
{{- end }}
{{- end }}
{{- if and .Values.tcp.enabled (not (include "dstl.tcpLoopback" .)) (not (and $nodeSecret .Values.tls.existingSecret)) }}
{{- $missing := list }}
{{- if not .Values.tls.existingSecret }}{{ $missing = append $missing "tls.existingSecret" }}{{ end }}
{{- if not $nodeSecret }}{{ $missing = append $missing "auth.existingSecret (or auth.secret)" }}{{ end }}
{{- fail (printf "dstl: tcp.bindAddress %s is not loopback, so TCP needs both TLS and auth: set tls.existingSecret and auth.existingSecret (or auth.secret); missing: %s" .Values.tcp.bindAddress (join ", " $missing)) }}
{{- end }}
{{- if and .Values.tls.existingSecret (include "dstl.tcpLoopback" .) (not .Values.unixSocket.enabled) }}
{{- fail "dstl: a TLS listener on loopback cannot be probed: enable unixSocket" }}
{{- end }}
{{- if and (eq .Values.mode "sidecar") (include "dstl.filePath" .) }}
{{- fail "dstl: mode sidecar would keep file:// objects in the executor pod's emptyDir, lost with the pod: set storage.url to s3://bucket/prefix" }}
{{- end }}
{{- if and (eq .Values.mode "tree") (include "dstl.filePath" .) }}
{{- fail "dstl: mode tree would keep file:// objects in each pod's emptyDir, lost with the pod and out of the other nodes' reach: set storage.url to s3://bucket/prefix" }}
{{- end }}
{{- if and .Values.tcp.hostPort (ne .Values.mode "daemonset") }}
{{- fail "dstl: tcp.hostPort is for mode daemonset only" }}
{{- end }}
{{- if and .Values.executorPodTemplate.enabled (eq .Values.mode "daemonset") (not .Values.unixSocket.enabled) (not .Values.tcp.hostPort) }}
{{- fail "dstl: executors reach the DaemonSet over unixSocket or tcp.hostPort: enable one, or set executorPodTemplate.enabled=false" }}
{{- end }}
{{- if and .Values.tcp.hostPort (include "dstl.tcpLoopback" .) }}
{{- fail "dstl: tcp.hostPort needs a non-loopback tcp.bindAddress" }}
{{- end }}
{{- $stateDir := .Values.executorPodTemplate.stateDir }}
{{- if and (eq (include "dstl.stateVolume" .) "hostPath") (ne .Values.mode "daemonset") }}
{{- fail "dstl: executorPodTemplate.stateDir.volume hostPath is for mode daemonset only (its init container prepares the node directory): use emptyDir or auto" }}
{{- end }}
{{- if include "dstl.stateVolume" . }}
{{- $clean := trimSuffix "/" $stateDir.path }}
{{- if or (eq $clean (trimSuffix "/" .Values.unixSocket.dir)) (eq $clean (trimSuffix "/" (include "dstl.filePath" .))) }}
{{- fail (printf "dstl: executorPodTemplate.stateDir.path %s is a directory of dstl-server's own (the socket's or the file:// objects'): give the executors' state a directory of its own" $stateDir.path) }}
{{- end }}
{{- end }}
{{- $grace := .Values.config.shutdownGraceS | default 30 | float64 }}
{{- if le (include "dstl.terminationGracePeriodSeconds" . | float64) $grace }}
{{- fail (printf "dstl: terminationGracePeriodSeconds must exceed config.shutdownGraceS (%v s), or SIGKILL cuts in-flight uploads" $grace) }}
{{- end }}
{{- include "dstl.memoryRule" . }}
{{- end }}

{{/*
A Kubernetes quantity (resources.limits.memory: 512Mi, 1Gi, 1.5G, 536870912)
as a number of bytes, printed as a whole number. Arguments: dict "q" (the
quantity) and "what" (its value's name, for the message).
*/}}
{{- define "dstl.quantityBytes" -}}
{{- if or (kindIs "float64" .q) (kindIs "int" .q) (kindIs "int64" .q) }}
{{- printf "%.0f" (float64 .q) }}
{{- else }}
{{- $q := toString .q | trim }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q }}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- $suffix := trimPrefix $number $q }}
{{- if or (not $number) (not (hasKey $units $suffix)) }}
{{- fail (printf "dstl: %s %q is not a memory quantity dstl checks: a number with an optional suffix Ki, Mi, Gi, Ti, k, M, G or T" .what $q) }}
{{- end }}
{{- printf "%.0f" (mulf (float64 $number) (get $units $suffix)) }}
{{- end }}
{{- end }}

{{/* Bytes as MiB, as dstl_server.memory_rule.mib writes them (488 MiB, 0.5 MiB). */}}
{{- define "dstl.mib" -}}
{{- printf "%.6g MiB" (divf (float64 .) 1048576) }}
{{- end }}

{{/*
The sidecar's memory rule (docs/sidecar.md, "Memory"; the same constants as
dstl_server/memory_rule.py, which dstl-server checks against its cgroup at
start): resources.limits.memory >= 2 x config.maxInFlightBytes +
config.readCacheBytes + config.maxRequestBytes + 160 MiB. A setting left null
counts with dstl-server's default. No memory limit: nothing to check.
*/}}
{{- define "dstl.memoryRule" -}}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- if $limit }}
{{- $c := .Values.config }}
{{- $inFlight := mulf 2 (float64 (ternary 104857600 $c.maxInFlightBytes (kindIs "invalid" $c.maxInFlightBytes))) }}
{{- $cache := float64 (ternary 67108864 $c.readCacheBytes (kindIs "invalid" $c.readCacheBytes)) }}
{{- $request := float64 (ternary 67108864 $c.maxRequestBytes (kindIs "invalid" $c.maxRequestBytes)) }}
{{- $overhead := 167772160.0 }}
{{- $need := addf $inFlight $cache $request $overhead }}
{{- $bytes := include "dstl.quantityBytes" (dict "q" $limit "what" "resources.limits.memory") | float64 }}
{{- if lt $bytes $need }}
{{- $shown := ternary (toString $limit) (printf "%.0f" $bytes) (kindIs "string" $limit) }}
{{- fail (printf "dstl: resources.limits.memory %s (%s) is below what dstl-server can hold with these settings: 2 x config.maxInFlightBytes (%s) + config.readCacheBytes (%s) + config.maxRequestBytes (%s) + %s overhead = %s; an OOM kill loses every change not yet persisted on the node. Raise the limit to at least %s or lower those settings (docs/sidecar.md, \"Memory\")" $shown (include "dstl.mib" $bytes) (include "dstl.mib" $inFlight) (include "dstl.mib" $cache) (include "dstl.mib" $request) (include "dstl.mib" $overhead) (include "dstl.mib" $need) (include "dstl.mib" $need)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Readiness and liveness probes. Kubelet gRPC probes speak neither TLS nor Unix
sockets, and TCP on the pod IP always has TLS (dstl.validate), so an exec probe
runs `dstl-server health` (one grpc.health.v1 check, standard library only)
over the Unix socket (or the loopback TCP listener in clear text). A TLS-only
listener gets a TCP connect probe.
*/}}
{{- define "dstl.probeTarget" -}}
{{- if .Values.unixSocket.enabled }}unix://{{ include "dstl.socketPath" . }}
{{- else if not .Values.tls.existingSecret }}{{ include "dstl.listen" . }}
{{- else }}tcpSocket
{{- end }}
{{- end }}

{{- define "dstl.probe" -}}
{{- $root := .root }}
{{- $target := include "dstl.probeTarget" $root }}
{{- if eq $target "tcpSocket" }}
tcpSocket:
  port: grpc
{{- else }}
exec:
  command:
    - dstl-server
    - health
    - --address
    - {{ $target | quote }}
    - --service
    - {{ .service | quote }}
    - --timeout
    - {{ max 1 (sub (int .probe.timeoutSeconds) 1) | quote }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end }}

{{/* The ConfigMap's data: every DSTL_* variable dstl-server reads from it. */}}
{{- define "dstl.configData" -}}
DSTL_LISTEN: {{ include "dstl.listen" . | quote }}
DSTL_UNIX_SOCKET: {{ ternary (include "dstl.socketPath" .) "" .Values.unixSocket.enabled | quote }}
DSTL_STORAGE: {{ .Values.storage.url | quote }}
DSTL_METRICS_PORT: {{ ternary (int .Values.metrics.port) -1 .Values.metrics.enabled | quote }}
DSTL_METRICS_HOST: "0.0.0.0"
{{- /* a non-loopback metrics address needs this; /metrics holds no data and no secrets */}}
DSTL_METRICS_PUBLIC: "true"
DSTL_S3_ENDPOINT_URL: {{ .Values.s3.endpointUrl | quote }}
DSTL_S3_REGION: {{ .Values.s3.region | quote }}
DSTL_S3_VERIFY_TLS: {{ .Values.s3.verifyTls | quote }}
{{- if .Values.s3.caBundle.configMap }}
DSTL_S3_CA_BUNDLE: {{ printf "/etc/dstl/s3-ca/%s" .Values.s3.caBundle.key | quote }}
{{- end }}
{{- with .Values.auth.previousSecretUntil }}
DSTL_AUTH_PREVIOUS_SECRET_UNTIL: {{ . | quote }}
{{- end }}
{{- if .Values.tls.existingSecret }}
DSTL_TLS_CERT: "/etc/dstl/tls/tls.crt"
DSTL_TLS_KEY: "/etc/dstl/tls/tls.key"
{{- end }}
{{- $tree := eq .Values.mode "tree" }}
{{- if $tree }}
DSTL_PARENT_CA_FILE: {{ include "dstl.treeParentCaFile" . | quote }}
{{- end }}
{{- range $key, $value := .Values.config }}
{{- /* mode tree: the parent comes from per-pod flags (dstl.treeArgs), its CA from tree.parentCa */}}
{{- if and $tree (has $key (list "parent" "parentCaFile" "treeIndex" "treeSize" "treeFanout" "treeAddressTemplate")) }}
{{- else if not (kindIs "invalid" $value) }}
{{ printf "DSTL_%s" (snakecase $key | upper) }}: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dstl.configMapName" -}}
{{- printf "%s-config" (include "dstl.fullname" .) }}
{{- end }}

{{/*
The dstl-server container. Arguments: dict "root" (the chart context) and
"sidecar" (bool: inside an executor pod).
*/}}
{{- define "dstl.container" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
name: dstl
image: {{ include "dstl.image" $root | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if and .sidecar $v.sidecar.native }}
restartPolicy: Always
{{- end }}
{{- $tree := and (eq $v.mode "tree") (not .sidecar) }}
{{- if $tree }}
{{- /* the tree index is the StatefulSet ordinal, the suffix of the pod name (see README "Tree mode") */}}
command:
  - sh
  - -c
  - {{ include "dstl.treeScript" $root | quote }}
  - dstl-server
args:
  {{- include "dstl.treeArgs" $root | trim | nindent 2 }}
  {{- with $v.extraArgs }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- else }}
command: ["dstl-server"]
{{- with $v.extraArgs }}
args:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
envFrom:
  - configMapRef:
      name: {{ include "dstl.configMapName" $root }}
  {{- with $v.s3.credentialsSecret }}
  - secretRef:
      name: {{ . }}
  {{- end }}
{{- $authSecret := include "dstl.authSecretName" $root }}
{{- if or $authSecret $v.extraEnv $tree }}
env:
  {{- if $tree }}
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- end }}
  {{- if $authSecret }}
  - name: DSTL_AUTH_SECRET
    valueFrom:
      secretKeyRef:
        name: {{ $authSecret }}
        key: {{ $v.auth.secretKey }}
  {{- with $v.auth.previousSecretKey }}
  - name: DSTL_AUTH_PREVIOUS_SECRET
    valueFrom:
      secretKeyRef:
        name: {{ $authSecret }}
        key: {{ . }}
  {{- end }}
  {{- end }}
  {{- with $v.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- if or $v.tcp.enabled $v.metrics.enabled }}
ports:
  {{- if $v.tcp.enabled }}
  - name: grpc
    containerPort: {{ $v.tcp.port }}
    protocol: TCP
    {{- if and $v.tcp.hostPort (not .sidecar) }}
    hostPort: {{ $v.tcp.port }}
    {{- end }}
  {{- end }}
  {{- if $v.metrics.enabled }}
  - name: metrics
    containerPort: {{ $v.metrics.port }}
    protocol: TCP
  {{- end }}
{{- end }}
startupProbe:
  {{- include "dstl.probe" (dict "root" $root "probe" $v.probes.startup "service" "") | trim | nindent 2 }}
readinessProbe:
  {{- include "dstl.probe" (dict "root" $root "probe" $v.probes.readiness "service" "dstl.v1.Changelog") | trim | nindent 2 }}
livenessProbe:
  {{- include "dstl.probe" (dict "root" $root "probe" $v.probes.liveness "service" "") | trim | nindent 2 }}
{{- with $v.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /* the socket's group; in an executor pod the pod securityContext is not ours, so pin the user too */}}
{{- $sc := deepCopy ($v.securityContext | default dict) }}
{{- $_ := set $sc "runAsGroup" (int $v.unixSocket.gid) }}
{{- if .sidecar }}
{{- $_ = set $sc "runAsNonRoot" true }}
{{- $_ = set $sc "runAsUser" (int ($v.podSecurityContext.runAsUser | default 10001)) }}
{{- end }}
securityContext:
  {{- toYaml $sc | nindent 2 }}
volumeMounts:
  - name: dstl-tmp
    mountPath: /tmp
  {{- if $v.unixSocket.enabled }}
  - name: dstl-socket
    mountPath: {{ $v.unixSocket.dir }}
  {{- end }}
  {{- with include "dstl.filePath" $root }}
  - name: dstl-objects
    mountPath: {{ . }}
  {{- end }}
  {{- if $v.tls.existingSecret }}
  - name: dstl-tls
    mountPath: /etc/dstl/tls
    readOnly: true
  {{- end }}
  {{- if $v.s3.caBundle.configMap }}
  - name: dstl-s3-ca
    mountPath: /etc/dstl/s3-ca
    readOnly: true
  {{- end }}
  {{- if and $tree $v.tree.parentCa.configMap }}
  - name: dstl-parent-ca
    mountPath: /etc/dstl/parent-ca
    readOnly: true
  {{- end }}
{{- end }}

{{/*
Volumes of the dstl-server container. Arguments: dict "root" and "sidecar".
The socket directory and file:// objects are node hostPaths for the DaemonSet
and emptyDirs in an executor pod.
*/}}
{{- define "dstl.volumes" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- /* no node directories outside daemonset mode: an executor pod or a tree pod keeps its own */}}
{{- $podLocal := or .sidecar (ne $v.mode "daemonset") }}
- name: dstl-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if $v.unixSocket.enabled }}
- name: dstl-socket
  {{- if $podLocal }}
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
  {{- else }}
  hostPath:
    path: {{ $v.unixSocket.dir }}
    type: DirectoryOrCreate
  {{- end }}
{{- end }}
{{- if include "dstl.filePath" $root }}
- name: dstl-objects
  {{- if $podLocal }}
  emptyDir: {}
  {{- else }}
  hostPath:
    path: {{ $v.storage.fileHostPath }}
    type: DirectoryOrCreate
  {{- end }}
{{- end }}
{{- if $v.tls.existingSecret }}
- name: dstl-tls
  secret:
    secretName: {{ $v.tls.existingSecret }}
{{- end }}
{{- if $v.s3.caBundle.configMap }}
- name: dstl-s3-ca
  configMap:
    name: {{ $v.s3.caBundle.configMap }}
{{- end }}
{{- if and (eq $v.mode "tree") (not .sidecar) $v.tree.parentCa.configMap }}
- name: dstl-parent-ca
  configMap:
    name: {{ $v.tree.parentCa.configMap }}
{{- end }}
{{- end }}

{{/*
dstl.sidecarContainer: the dstl-server container for a Spark executor pod,
serving on the Unix socket in the shared dstl-socket volume (add
dstl.sidecarVolumes to the pod). With sidecar.native (the default) it goes
under initContainers; otherwise under containers. Takes the chart context:

  initContainers:
    - {{ include "dstl.sidecarContainer" . | trim | nindent 6 | trim }}
*/}}
{{- define "dstl.sidecarContainer" -}}
{{- include "dstl.validate" . }}
{{- include "dstl.container" (dict "root" . "sidecar" true) }}
{{- end }}

{{/* dstl.sidecarVolumes: the volumes dstl.sidecarContainer mounts. */}}
{{- define "dstl.sidecarVolumes" -}}
{{- include "dstl.volumes" (dict "root" . "sidecar" true) }}
{{- end }}

{{/*
What the executor container needs to reach dstl-server: DSTL_ADDRESS, and
DSTL_TOKEN (the job's own token, from auth.jobTokenSecret) when set; both read
by dstl_client. Never the node secret: with it a job could mint any job's token.
*/}}
{{- define "dstl.executorEnv" -}}
{{- $jobToken := .Values.auth.jobTokenSecret }}
{{- if and (eq .Values.mode "daemonset") .Values.tcp.hostPort (not .Values.unixSocket.enabled) }}
- name: DSTL_NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: DSTL_ADDRESS
  value: {{ printf "$(DSTL_NODE_IP):%d" (int .Values.tcp.port) | quote }}
{{- else if .Values.unixSocket.enabled }}
- name: DSTL_ADDRESS
  value: {{ printf "unix://%s" (include "dstl.socketPath" .) | quote }}
{{- else }}
- name: DSTL_ADDRESS
  value: {{ printf "127.0.0.1:%d" (int .Values.tcp.port) | quote }}
{{- end }}
{{- if include "dstl.stateVolume" . }}
- name: DSTL_STATE_DIR
  value: {{ .Values.executorPodTemplate.stateDir.path | quote }}
{{- end }}
{{- if $jobToken.name }}
- name: DSTL_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $jobToken.name }}
      key: {{ $jobToken.key }}
{{- end }}
{{- end }}

{{/*
The Spark executor pod template (spark.kubernetes.executor.podTemplateFile).
Spark fills in the executor container's image, command and resources; this
adds what reaches dstl-server: the socket volume, DSTL_ADDRESS/DSTL_TOKEN
(the job's token), the socket's group and, in sidecar mode, dstl-server
itself (the only container here that gets the node secret).
*/}}
{{- define "dstl.executorPodTemplate" -}}
{{- $sidecar := eq .Values.mode "sidecar" }}
apiVersion: v1
kind: Pod
metadata:
  labels:
    dstl.io/sidecar: {{ ternary "sidecar" "daemonset" $sidecar }}
  {{- if and $sidecar .Values.metrics.enabled .Values.metrics.scrapeAnnotations }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .Values.metrics.port | quote }}
    prometheus.io/path: /metrics
  {{- end }}
spec:
  securityContext:
    # the socket is 0660, owned by this group
    supplementalGroups: [{{ .Values.unixSocket.gid }}]
  {{- if and $sidecar .Values.sidecar.native }}
  initContainers:
    - {{ include "dstl.sidecarContainer" . | trim | nindent 6 | trim }}
  {{- end }}
  containers:
    - name: {{ .Values.executorPodTemplate.containerName }}
      env:
        {{- include "dstl.executorEnv" . | trim | nindent 8 }}
      {{- $state := include "dstl.stateVolume" . }}
      {{- if or .Values.unixSocket.enabled $state }}
      volumeMounts:
        {{- if .Values.unixSocket.enabled }}
        - name: dstl-socket
          mountPath: {{ .Values.unixSocket.dir }}
          readOnly: true
        {{- end }}
        {{- if $state }}
        - name: dstl-state
          mountPath: {{ .Values.executorPodTemplate.stateDir.path }}
        {{- end }}
      {{- end }}
    {{- if and $sidecar (not .Values.sidecar.native) }}
    - {{ include "dstl.sidecarContainer" . | trim | nindent 6 | trim }}
    {{- end }}
  {{- if or $sidecar .Values.unixSocket.enabled $state }}
  volumes:
  {{- if $sidecar }}
    {{- include "dstl.sidecarVolumes" . | trim | nindent 4 }}
  {{- else if .Values.unixSocket.enabled }}
    - name: dstl-socket
      hostPath:
        path: {{ .Values.unixSocket.dir }}
        # made by the DaemonSet: an executor waits for its node's sidecar
        type: Directory
  {{- end }}
  {{- if eq $state "hostPath" }}
    - name: dstl-state
      hostPath:
        path: {{ .Values.executorPodTemplate.stateDir.path }}
        # made by the DaemonSet (host-dirs), owned by the executors' user
        type: Directory
  {{- else if eq $state "emptyDir" }}
    - name: dstl-state
      emptyDir: {}
  {{- end }}
  {{- else }}
  volumes: []
  {{- end }}
{{- end }}

{{/*
Tree mode (a StatefulSet whose ordinals are the tree's indices). Names: the
StatefulSet is dstl.fullname, its governing headless Service dstl.treeServiceName,
so pod i is <fullname>-i.<fullname>-tree.<namespace>.svc.
*/}}
{{- define "dstl.treeServiceName" -}}
{{- printf "%s-tree" (include "dstl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* DSTL tree_address_template: every node's gRPC address, {index} for its ordinal. */}}
{{- define "dstl.treeAddressTemplate" -}}
{{- printf "%s-{index}.%s.%s.svc:%d" (include "dstl.fullname" .) (include "dstl.treeServiceName" .) .Release.Namespace (int .Values.tcp.port) }}
{{- end }}

{{/* PEM CA the children verify their parent's certificate with (DSTL_PARENT_CA_FILE). */}}
{{- define "dstl.treeParentCaFile" -}}
{{- if .Values.tree.parentCa.configMap }}
{{- printf "/etc/dstl/parent-ca/%s" .Values.tree.parentCa.key }}
{{- else }}
{{- /* the ca.crt of the listener's own kubernetes.io/tls Secret (cert-manager writes it) */}}
{{- printf "/etc/dstl/tls/%s" .Values.tree.parentCa.key }}
{{- end }}
{{- end }}

{{/* The flags every tree pod shares; the script adds --tree-index. */}}
{{- define "dstl.treeArgs" -}}
- --tree-size
- {{ .Values.tree.size | int | quote }}
- --tree-fanout
- {{ .Values.tree.fanout | int | quote }}
- --tree-address-template
- {{ include "dstl.treeAddressTemplate" . | quote }}
{{- end }}

{{/*
The tree pod's entrypoint: the ordinal is what follows the last "-" of the pod
name (metadata.name, which a StatefulSet always sets to <name>-<ordinal>, and
unlike $HOSTNAME never truncates to 63 characters); exec keeps dstl-server PID 1,
so it gets SIGTERM itself.
*/}}
{{- define "dstl.treeScript" -}}
i="${POD_NAME##*-}"; case "$i" in ''|*[!0-9]*) echo "dstl: no StatefulSet ordinal at the end of pod name '$POD_NAME'" >&2; exit 2;; esac; exec dstl-server --tree-index "$i" "$@"
{{- end }}
