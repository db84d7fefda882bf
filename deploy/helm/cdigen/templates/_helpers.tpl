{{/* The labels of every object: kustomize's (part-of) and Helm's own. */}}
{{- define "cdigen.labels" -}}
app.kubernetes.io/part-of: cdigen
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The image of both wings: repository:tag, the tag v<appVersion> unless set. */}}
{{- define "cdigen.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default (printf "v%s" .Chart.AppVersion)) -}}
{{- end -}}

{{/* The Namespace of one wing: {"name": ..., "root": $}. */}}
{{- define "cdigen.namespace" -}}
apiVersion: v1
kind: Namespace
metadata:
  name: {{ .name }}
  labels:
    {{- include "cdigen.labels" .root | nindent 4 }}
    # hostPath volumes and a privileged container (NVML opens /dev/nvidia*): the baseline Pod
    # Security level forbids both
    pod-security.kubernetes.io/enforce: privileged
    pod-security.kubernetes.io/warn: privileged
{{- end -}}

{{/* The mps-control container of either wing: {"mps": <wing>.mps, "root": $}. The host
driver's own nvidia-cuda-mps-control -f, run in the host's / (mounted at /host), in the
foreground; its /dev/shm (the clients' too) writable for clients of any user. */}}
{{- define "cdigen.mpsContainer" -}}
- name: mps-control
  image: {{ include "cdigen.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command:
    - chroot
    - /host
    - sh
    - -c
    - chmod 1777 /dev/shm && exec nvidia-cuda-mps-control -f
  env:
    - {name: CUDA_MPS_PIPE_DIRECTORY, value: {{ .mps.pipeDirectory | quote }}}
    - {name: CUDA_MPS_LOG_DIRECTORY, value: {{ .mps.logDirectory | quote }}}
  securityContext:
    # the MPS server opens /dev/nvidia* for every GPU it serves
    privileged: true
    runAsUser: 0
  resources:
    {{- toYaml .mps.resources | nindent 4 }}
  volumeMounts:
    - {name: host-root, mountPath: /host, readOnly: true}
    # writable, at the host paths as seen from inside the chroot
    - {name: mps-pipe, mountPath: {{ printf "/host%s" .mps.pipeDirectory | quote }}}
    - {name: mps-log, mountPath: {{ printf "/host%s" .mps.logDirectory | quote }}}
    - {name: mps-shm, mountPath: /host/dev/shm}
{{- end -}}

{{/* The MPS daemon's volumes: {"mps": <wing>.mps}. */}}
{{- define "cdigen.mpsVolumes" -}}
- name: mps-pipe
  hostPath: {path: {{ .mps.pipeDirectory | quote }}, type: DirectoryOrCreate}
- name: mps-log
  hostPath: {path: {{ .mps.logDirectory | quote }}, type: DirectoryOrCreate}
- name: mps-shm
  hostPath: {path: {{ .mps.shmDirectory | quote }}, type: DirectoryOrCreate}
{{- end -}}

{{/* Refusals no schema can state (one line each: what, where, how to fix). */}}
{{- define "cdigen.checks" -}}
{{- if and .Values.devicePlugin.enabled .Values.devicePlugin.mps.enabled (ne .Values.driver.layout "host") -}}
{{- fail "devicePlugin.mps.enabled needs driver.layout=host (the daemon runs in the host's /): run the MPS daemon the GPU Operator's way instead (docs/sharing.md)" -}}
{{- end -}}
{{- if and .Values.dra.enabled .Values.dra.mps.enabled (ne .Values.driver.layout "host") -}}
{{- fail "dra.mps.enabled needs driver.layout=host (the daemon runs in the host's /): run the MPS daemon the GPU Operator's way instead (docs/dra-sharing.md)" -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled .Values.dra.enabled .Values.createNamespaces (eq .Values.devicePlugin.namespace .Values.dra.namespace) -}}
{{- fail (printf "devicePlugin.namespace and dra.namespace are both %q: give each wing its own namespace" .Values.dra.namespace) -}}
{{- end -}}
{{- range $wing := list "devicePlugin" "dra" -}}
{{- if hasKey (index $.Values $wing "podLabels") "app.kubernetes.io/name" -}}
{{- fail (printf "%s.podLabels sets app.kubernetes.io/name, which the DaemonSet's selector owns: use another label" $wing) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled .Values.dra.enabled (or (empty .Values.dra.nodeSelector) (eq (toJson .Values.devicePlugin.nodeSelector) (toJson .Values.dra.nodeSelector))) -}}
{{- fail "dra.nodeSelector is empty or the same as devicePlugin.nodeSelector: both wings would serve the same nodes; opt nodes into DRA with a label of their own (docs/dra.md)" -}}
{{- end -}}
{{- end -}}
