{{/*
An image reference: repository, :tag when a tag is set (config/ leaves its
images untagged), and @digest when a digest is set: the digest a signature
was verified for, so the node runs those bytes whatever the tag names now.
*/}}
{{- define "petstore-operator.image" -}}
{{ .repository }}
{{- if .tag -}}:{{ .tag }}{{- end -}}
{{- if .digest -}}@{{ .digest }}{{- end -}}
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
