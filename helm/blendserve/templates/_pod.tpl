{{/* What every Ray pod gets besides Ray itself: checks of the pod values, the node's name, the model, spreading. */}}

{{/* Keys of rayStartParams the chart (or KubeRay) sets itself: a second one would render a duplicate YAML key. */}}
{{- define "blendserve.checkRayStartParams" -}}
{{- $metrics := "is set by the chart: use metrics.rayMetricsPort instead" -}}
{{- $redis := "is set by KubeRay from the GCS fault-tolerance options: use head.gcsFaultTolerance instead" -}}
{{- $noReplica := "is set by the chart (0: the head runs no worker replica); remove it" -}}
{{- $head := dict "num-cpus" $noReplica "num-gpus" $noReplica "metrics-export-port" $metrics
  "dashboard-host" "is set by the chart (0.0.0.0: KubeRay submits the app through the dashboard); remove it"
  "redis-password" $redis "redis-username" $redis -}}
{{- range $key := keys .Values.head.rayStartParams | sortAlpha -}}
{{- if hasKey $head $key -}}
{{- fail (printf "head.rayStartParams.%s %s" $key (get $head $key)) -}}
{{- end -}}
{{- end -}}
{{- $worker := dict "num-cpus" "is set by the chart: use workerGroups[].cpus instead"
  "num-gpus" "is set by the chart: use workerGroups[].gpus instead" "metrics-export-port" $metrics -}}
{{- range $group := .Values.workerGroups -}}
{{- range $key := keys ($group.rayStartParams | default dict) | sortAlpha -}}
{{- if hasKey $worker $key -}}
{{- fail (printf "workerGroups[%s].rayStartParams.%s %s" $group.name $key (get $worker $key)) -}}
{{- end -}}
{{- end -}}
{{- if gt (int $group.minReplicas) (int $group.maxReplicas) -}}
{{- fail (printf "workerGroups[%s]: minReplicas (%d) is greater than maxReplicas (%d)" $group.name (int $group.minReplicas) (int $group.maxReplicas)) -}}
{{- end -}}
{{- if or (lt (int $group.replicas) (int $group.minReplicas)) (gt (int $group.replicas) (int $group.maxReplicas)) -}}
{{- fail (printf "workerGroups[%s]: replicas (%d) must lie within [%d, %d] (minReplicas, maxReplicas)" $group.name (int $group.replicas) (int $group.minReplicas) (int $group.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.head.gcsFaultTolerance.enabled (not .Values.head.gcsFaultTolerance.redisAddress) -}}
{{- fail "head.gcsFaultTolerance.redisAddress is required (host:port of the Redis that keeps the GCS state) when it is enabled" -}}
{{- end -}}
{{- end -}}

{{/* Each GPU must hold what vLLM claims of it plus the device tier, for every replica sharing it. */}}
{{- define "blendserve.checkGpuMemory" -}}
{{- $engine := .Values.config.engine | default dict -}}
{{- $vllm := get $engine "vllm" | default dict -}}
{{- $share := 0.0 -}}
{{- if and (eq (get $engine "kind" | default "vllm") "vllm") (ne (get $vllm "device" | default "auto") "cpu") -}}
{{- /* vLLM requests this share of the GPU's whole memory at start-up and refuses to start without it free
  (vllm v1/worker/utils.py request_memory); 0.3 is blendserve's default (workers/vllm/settings.py). */ -}}
{{- $share = float64 (get $vllm "gpu_memory_utilization" | default 0.3) -}}
{{- end -}}
{{- $numGpus := float64 .Values.replica.numGpus -}}
{{- $perGpu := 1.0 -}}
{{- if and (gt $numGpus 0.0) (lt $numGpus 1.0) -}}
{{- $perGpu = floor (divf 1.0 $numGpus) -}}
{{- end -}}
{{- $device := include "blendserve.bytes" .Values.kvCache.device.capacity | float64 -}}
{{- range .Values.workerGroups -}}
{{- if and .gpuMemory (gt (int .gpus) 0) (gt $numGpus 0.0) -}}
{{- $gpu := include "blendserve.bytes" .gpuMemory | float64 -}}
{{- $need := mulf $perGpu (addf (mulf $share $gpu) $device) -}}
{{- if gt $need $gpu -}}
{{- fail (printf "workerGroups[%s]: vLLM's share (config.engine.vllm.gpu_memory_utilization %v of gpuMemory) plus kvCache.device.capacity (%s), x %v replicas per GPU (replica.numGpus %v), needs %.1fGi of GPU memory, more than gpuMemory (%s): lower gpu_memory_utilization or the device capacity" .name $share $.Values.kvCache.device.capacity $perGpu $numGpus (divf $need 1073741824.0) .gpuMemory) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The model's provisioning: where the checkpoint comes from and that config.model.path is left to it. */}}
{{- define "blendserve.checkModel" -}}
{{- $model := .Values.model -}}
{{- if ne $model.provision "none" -}}
{{- if get (.Values.config.model | default dict) "path" -}}
{{- fail (printf "config.model.path is set by model.provision (to model.mountPath, %s): remove it" $model.mountPath) -}}
{{- end -}}
{{- if and (eq $model.provision "fetch") (not $model.fetch.url) -}}
{{- fail "model.fetch.url (the checkpoint's directory, e.g. s3://bucket/models/llama) is required when model.provision is fetch" -}}
{{- end -}}
{{- if and (eq $model.provision "volume") (ne $model.volume.type "persistentVolumeClaim") -}}
{{- fail "model.volume.claimName: model.provision volume mounts an existing PersistentVolumeClaim holding the checkpoint (set model.volume.type to persistentVolumeClaim and its claimName)" -}}
{{- end -}}
{{- if and (eq $model.volume.type "persistentVolumeClaim") (not $model.volume.claimName) -}}
{{- fail "model.volume.claimName is required when model.volume.type is persistentVolumeClaim" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* config.model.path when the chart provisions the model, else nothing. */}}
{{- define "blendserve.modelPath" -}}
{{- if ne .Values.model.provision "none" -}}{{ .Values.model.mountPath }}{{- end -}}
{{- end -}}

{{/* S3 credentials from a Secret, never inline: (dict "secret" <name or ""> "credentials" <the key names>). */}}
{{- define "blendserve.s3CredentialsEnv" -}}
{{- if .secret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .credentials.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .credentials.secretAccessKeyKey }}
{{- end }}
{{- end -}}

{{/* The downward API's node name: kvplane names the node's SSD slot by it, so a new pod on the node finds it. */}}
{{- define "blendserve.nodeNameEnv" -}}
- name: BLENDSERVE_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/* The model's volume, mounted at model.mountPath in every Ray pod. */}}
{{- define "blendserve.modelVolume" -}}
{{- $model := .Values.model -}}
{{- if ne $model.provision "none" }}
- name: model
{{- if eq $model.volume.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ $model.volume.claimName }}
    {{- if eq $model.provision "volume" }}
    readOnly: true
    {{- end }}
{{- else }}
  emptyDir:
    {{- with $model.volume.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }}
    {}
    {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Ray reads the model; only the fetch init container writes it. */}}
{{- define "blendserve.modelMount" -}}
{{- if ne .Values.model.provision "none" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The init container that copies the checkpoint in before Ray starts (KubeRay appends its own after it). */}}
{{- define "blendserve.initContainers" -}}
{{- $model := .Values.model -}}
{{- if eq $model.provision "fetch" }}
initContainers:
  - name: fetch-model
    image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command:
      - blendserve
      - fetch-model
      - {{ $model.fetch.url | quote }}
      - {{ $model.mountPath | quote }}
      {{- with $model.fetch.endpointUrl }}
      - --endpoint-url
      - {{ . | quote }}
      {{- end }}
      {{- with $model.fetch.region }}
      - --region
      - {{ . | quote }}
      {{- end }}
    {{- with include "blendserve.s3CredentialsEnv" (dict "secret" $model.fetch.credentials.existingSecret "credentials" $model.fetch.credentials) | trim }}
    env:
      {{- . | nindent 6 }}
    {{- end }}
    {{- with $model.fetch.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $.Values.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: model
        mountPath: {{ $model.mountPath }}
{{- end }}
{{- end -}}

{{/* A worker group's topologySpreadConstraints: its own, or one pod per node where possible; each without a
  labelSelector selects the group's pods. (dict "group" <the group> "root" $) */}}
{{- define "blendserve.topologySpread" -}}
{{- $default := list (dict "maxSkew" 1 "topologyKey" "kubernetes.io/hostname" "whenUnsatisfiable" "ScheduleAnyway") -}}
{{- $constraints := $default -}}
{{- if hasKey .group "topologySpreadConstraints" -}}
{{- $constraints = .group.topologySpreadConstraints | default list -}}
{{- end -}}
{{- $labels := include "blendserve.selectorLabels" .root | fromYaml -}}
{{- $_ := set $labels "app.kubernetes.io/component" "worker" -}}
{{- $_ := set $labels "blendserve/worker-group" .group.name -}}
{{- $done := list -}}
{{- range $constraints -}}
{{- $constraint := deepCopy . -}}
{{- if not (hasKey $constraint "labelSelector") -}}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $labels) -}}
{{- end -}}
{{- $done = append $done $constraint -}}
{{- end -}}
{{- with $done }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
