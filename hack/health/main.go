// Command health says what the health checks GitOps tools run make of Pet
// objects read from the real API server, for the end-to-end tests:
//
//	health kstatus < objects.jsonl
//	    kstatus, the convention Flux and `kubectl wait` rely on: one
//	    "<status>\t<message>" line per object (Current, InProgress, Failed, ...).
//	health argocd DIR
//	    Argo CD's Lua health check in DIR (health.lua), run by gopher-lua as
//	    Argo CD runs it, on each case of DIR/health_test.yaml (Argo CD's own
//	    layout); exits 1 if any case gives another status or message.
//	health flux EXPRS < objects.jsonl
//	    a Flux healthCheckExprs entry (EXPRS, YAML) evaluated as Flux's
//	    kustomize-controller does: inProgress, then failed, then current,
//	    the first true one deciding; none true reads InProgress.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// A list of thousands of Pets on one line is larger than bufio's default.
const maxLine = 16 << 20

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(args []string, in io.Reader, stdout io.Writer) error {
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	switch {
	case len(args) == 1 && args[0] == "kstatus":
		return eachObject(in, func(object *unstructured.Unstructured) error {
			result, err := status.Compute(object)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s\t%s\n", result.Status, result.Message)
			return nil
		})
	case len(args) == 2 && args[0] == "argocd":
		return argocdSuite(args[1], out)
	case len(args) == 2 && args[0] == "flux":
		exprs, err := readFluxExprs(args[1])
		if err != nil {
			return err
		}
		return eachObject(in, func(object *unstructured.Unstructured) error {
			verdict, err := exprs.evaluate(object.Object)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, verdict)
			return nil
		})
	default:
		return fmt.Errorf("usage: health kstatus < objects.jsonl | health argocd DIR | health flux EXPRS < objects.jsonl")
	}
}

// eachObject calls f with each object of a JSON-lines stream, decoded as
// Kubernetes decodes (integers stay integers, which kstatus's generation
// check needs).
func eachObject(in io.Reader, f func(*unstructured.Unstructured) error) error {
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 0, 1<<20), maxLine)
	for line := 1; scanner.Scan(); line++ {
		object := &unstructured.Unstructured{}
		if err := object.UnmarshalJSON(scanner.Bytes()); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		if err := f(object); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
	}
	return scanner.Err()
}

// readObject reads one object from a YAML or JSON file.
func readObject(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	json, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	object := &unstructured.Unstructured{}
	if err := object.UnmarshalJSON(json); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return object.Object, nil
}
