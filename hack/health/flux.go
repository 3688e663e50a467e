package main

import (
	"fmt"
	"os"

	"github.com/google/cel-go/cel"
	"sigs.k8s.io/yaml"
)

// One entry of a Flux Kustomization's spec.healthCheckExprs.
type fluxExprs struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	InProgress string `json:"inProgress"`
	Failed     string `json:"failed"`
	Current    string `json:"current"`
}

func readFluxExprs(path string) (*fluxExprs, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var exprs fluxExprs
	if err := yaml.UnmarshalStrict(data, &exprs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if exprs.Current == "" {
		return nil, fmt.Errorf("%s: current is required", path)
	}
	return &exprs, nil
}

// evaluate returns Flux's verdict on one object: the object's top-level
// fields are the expressions' variables, optional field access
// (`status.?conditions`) is on, and the expressions are tried in Flux's
// order.
func (e *fluxExprs) evaluate(object map[string]interface{}) (string, error) {
	options := []cel.EnvOption{cel.OptionalTypes()}
	for field := range object {
		options = append(options, cel.Variable(field, cel.DynType))
	}
	env, err := cel.NewEnv(options...)
	if err != nil {
		return "", err
	}
	for _, check := range []struct{ verdict, expr string }{
		{"InProgress", e.InProgress},
		{"Failed", e.Failed},
		{"Current", e.Current},
	} {
		if check.expr == "" {
			continue
		}
		ast, issues := env.Compile(check.expr)
		if issues != nil && issues.Err() != nil {
			return "", fmt.Errorf("%s: %w", check.verdict, issues.Err())
		}
		program, err := env.Program(ast)
		if err != nil {
			return "", err
		}
		value, _, err := program.Eval(object)
		if err != nil {
			return "", fmt.Errorf("%s: %w", check.verdict, err)
		}
		if value.Value() == true {
			return check.verdict, nil
		}
	}
	return "InProgress", nil
}
