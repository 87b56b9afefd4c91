{{- /* Names and labels as upstream's chart makes them (helm/provisioner/templates/_helpers.tpl),
     so that a release of upstream's chart upgraded to this one keeps its objects: above all
     its DaemonSet, whose selector cannot change and which must be updated in place (node by
     node) rather than replaced by a second one running next to it. */ -}}
{{- define "lsp.name" -}}{{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "lsp.fullname" -}}
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
{{- define "lsp.chart" -}}{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "lsp.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "lsp.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}
{{- /* The DaemonSet's selector: upstream's two labels, never anything a value adds. */ -}}
{{- define "lsp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lsp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "lsp.labels" -}}
{{ include "lsp.selectorLabels" . }}
helm.sh/chart: {{ include "lsp.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- /* node-cleanup: the name of its Deployment, ServiceAccount, RBAC and Lease, and labels the
     DaemonSet's selector (lsp.selectorLabels) does not match. */ -}}
{{- define "lsp.nodeCleanup.name" -}}{{ include "lsp.fullname" . | trunc 50 | trimSuffix "-" }}-node-cleanup{{- end -}}
{{- define "lsp.nodeCleanup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lsp.name" . | trunc 50 | trimSuffix "-" }}-node-cleanup
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "lsp.nodeCleanup.labels" -}}
{{ include "lsp.nodeCleanup.selectorLabels" . }}
helm.sh/chart: {{ include "lsp.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- /* The opted-in StorageClasses, named one by one: opting in is never implied. */ -}}
{{- define "lsp.nodeCleanup.storageClasses" -}}
{{- $names := list -}}
{{- $given := .Values.nodeCleanup.storageClasses -}}
{{- if kindIs "string" $given }}{{ $given = splitList "," $given }}{{ end -}}
{{- range $given }}{{ if . }}{{ $names = append $names (trim .) }}{{ end }}{{ end -}}
{{- if not $names }}{{ fail "nodeCleanup.enabled needs nodeCleanup.storageClasses: name each StorageClass whose claims and PVs it may release" }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{- /* The agent's image: upstream's one string (run through tpl, as upstream does), or the
     map; the tag defaults to the chart's appVersion. */ -}}
{{- define "lsp.image" -}}
{{- $image := .Values.image -}}
{{- if kindIs "string" $image -}}
{{- tpl $image . -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (toString (default .Chart.AppVersion $image.tag)) -}}
{{- end -}}
{{- end -}}
{{- /* Upstream's imagePullPolicy, or image.pullPolicy; both given, they must agree. */ -}}
{{- define "lsp.imagePullPolicy" -}}
{{- $fromMap := "" -}}
{{- if kindIs "map" .Values.image }}{{ $fromMap = .Values.image.pullPolicy | default "" }}{{ end -}}
{{- if and .Values.imagePullPolicy $fromMap (ne .Values.imagePullPolicy $fromMap) -}}
{{- fail (printf "imagePullPolicy (%s) and image.pullPolicy (%s) disagree: give one of them" .Values.imagePullPolicy $fromMap) -}}
{{- end -}}
{{- .Values.imagePullPolicy | default $fromMap | default "IfNotPresent" -}}
{{- end -}}
{{- /* node-cleanup's image: its own repository and tag, each falling back to the agent's
     (with the agent's image as one string: both or neither). */ -}}
{{- define "lsp.nodeCleanup.image" -}}
{{- $nc := .Values.nodeCleanup.image -}}
{{- if kindIs "string" .Values.image -}}
{{- if and $nc.repository $nc.tag -}}{{ printf "%s:%s" $nc.repository (toString $nc.tag) }}
{{- else if or $nc.repository $nc.tag -}}{{ fail "nodeCleanup.image: with image given as one string, give both nodeCleanup.image.repository and nodeCleanup.image.tag, or neither" }}
{{- else -}}{{ include "lsp.image" . }}{{- end -}}
{{- else -}}
{{- printf "%s:%s" (default .Values.image.repository $nc.repository) (toString (default (default .Chart.AppVersion .Values.image.tag) $nc.tag)) -}}
{{- end -}}
{{- end -}}

{{- /* A probe: the value as given when it names a handler, else the value's timings on the
     chart's handler. Arguments: probe (the value), default (the chart's probe). */ -}}
{{- define "lsp.probe" -}}
{{- $given := .probe | default dict -}}
{{- $handlers := list "httpGet" "tcpSocket" "exec" "grpc" -}}
{{- $hasHandler := false -}}
{{- range $handlers }}{{ if hasKey $given . }}{{ $hasHandler = true }}{{ end }}{{ end -}}
{{- if $hasHandler -}}{{ toYaml $given }}
{{- else -}}{{ toYaml (merge (deepCopy $given) .default) }}{{- end -}}
{{- end -}}

{{- /* Upstream values this chart cannot honour: refused by name, with the reason, rather
     than ignored. */ -}}
{{- define "lsp.refuseUnsupported" -}}
{{- if .Values.enableWindows -}}
{{- fail "enableWindows: true is not supported: local-static-provisioner runs on Linux nodes only (it reads Linux mount tables and block devices). Remove enableWindows, or keep upstream's provisioner for Windows nodes." -}}
{{- end -}}
{{- if not .Values.mountDevVolume -}}
{{- fail "mountDevVolume: false is not supported: the agent needs the host's /dev to prove which disk it is about to wipe (/dev/block/<major:minor>, /dev/<name>) and to reach block volumes. Remove mountDevVolume." -}}
{{- end -}}
{{- if .Values.removeNodeNotReadyTaint -}}
{{- $key := .Values.provisionerNotReadyNodeTaintKey | default "" -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $key) -}}
{{- fail (printf "removeNodeNotReadyTaint: true needs provisionerNotReadyNodeTaintKey, a taint key ([prefix/]name), not %q: the agent removes that taint from its Node once its volumes are published" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.nodeSelector (hasKey .Values.nodeSelector "kubernetes.io/os") (ne (index .Values.nodeSelector "kubernetes.io/os") "linux") -}}
{{- fail (printf "nodeSelector kubernetes.io/os=%s: the agent runs on Linux nodes only" (index .Values.nodeSelector "kubernetes.io/os")) -}}
{{- end -}}
{{- range $key, $_ := .Values.podLabels -}}
{{- if or (eq $key "app.kubernetes.io/name") (eq $key "app.kubernetes.io/instance") -}}
{{- fail (printf "podLabels.%s: this label is the DaemonSet's selector; use nameOverride to change it" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /*
Why the agent refuses a discovery directory, empty when it accepts it: the rules of
validate-config (src/config/validate.rs, core/volume_safety.rs), for the NOTES' render-time
warning. tests/cluster/chart.rs checks this against the binary for every system and sensitive
directory. Input: dict "dir".
*/ -}}
{{- define "lsp.dirProblem" -}}
{{- $dir := .dir -}}
{{- $system := list "/" "/bin" "/boot" "/dev" "/etc" "/home" "/lib" "/lib32" "/lib64" "/libx32" "/proc" "/root" "/run" "/sbin" "/sys" "/tmp" "/usr" "/var" "/var/lib" "/var/lib/kubelet" -}}
{{- $sensitive := list "/bin" "/boot" "/dev" "/etc" "/lib" "/lib32" "/lib64" "/libx32" "/proc" "/root" "/run" "/sbin" "/sys" "/usr" "/var/lib/containerd" "/var/lib/kubelet" "/var/log" "/var/run" -}}
{{- $devAdvice := "a class may use a directory of its own under /dev/disk, such as /dev/disk/kubernetes, but none of the by-* ones udev fills; a devices section is the better way to claim raw disks" -}}
{{- if not (hasPrefix "/" $dir) -}}
must be an absolute path
{{- else if has ".." (splitList "/" $dir) -}}
must not contain '..'
{{- else -}}
{{- $n := clean $dir -}}
{{- $parts := splitList "/" $n -}}
{{- $dedicated := and (ge (len $parts) 4) (eq (index $parts 1) "dev") (eq (index $parts 2) "disk") (not (hasPrefix "by-" (index $parts 3))) (not (hasPrefix "." (index $parts 3))) -}}
{{- if has $n $system -}}
is a system directory{{ if eq $n "/dev" }} ({{ $devAdvice }}){{ end }}
{{- else if or (hasPrefix "/proc/" $n) (hasPrefix "/sys/" $n) -}}
is inside a kernel pseudo-filesystem
{{- else if not $dedicated -}}
{{- $inside := "" -}}
{{- range $s := $sensitive -}}{{- if and (not $inside) (or (eq $n $s) (hasPrefix (printf "%s/" $s) $n)) -}}{{- $inside = $s -}}{{- end -}}{{- end -}}
{{- if $inside -}}
is inside the host directory {{ $inside }}{{ if eq $inside "/dev" }} ({{ $devAdvice }}){{ end }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* hostPID: the value when given (true or false), else true only when a class claims
     devices (a `devices` section): the scan that proves no host process holds a disk open
     before it is claimed needs the host's processes in /proc. Without it the agent refuses to
     claim (docs/security.md). Upstream's default is false. */ -}}
{{- define "lsp.hostPID" -}}
{{- if kindIs "bool" .Values.hostPID -}}
{{- .Values.hostPID -}}
{{- else -}}
{{- $claims := false -}}
{{- range .Values.classes -}}{{- if hasKey . "devices" -}}{{- $claims = true -}}{{- end -}}{{- end -}}
{{- $claims -}}
{{- end -}}
{{- end -}}
