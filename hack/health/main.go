// Command health says what kstatus, the health convention Flux and
// `kubectl wait` rely on, computes for each object it reads: one JSON
// object per line on stdin, one "<status>\t<message>" line per object on
// stdout (InProgress, Failed, Current, Terminating, ...). The end-to-end
// tests feed it Pets read from the real API server.
package main

import (
	"bufio"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// A list of thousands of Pets on one line is larger than bufio's default.
const maxLine = 16 << 20

func main() {
	if len(os.Args) != 2 || os.Args[1] != "kstatus" {
		fmt.Fprintln(os.Stderr, "usage: health kstatus < objects.jsonl")
		os.Exit(2)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), maxLine)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for line := 1; in.Scan(); line++ {
		object := &unstructured.Unstructured{}
		// Kubernetes' own decoding: integers stay integers, which
		// kstatus's generation check needs.
		if err := object.UnmarshalJSON(in.Bytes()); err != nil {
			fmt.Fprintf(os.Stderr, "line %d: %v\n", line, err)
			out.Flush()
			os.Exit(1)
		}
		result, err := status.Compute(object)
		if err != nil {
			fmt.Fprintf(os.Stderr, "line %d: %v\n", line, err)
			out.Flush()
			os.Exit(1)
		}
		fmt.Fprintf(out, "%s\t%s\n", result.Status, result.Message)
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		out.Flush()
		os.Exit(1)
	}
}
