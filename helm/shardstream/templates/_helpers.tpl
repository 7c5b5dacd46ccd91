{{/*
Chart name, truncated to 63 characters (the DNS label limit of object names).
*/}}
{{- define "shardstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: RELEASE-CHART, or RELEASE alone when it already contains the
chart name (`helm install shardstream ...` gives `shardstream`, whose headless Service is
`shardstream-headless`). Truncated to 63 characters.
*/}}
{{- define "shardstream.fullname" -}}
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

{{/*
The headless Service's name (clients dial dns:///NAME.NAMESPACE.svc:PORT); 63 characters at most.
*/}}
{{- define "shardstream.headlessName" -}}
{{- printf "%s-headless" (include "shardstream.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/*
Name of the optional Redis' objects.
*/}}
{{- define "shardstream.redisName" -}}
{{- printf "%s-redis" (include "shardstream.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "shardstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "shardstream.labels" -}}
helm.sh/chart: {{ include "shardstream.chart" . }}
{{ include "shardstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The release's selector labels. Workloads add app.kubernetes.io/component (server, redis) so that
no selector of one matches the pods of the other.
*/}}
{{- define "shardstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Selector labels of the server pods (Deployment, Services, PDB, NetworkPolicy, topology spread).
*/}}
{{- define "shardstream.serverSelectorLabels" -}}
{{ include "shardstream.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/*
Selector labels of the optional Redis pod.
*/}}
{{- define "shardstream.redisSelectorLabels" -}}
{{ include "shardstream.selectorLabels" . }}
app.kubernetes.io/component: redis
{{- end }}

{{/*
The ServiceAccount the servers run as.
*/}}
{{- define "shardstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shardstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The server image: repository@digest, else repository:tag (tag defaults to appVersion).
*/}}
{{- define "shardstream.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
resources.limits.cpu in millicores ("" without a CPU limit): 2, "2", "1.5" and "1500m" are accepted.
*/}}
{{- define "shardstream.cpuLimitMillis" -}}
{{- $cpu := dig "limits" "cpu" "" (.Values.resources | default dict) | toString }}
{{- if $cpu }}
{{- if hasSuffix "m" $cpu }}
{{- trimSuffix "m" $cpu | float64 | int }}
{{- else }}
{{- mulf (float64 $cpu) 1000 | int }}
{{- end }}
{{- end }}
{{- end }}

{{/*
--workers: server.workers, else ceil(CPU limit) - the rule the server itself applies to a cgroup
CPU quota (server/serving/supervisor.py usable_cpus) - else "" (flag left out: the server counts its CPUs).
*/}}
{{- define "shardstream.workers" -}}
{{- if .Values.server.workers }}
{{- .Values.server.workers | int }}
{{- else }}
{{- $millis := include "shardstream.cpuLimitMillis" . }}
{{- if $millis }}
{{- max 1 (divf (float64 $millis) 1000 | ceil | int) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Data ports the pod serves: the worker count (each worker's Flight data plane binds server.dataPort +
its slot: pyarrow's Flight server cannot share a port), else 1 when the count is left to the server
(no CPU limit): then only dataPort is declared, and networkPolicy.enabled is refused (validate).
*/}}
{{- define "shardstream.dataPortCount" -}}
{{- include "shardstream.workers" . | default "1" }}
{{- end }}

{{/*
Name of worker i's data port (container and Service ports): "data", "data-1", "data-2", ...
(a port name has at most 15 characters).
*/}}
{{- define "shardstream.dataPortName" -}}
{{- if eq (int .) 0 }}data{{ else }}{{ printf "data-%d" (int .) }}{{ end }}
{{- end }}

{{/*
resources.limits.memory in MiB ("" without a memory limit); Mi and Gi are accepted.
*/}}
{{- define "shardstream.memoryLimitMib" -}}
{{- $mem := dig "limits" "memory" "" (.Values.resources | default dict) | toString }}
{{- if hasSuffix "Gi" $mem }}
{{- mulf (trimSuffix "Gi" $mem | float64) 1024 | floor | int }}
{{- else if hasSuffix "Mi" $mem }}
{{- trimSuffix "Mi" $mem | float64 | floor | int }}
{{- end }}
{{- end }}

{{/*
The memory rule (values.yaml, server.cacheMib; deploy/RUNBOOK.md "Memory limit"): MiB the pod needs
besides its cache, 2 x the stream buffer (what gRPC and the allocators keep around the counted bytes)
plus workerMemoryMib per worker (and, serving checkpoints, checkpoints.inflightMib per worker: the
chunks of a save it holds). "" when the worker count is left to the server.
*/}}
{{- define "shardstream.memoryBesideCacheMib" -}}
{{- $workers := include "shardstream.workers" . }}
{{- if $workers }}
{{- add (mul 2 (int64 .Values.server.limits.streamBufferMib)) (mul (int64 $workers) (add (int64 .Values.server.workerMemoryMib) (include "shardstream.checkpointInflightMib" . | int64))) }}
{{- end }}
{{- end }}

{{/*
The chunk bytes a worker may hold for a checkpoint save (checkpoints.inflightMib), 0 when the pod
serves no checkpoints.
*/}}
{{- define "shardstream.checkpointInflightMib" -}}
{{- if .Values.checkpoints.enabled }}{{ .Values.checkpoints.inflightMib | int64 }}{{ else }}0{{ end }}
{{- end }}

{{/*
True ("true") when checkpoints are served from a local root (checkpoints.volume mounted there).
*/}}
{{- define "shardstream.localCheckpoints" -}}
{{- if and .Values.checkpoints.enabled (not (hasPrefix "s3://" .Values.checkpoints.root)) }}true{{ end }}
{{- end }}

{{/*
--cache-mib: server.cacheMib, else what the memory limit leaves after the stream buffer and the
workers (the memory rule), else "" (no memory limit: the server's default). The RUNBOOK's rule for
the cache's own size: see values.yaml, server.cacheMib.
*/}}
{{- define "shardstream.cacheMib" -}}
{{- if .Values.server.cacheMib }}
{{- .Values.server.cacheMib | int }}
{{- else }}
{{- $mib := include "shardstream.memoryLimitMib" . }}
{{- $beside := include "shardstream.memoryBesideCacheMib" . }}
{{- if and $mib $beside }}
{{- sub (int64 $mib) (int64 $beside) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Refuses a memory limit the memory rule does not fit in: the cache, 2 x the stream buffer and the
workers must all be inside resources.limits.memory, and a derived cache gets at least 256 MiB.
*/}}
{{- define "shardstream.validateMemory" -}}
{{- $mib := include "shardstream.memoryLimitMib" . }}
{{- if $mib }}
{{- $beside := include "shardstream.memoryBesideCacheMib" . }}
{{- if not $beside }}
{{- fail "resources.limits.memory needs a known worker count (server.workers, or resources.limits.cpu): each worker takes server.workerMemoryMib of the limit" }}
{{- end }}
{{- $workers := include "shardstream.workers" . }}
{{- $perWorker := printf "server.workerMemoryMib (%v)" (int64 .Values.server.workerMemoryMib) }}
{{- if .Values.checkpoints.enabled }}
{{- $perWorker = printf "(server.workerMemoryMib %v + checkpoints.inflightMib %v)" (int64 .Values.server.workerMemoryMib) (int64 .Values.checkpoints.inflightMib) }}
{{- end }}
{{- $lower := ternary " (or checkpoints.inflightMib)" "" (.Values.checkpoints.enabled | default false) }}
{{- $parts := printf "2 x server.limits.streamBufferMib (%v) + %v workers x %s = %v MiB" (int64 .Values.server.limits.streamBufferMib) $workers $perWorker $beside }}
{{- if .Values.server.cacheMib }}
{{- $need := add (int64 .Values.server.cacheMib) (int64 $beside) }}
{{- if gt $need (int64 $mib) }}
{{- fail (printf "resources.limits.memory (%v MiB) is below server.cacheMib (%v) + %s: the pod would be OOM-killed under load; raise the limit to at least %vMi, or lower the cache, the buffer or the workers%s" $mib (int64 .Values.server.cacheMib) $parts $need $lower) }}
{{- end }}
{{- else if lt (sub (int64 $mib) (int64 $beside)) 256 }}
{{- fail (printf "resources.limits.memory (%v MiB) leaves %v MiB for the cache after %s: raise the limit to at least %vMi (256 MiB of cache), or lower the buffer or the workers%s" $mib (sub (int64 $mib) (int64 $beside)) $parts (add (int64 $beside) 256) $lower) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The pod's grace period: explicit, or preStop sleep + drain + 15 s (a worker still running 10 s after
the drain is killed by the supervisor; 5 s more for the exit). Refuses one that would cut the drain.
*/}}
{{- define "shardstream.terminationGracePeriodSeconds" -}}
{{- $floor := add .Values.server.preStopSleepSeconds .Values.server.drainSeconds }}
{{- if kindIs "invalid" .Values.server.terminationGracePeriodSeconds }}
{{- add $floor 15 }}
{{- else if le (int .Values.server.terminationGracePeriodSeconds) (int $floor) }}
{{- fail (printf "server.terminationGracePeriodSeconds (%v) must exceed server.preStopSleepSeconds + server.drainSeconds (%v), or the kubelet kills servers mid-drain" .Values.server.terminationGracePeriodSeconds $floor) }}
{{- else }}
{{- .Values.server.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/*
True ("true") when the registry root is a local path (then registry.volume, or an empty emptyDir, is
mounted there).
*/}}
{{- define "shardstream.localRoot" -}}
{{- if not (hasPrefix "s3://" .Values.registry.root) }}true{{ end }}
{{- end }}

{{/*
Where Secrets are mounted in the server container.
*/}}
{{- define "shardstream.tlsDir" -}}/etc/shardstream/tls{{- end }}
{{- define "shardstream.authDir" -}}/etc/shardstream/auth{{- end }}

{{/*
Checks across values that the schema cannot express; each fails with the value to change.
*/}}
{{- define "shardstream.validate" -}}
{{- if and (include "shardstream.localRoot" .) (gt (len (.Values.registry.volume | default dict)) 1) }}
{{- fail (printf "registry.volume names %d volume sources (%s): a volume has exactly one, e.g. {persistentVolumeClaim: {claimName: NAME}}" (len .Values.registry.volume) (keys .Values.registry.volume | sortAlpha | join ", ")) }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret: a kubernetes.io/tls Secret (tls.crt, tls.key; ca.crt with tls.clientCA)" }}
{{- end }}
{{- if and .Values.tls.clientCA (not .Values.tls.enabled) }}
{{- fail "tls.clientCA needs tls.enabled: client certificates are checked by the TLS server" }}
{{- end }}
{{- if and .Values.tls.enabled (eq .Values.probes.mode "grpc") }}
{{- fail "tls.enabled needs probes.mode=http: the kubelet's gRPC probe speaks plaintext, so it cannot check a TLS port" }}
{{- end }}
{{- if and .Values.tests.enabled .Values.tls.enabled }}
{{- fail "tests.enabled with tls.enabled: the helm test pod checks health in plaintext; run it without TLS" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%v) exceeds autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not (dig "requests" "cpu" "" (.Values.resources | default dict))) }}
{{- fail "autoscaling.enabled needs resources.requests.cpu: the HPA's CPU target is a share of the request" }}
{{- end }}
{{- if eq (int .Values.server.port) (int .Values.server.metricsPort) }}
{{- fail (printf "server.port and server.metricsPort are both %v: give each its own port" .Values.server.port) }}
{{- end }}
{{- $first := int .Values.server.dataPort }}
{{- $last := add $first (include "shardstream.dataPortCount" . | int) -1 }}
{{- range $name, $port := dict "server.port" .Values.server.port "server.metricsPort" .Values.server.metricsPort }}
{{- if and (ge (int $port) $first) (le (int $port) $last) }}
{{- fail (printf "%s (%v) is inside the data ports %v..%v (server.dataPort + one per worker): move one of them" $name $port $first $last) }}
{{- end }}
{{- end }}
{{- if gt $last 65535 }}
{{- fail (printf "the data ports run past 65535 (server.dataPort %v + %v workers): lower server.dataPort" $first (include "shardstream.dataPortCount" .)) }}
{{- end }}
{{- if .Values.server.pinWorkers }}
{{- $millis := include "shardstream.cpuLimitMillis" . }}
{{- if or (not $millis) (mod (int $millis) 1000) }}
{{- fail (printf "server.pinWorkers needs a whole number of cores in resources.limits.cpu (got %q): only a Guaranteed pod with integer CPUs gets cores of its own from the static CPU manager policy; elsewhere its cpuset is the node's shared pool" (dig "limits" "cpu" "" (.Values.resources | default dict) | toString)) }}
{{- end }}
{{- end }}
{{- include "shardstream.validateCheckpoints" . }}
{{- include "shardstream.validateMemory" . }}
{{- if and .Values.networkPolicy.enabled (not (include "shardstream.workers" .)) }}
{{- fail "networkPolicy.enabled needs a known worker count (server.workers, or resources.limits.cpu): worker i serves server.dataPort + i, and the policy opens each of those ports" }}
{{- end }}
{{- end }}

{{/*
Refuses checkpoint values the server would refuse, or that would lose checkpoints: a local root
needs one volume source every replica shares (an emptyDir would keep each pod's checkpoints in the
pod, gone with it and unseen by the other replicas), at a path of its own.
*/}}
{{- define "shardstream.validateCheckpoints" -}}
{{- $c := .Values.checkpoints }}
{{- if $c.enabled }}
{{- if lt (int $c.inflightMib) (int $c.maxChunkMib) }}
{{- fail (printf "checkpoints.inflightMib (%v) must hold one chunk: at least checkpoints.maxChunkMib (%v)" $c.inflightMib $c.maxChunkMib) }}
{{- end }}
{{- if include "shardstream.localCheckpoints" . }}
{{- $n := len ($c.volume | default dict) }}
{{- if eq $n 0 }}
{{- fail (printf "checkpoints.root (%s) is a local path and checkpoints.volume is empty: each pod would keep its own checkpoints and lose them with the pod; give a volume every replica mounts read-write (e.g. {persistentVolumeClaim: {claimName: checkpoints}}, ReadWriteMany) or an s3:// root" $c.root) }}
{{- else if gt $n 1 }}
{{- fail (printf "checkpoints.volume names %d volume sources (%s): a volume has exactly one, e.g. {persistentVolumeClaim: {claimName: NAME}}" $n (keys $c.volume | sortAlpha | join ", ")) }}
{{- end }}
{{- $taken := dict "/tmp" "the /tmp emptyDir" }}
{{- if include "shardstream.localRoot" . }}{{ $_ := set $taken .Values.registry.root "registry.root" }}{{ end }}
{{- if .Values.diskCache.enabled }}{{ $_ := set $taken .Values.diskCache.mountPath "diskCache.mountPath" }}{{ end }}
{{- $root := trimSuffix "/" $c.root }}
{{- range $path, $what := $taken }}
{{- if eq $root (trimSuffix "/" $path) }}
{{- fail (printf "checkpoints.root (%s) is also %s: give checkpoints a path of their own" $c.root $what) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
