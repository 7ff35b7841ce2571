{{/* Names and labels. */}}
{{- define "blendserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "blendserve.fullname" -}}
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

{{- define "blendserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "blendserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "blendserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "blendserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "blendserve.serveServiceName" -}}
{{- printf "%s-serve" (include "blendserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "blendserve.apiKeysSecret" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "blendserve.fullname" .)) -}}
{{- end -}}

{{- define "blendserve.objectStoreSecret" -}}
{{- $credentials := .Values.kvCache.object.credentials -}}
{{- if $credentials.existingSecret -}}
{{- $credentials.existingSecret -}}
{{- else if $credentials.create.enabled -}}
{{- printf "%s-object-store" (include "blendserve.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Bytes in a Kubernetes quantity such as 48Gi, 500M or 1024 (integers only, as the schema allows). */}}
{{- define "blendserve.bytes" -}}
{{- $quantity := toString . -}}
{{- $digits := regexFind "^[0-9]+" $quantity -}}
{{- $units := dict "" 1 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- mul (int64 $digits) (get $units (trimPrefix $digits $quantity)) -}}
{{- end -}}

{{/* Paths inside every Ray pod. */}}
{{- define "blendserve.dataDir" -}}/data/blendserve{{- end -}}
{{- define "blendserve.apiKeysDir" -}}/etc/blendserve/api-keys{{- end -}}

{{/* The chunk-KV tiers: device, the node's RAM (a share of the smallest worker pod's memory), SSD, object. */}}
{{- define "blendserve.tiers" -}}
{{- $cache := .Values.kvCache -}}
{{- $smallest := int64 0 -}}
{{- range .Values.workerGroups -}}
{{- $bytes := include "blendserve.bytes" .memory | int64 -}}
{{- if or (eq $smallest 0) (lt $bytes $smallest) -}}
{{- $smallest = $bytes -}}
{{- end -}}
{{- end -}}
{{- $ramBytes := mulf $smallest $cache.ram.memoryFraction | floor | int64 -}}
{{- $tiers := list (dict "name" "device" "url" "device://" "capacity_bytes" (include "blendserve.bytes" $cache.device.capacity | int64) "compression" ($cache.device.compression | default "none")) -}}
{{- $tiers = append $tiers (dict "name" "ram" "url" "ram://" "capacity_bytes" $ramBytes "compression" ($cache.ram.compression | default "none")) -}}
{{- if $cache.ssd.enabled -}}
{{- /* 90% of the volume: it also holds vLLM's scratch files, and a full emptyDir gets the pod evicted. */ -}}
{{- $ssdBytes := mulf (include "blendserve.bytes" $cache.ssd.capacity | int64) 0.9 | floor | int64 -}}
{{- $tiers = append $tiers (dict "name" "ssd" "url" (printf "file://%s/kv" (include "blendserve.dataDir" .)) "capacity_bytes" $ssdBytes "compression" ($cache.ssd.compression | default "none")) -}}
{{- end -}}
{{- if $cache.object.enabled -}}
{{- $object := dict "name" "object" "url" $cache.object.url "capacity_bytes" (include "blendserve.bytes" $cache.object.capacity | int64) "compression" ($cache.object.compression | default "none") -}}
{{- if $cache.object.endpointUrl -}}
{{- $_ := set $object "storage_options" (dict "client_kwargs" (dict "endpoint_url" $cache.object.endpointUrl)) -}}
{{- end -}}
{{- $tiers = append $tiers $object -}}
{{- end -}}
{{- toJson $tiers -}}
{{- end -}}

{{/* blendserve's configuration (the app's args): the user's `config`, then what the chart decides. The args are
the app's code: Ray 2.60 rebuilds it and restarts every replica when they change (deploy_utils.py
get_app_code_version), so what may change on running replicas (admission, replica counts, autoscaling) goes in
the deployments' overrides (blendserve.deployments) instead. */}}
{{- define "blendserve.appConfig" -}}
{{- $config := deepCopy .Values.config -}}
{{- $_ := unset $config "admission" -}}
{{- with include "blendserve.modelPath" . -}}
{{- $_ := set $config "model" (set (deepCopy (get $config "model" | default dict)) "path" .) -}}
{{- end -}}
{{- $server := merge (dict "host" "0.0.0.0" "port" 8000) (deepCopy (get $config "server" | default dict)) -}}
{{- if .Values.apiKeys.enabled -}}
{{- $_ := set $server "api_keys_file" (printf "%s/%s" (include "blendserve.apiKeysDir" .) .Values.apiKeys.secretKey) -}}
{{- $_ := set $server "metrics_require_key" .Values.apiKeys.metricsRequireKey -}}
{{- else -}}
{{- $_ := set $server "allow_unauthenticated" true -}}
{{- end -}}
{{- $_ := set $config "server" $server -}}
{{- $_ := set $config "data_dir" (include "blendserve.dataDir" .) -}}
{{- $_ := set $config "tiers" (include "blendserve.tiers" . | fromJsonArray) -}}
{{- $_ := set $config "workers" (dict "num_cpus" .Values.replica.numCpus "num_gpus" .Values.replica.numGpus) -}}
{{- toJson $config -}}
{{- end -}}

{{/* Per-deployment overrides (cluster/hot_settings.py): Ray applies them to the running replicas, a lightweight
update (reconfigure, never a restart) as long as the code version stays. Only the autoscaling policy's own kwargs
(the knobs Serve's autoscaling_config has no field for) count in that version. */}}
{{- define "blendserve.deployments" -}}
{{- $admission := get .Values.config "admission" | default dict -}}
{{- $workers := dict "name" "WorkerDeployment" -}}
{{- with $admission.max_queued_per_worker -}}
{{- /* Serve must never hold back what admission let through (cluster.app.worker_options). */ -}}
{{- $_ := set $workers "max_ongoing_requests" (add1 (int .)) -}}
{{- end -}}
{{- if .Values.autoscaling.enabled -}}
{{- $policy := .Values.autoscaling.policy -}}
{{- /* Ray only warns here; the policy (scheduler.autoscaling.AutoscalingPolicy) refuses it on every tick. */ -}}
{{- if ge (float64 ($policy.metrics_interval_s | default 10.0)) (float64 ($policy.look_back_period_s | default 30.0)) -}}
{{- fail (printf "autoscaling.policy.metrics_interval_s (%v) must be less than look_back_period_s (%v): Serve averages over more than one report" ($policy.metrics_interval_s | default 10.0) ($policy.look_back_period_s | default 30.0)) -}}
{{- end -}}
{{- $serveKeys := dict "min_replicas" "min_replicas" "max_replicas" "max_replicas" "target_queue_per_replica" "target_ongoing_requests" "upscale_delay_s" "upscale_delay_s" "downscale_delay_s" "downscale_delay_s" "look_back_period_s" "look_back_period_s" "metrics_interval_s" "metrics_interval_s" -}}
{{- $autoscaling := dict -}}
{{- $kwargs := dict -}}
{{- range $key, $value := .Values.autoscaling.policy -}}
{{- if hasKey $serveKeys $key -}}
{{- $_ := set $autoscaling (get $serveKeys $key) $value -}}
{{- else -}}
{{- $_ := set $kwargs $key $value -}}
{{- end -}}
{{- end -}}
{{- /* No initial_replicas: Ray 2.60 AutoscalingState.register resets the target to it on every config change. */ -}}
{{- $_ := set $autoscaling "policy" (dict "policy_function" "scheduler.serve_policy:ServeAutoscalingPolicy" "policy_kwargs" $kwargs) -}}
{{- $_ := set $workers "num_replicas" nil -}}
{{- $_ := set $workers "autoscaling_config" $autoscaling -}}
{{- $_ := set $workers "user_config" (dict "ttft_window_s" .Values.autoscaling.policy.look_back_period_s) -}}
{{- else -}}
{{- $_ := set $workers "num_replicas" (int .Values.replica.count) -}}
{{- end -}}
{{- toJson (list (dict "name" "Ingress" "user_config" (dict "admission" $admission)) $workers) -}}
{{- end -}}

{{/* Ray Serve's declarative config (what `serve deploy` takes), KubeRay's serveConfigV2. */}}
{{- define "blendserve.serveConfig" -}}
http_options:
  host: 0.0.0.0
  port: 8000
proxy_location: EveryNode
applications:
  - name: blendserve
    import_path: cluster.app:build_app
    route_prefix: /
    args:
      {{- include "blendserve.appConfig" . | fromJson | toYaml | nindent 6 }}
    deployments:
      {{- include "blendserve.deployments" . | fromJsonArray | toYaml | nindent 6 }}
{{- end -}}

{{/* Environment of every Ray container: the node's name, object-store credentials from their Secret, never inline. */}}
{{- define "blendserve.env" -}}
{{ include "blendserve.nodeNameEnv" . }}
{{- $object := .Values.kvCache.object -}}
{{- if $object.enabled }}
{{- include "blendserve.s3CredentialsEnv" (dict "secret" (include "blendserve.objectStoreSecret" .) "credentials" $object.credentials) }}
{{- end }}
{{- if and $object.enabled $object.region }}
- name: AWS_DEFAULT_REGION
  value: {{ $object.region | quote }}
{{- end }}
{{- end -}}

{{/* Mounts every Ray container has: the API keys file and blendserve's data directory. */}}
{{- define "blendserve.volumeMounts" -}}
- name: data
  mountPath: {{ include "blendserve.dataDir" . }}
{{- include "blendserve.modelMount" . }}
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  mountPath: {{ include "blendserve.apiKeysDir" . }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes every Ray pod has besides its data volume: the API keys Secret and the extra volumes. */}}
{{- define "blendserve.sharedVolumes" -}}
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  secret:
    secretName: {{ include "blendserve.apiKeysSecret" . }}
    items:
      - key: {{ .Values.apiKeys.secretKey }}
        path: {{ .Values.apiKeys.secretKey }}
{{- end }}
{{- include "blendserve.modelVolume" . }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* What the head's and every worker's pod spec share: identity, pull secrets, security, the model's fetch. */}}
{{- define "blendserve.podSpecCommon" -}}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "blendserve.initContainers" . }}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
