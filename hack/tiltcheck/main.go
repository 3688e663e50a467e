// Command tiltcheck statically checks the Tiltfile without Docker or a
// cluster: it runs the Tiltfile in a Starlark interpreter whose Tilt
// builtins only record their arguments, then verifies that every path,
// Dockerfile target, image, workload, object selector and resource
// dependency it names exists.
//
//	go run ./hack/tiltcheck            (from the repository root)
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
	"gopkg.in/yaml.v3"
)

type object struct {
	kind, name, namespace string
	images                []string
}

type checker struct {
	root      string
	errors    []string
	objects   []object
	images    map[string]bool // built by docker_build
	resources map[string]bool // every Tilt resource name
	deps      map[string][]string
	contexts  []string // allow_k8s_contexts
}

func (c *checker) fail(format string, args ...any) {
	c.errors = append(c.errors, fmt.Sprintf(format, args...))
}

func (c *checker) mustExist(what, path string) {
	if _, err := os.Stat(filepath.Join(c.root, path)); err != nil {
		c.fail("%s: %s does not exist", what, path)
	}
}

func strings_(v starlark.Value) []string {
	var out []string
	switch v := v.(type) {
	case starlark.String:
		out = append(out, string(v))
	case *starlark.List:
		for i := 0; i < v.Len(); i++ {
			if s, ok := v.Index(i).(starlark.String); ok {
				out = append(out, string(s))
			}
		}
	}
	return out
}

func (c *checker) dockerBuild(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var ref, context, dockerfile, target string
	var only starlark.Value = starlark.NewList(nil)
	var buildArgs *starlark.Dict
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "ref", &ref, "context", &context,
		"dockerfile?", &dockerfile, "target?", &target, "only?", &only, "build_args?", &buildArgs); err != nil {
		return nil, err
	}
	c.images[ref] = true
	c.mustExist("docker_build context", context)
	if dockerfile == "" {
		dockerfile = filepath.Join(context, "Dockerfile")
	}
	c.mustExist("docker_build dockerfile", dockerfile)
	for _, p := range strings_(only) {
		c.mustExist("docker_build only", filepath.Join(context, p))
	}
	text, _ := os.ReadFile(filepath.Join(c.root, dockerfile))
	if target != "" {
		re := regexp.MustCompile(`(?mi)^FROM\s+\S+\s+AS\s+` + regexp.QuoteMeta(target) + `\s*$`)
		if !re.Match(text) {
			c.fail("docker_build %s: target %q is not a stage in %s", ref, target, dockerfile)
		}
	}
	// A build argument the Dockerfile does not declare is ignored by the
	// build (only a warning), so a misspelt one would pass silently.
	if buildArgs != nil {
		for _, key := range buildArgs.Keys() {
			name, ok := starlark.AsString(key)
			re := regexp.MustCompile(`(?mi)^ARG\s+` + regexp.QuoteMeta(name) + `(=|\s*$)`)
			if !ok || !re.Match(text) {
				c.fail("docker_build %s: build argument %s is not an ARG in %s", ref, key, dockerfile)
			}
		}
	}
	return starlark.None, nil
}

func (c *checker) kustomize(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var path string
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "path", &path); err != nil {
		return nil, err
	}
	c.mustExist("kustomize", path)
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(c.root, path)).Output()
	if err != nil {
		c.fail("kubectl kustomize %s: %v", path, err)
		return starlark.String(""), nil
	}
	return starlark.String(out), nil
}

func (c *checker) k8sYaml(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var blob string
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "yaml", &blob); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewBufferString(blob))
	for {
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name, Namespace string
			} `yaml:"metadata"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct{ Image string } `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		o := object{kind: strings.ToLower(doc.Kind), name: doc.Metadata.Name, namespace: doc.Metadata.Namespace}
		for _, ctr := range doc.Spec.Template.Spec.Containers {
			o.images = append(o.images, ctr.Image)
		}
		c.objects = append(c.objects, o)
	}
	return starlark.None, nil
}

func (c *checker) k8sResource(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var workload, newName string
	var objects, portForwards, deps, labels starlark.Value = starlark.NewList(nil), starlark.NewList(nil), starlark.NewList(nil), starlark.NewList(nil)
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "workload?", &workload, "new_name?", &newName,
		"objects?", &objects, "port_forwards?", &portForwards, "resource_deps?", &deps, "labels?", &labels); err != nil {
		return nil, err
	}
	name := workload
	if workload != "" {
		found := false
		for _, o := range c.objects {
			if o.kind == "deployment" && o.name == workload {
				found = true
			}
		}
		if !found {
			c.fail("k8s_resource: no workload named %q in k8s_yaml", workload)
		}
	}
	if newName != "" {
		name = newName
	}
	if name == "" {
		c.fail("k8s_resource needs a workload or a new_name")
	}
	for _, sel := range strings_(objects) {
		parts := strings.Split(sel, ":")
		found := false
		for _, o := range c.objects {
			if o.name == parts[0] && (len(parts) < 2 || o.kind == strings.ToLower(parts[1])) &&
				(len(parts) < 3 || o.namespace == parts[2]) {
				found = true
			}
		}
		if !found {
			c.fail("k8s_resource %s: object selector %q matches nothing", name, sel)
		}
	}
	for _, pf := range strings_(portForwards) {
		if !regexp.MustCompile(`^\d+(:\d+)?$`).MatchString(pf) {
			c.fail("k8s_resource %s: bad port forward %q", name, pf)
		}
	}
	c.resources[name] = true
	c.deps[name] = strings_(deps)
	return starlark.None, nil
}

func (c *checker) localResource(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var name, cmd string
	var autoInit, allowParallel bool
	var deps, labels starlark.Value = starlark.NewList(nil), starlark.NewList(nil)
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "name", &name, "cmd", &cmd, "deps?", &deps,
		"auto_init?", &autoInit, "allow_parallel?", &allowParallel, "labels?", &labels); err != nil {
		return nil, err
	}
	for _, d := range strings_(deps) {
		c.mustExist("local_resource "+name+" deps", d)
	}
	c.resources[name] = true
	return starlark.None, nil
}

// allowK8sContexts records the contexts the Tiltfile accepts, to compare with
// the one ctlptl's cluster yields.
func (c *checker) allowK8sContexts(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var contexts starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "contexts", &contexts); err != nil {
		return nil, err
	}
	c.contexts = append(c.contexts, strings_(contexts)...)
	return starlark.None, nil
}

// checkContext: a kind cluster that ctlptl names N has the kube context N
// (ctlptl's names already carry the "kind-" prefix), and Tilt refuses any
// context it is not allowed.
func (c *checker) checkContext() {
	text, err := os.ReadFile(filepath.Join(c.root, "config/ctlptl.yaml"))
	if err != nil {
		c.fail("config/ctlptl.yaml: %v", err)
		return
	}
	dec := yaml.NewDecoder(bytes.NewReader(text))
	for {
		var doc struct{ Kind, Product, Name string }
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc.Kind != "Cluster" {
			continue
		}
		allowed := false
		for _, ctx := range c.contexts {
			allowed = allowed || ctx == doc.Name
		}
		if !allowed {
			c.fail("ctlptl's cluster yields the context %q, which allow_k8s_contexts %v does not name", doc.Name, c.contexts)
		}
		return
	}
	c.fail("config/ctlptl.yaml has no Cluster")
}


func main() {
	root, _ := os.Getwd()
	c := &checker{root: root, images: map[string]bool{}, resources: map[string]bool{}, deps: map[string][]string{}}
	builtins := starlark.StringDict{
		"docker_build":       starlark.NewBuiltin("docker_build", c.dockerBuild),
		"kustomize":          starlark.NewBuiltin("kustomize", c.kustomize),
		"k8s_yaml":           starlark.NewBuiltin("k8s_yaml", c.k8sYaml),
		"k8s_resource":       starlark.NewBuiltin("k8s_resource", c.k8sResource),
		"local_resource":     starlark.NewBuiltin("local_resource", c.localResource),
		"allow_k8s_contexts": starlark.NewBuiltin("allow_k8s_contexts", c.allowK8sContexts),
	}
	thread := &starlark.Thread{Name: "Tiltfile"}
	if _, err := starlark.ExecFileOptions(&syntax.FileOptions{}, thread, filepath.Join(root, "Tiltfile"), nil, builtins); err != nil {
		fmt.Fprintf(os.Stderr, "tiltcheck: Tiltfile does not run: %v\n", err)
		os.Exit(1)
	}
	// Tilt names a Deployment's resource after it; those exist implicitly.
	for _, o := range c.objects {
		if o.kind == "deployment" {
			c.resources[o.name] = true
			for _, img := range o.images {
				if !c.images[img] {
					c.fail("deployment %s uses image %q that no docker_build builds", o.name, img)
				}
			}
		}
	}
	for img := range c.images {
		used := false
		for _, o := range c.objects {
			for _, i := range o.images {
				used = used || i == img
			}
		}
		if !used {
			c.fail("docker_build %q is used by no workload", img)
		}
	}
	c.checkContext()
	for name, deps := range c.deps {
		for _, d := range deps {
			if !c.resources[d] {
				c.fail("k8s_resource %s depends on unknown resource %q", name, d)
			}
		}
	}
	if len(c.errors) > 0 {
		for _, e := range c.errors {
			fmt.Fprintln(os.Stderr, "tiltcheck:", e)
		}
		os.Exit(1)
	}
	fmt.Printf("tiltcheck: Tiltfile OK (%d resources, %d images, %d objects)\n", len(c.resources), len(c.images), len(c.objects))
}
