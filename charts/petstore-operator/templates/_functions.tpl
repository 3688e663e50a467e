{{/*
An image reference: repository, and :tag when a tag is set (config/ leaves
its images untagged).
*/}}
{{- define "petstore-operator.image" -}}
{{- if .tag -}}
{{ .repository }}:{{ .tag }}
{{- else -}}
{{ .repository }}
{{- end -}}
{{- end -}}

{{/*
The store the operator writes to: storeAddress, else the demo store's
Service in namespaces.store.
*/}}
{{- define "petstore-operator.storeAddress" -}}
{{- if .Values.storeAddress -}}
{{ .Values.storeAddress }}
{{- else -}}
petstore-service.{{ .Values.namespaces.store }}.svc.cluster.local:6742
{{- end -}}
{{- end -}}
