{{- define "lsp.name" -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "lsp.serviceAccount" -}}{{ default (include "lsp.name" .) .Values.serviceAccount.name }}{{- end -}}
{{- define "lsp.labels" -}}
app.kubernetes.io/name: local-static-provisioner
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
