package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

// Argo CD's resource_customizations layout: health_test.yaml beside
// health.lua, each case an input object and the health it must give.
type healthTests struct {
	Tests []struct {
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		InputPath string `json:"inputPath"`
	} `json:"tests"`
}

func argocdSuite(dir string, out *bufio.Writer) error {
	script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		return err
	}
	var suite healthTests
	if err := yaml.UnmarshalStrict(data, &suite); err != nil {
		return fmt.Errorf("health_test.yaml: %w", err)
	}
	if len(suite.Tests) == 0 {
		return fmt.Errorf("health_test.yaml has no tests")
	}
	failed := 0
	for _, test := range suite.Tests {
		object, err := readObject(filepath.Join(dir, test.InputPath))
		if err != nil {
			return err
		}
		status, message, err := argocdHealth(string(script), object)
		if err != nil {
			return fmt.Errorf("%s: %w", test.InputPath, err)
		}
		want := test.HealthStatus
		ok := status == want.Status && (want.Message == "" || message == want.Message)
		if !ok {
			failed++
		}
		fmt.Fprintf(out, "%s\t%s\t%s\t%t\n", test.InputPath, status, message, ok)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d health cases failed", failed, len(suite.Tests))
	}
	return nil
}

// argocdHealth runs a health script as Argo CD does: the object as the
// global `obj`, the base, table, string and math libraries only, and a
// table with `status` and `message` returned.
func argocdHealth(script string, object map[string]interface{}) (string, string, error) {
	state := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer state.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		if err := state.CallByParam(lua.P{Fn: state.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return "", "", err
		}
	}
	state.SetGlobal("obj", toLua(state, object))
	if err := state.DoString(script); err != nil {
		return "", "", err
	}
	result, ok := state.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, not a table", state.Get(-1).Type())
	}
	status := result.RawGetString("status")
	message := result.RawGetString("message")
	if status.Type() != lua.LTString {
		return "", "", fmt.Errorf("the script returned no status")
	}
	text := ""
	if message.Type() == lua.LTString {
		text = message.String()
	}
	return status.String(), text, nil
}

// toLua converts a decoded object as Argo CD's decodeValue does: maps and
// lists become tables (lists from 1), numbers LNumber.
func toLua(state *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case map[string]interface{}:
		table := state.NewTable()
		for key, item := range v {
			table.RawSetString(key, toLua(state, item))
		}
		return table
	case []interface{}:
		table := state.NewTable()
		for _, item := range v {
			table.Append(toLua(state, item))
		}
		return table
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case nil:
		return lua.LNil
	default:
		return lua.LString(fmt.Sprint(v))
	}
}
