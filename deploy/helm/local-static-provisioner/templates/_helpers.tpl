{{- define "lsp.name" -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "lsp.serviceAccount" -}}{{ default (include "lsp.name" .) .Values.serviceAccount.name }}{{- end -}}
{{- define "lsp.labels" -}}
app.kubernetes.io/name: local-static-provisioner
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- /* node-cleanup: the name of its Deployment, ServiceAccount, RBAC and Lease, and labels the
     DaemonSet's selector (lsp.labels) does not match. */ -}}
{{- define "lsp.nodeCleanup.name" -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}-node-cleanup{{- end -}}
{{- define "lsp.nodeCleanup.labels" -}}
app.kubernetes.io/name: local-static-provisioner-node-cleanup
app.kubernetes.io/instance: {{ .Release.Name }}
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
