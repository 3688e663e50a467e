module petstore-operator/hack/tiltcheck

go 1.25.0

require (
	go.starlark.net v0.0.0-20260908191801-89a6a09411d5
	gopkg.in/yaml.v3 v3.0.1
)

require golang.org/x/sys v0.42.0 // indirect
