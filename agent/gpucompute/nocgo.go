//go:build !cgo

package gpucompute

import "errors"

// DefaultLibrary is the driver's CUDA library as the dynamic loader finds it.
const DefaultLibrary = "libcuda.so.1"

// cgoEnabled says which loader this build has: none, it cannot dlopen.
const cgoEnabled = false

var errNoCgo = errors.New("this gpuagent was built without cgo (CGO_ENABLED=0), so it cannot load libcuda.so.1; build it with cgo, as make build does")

func open(path string) (string, int, error) {
	if path == "" {
		path = DefaultLibrary
	}
	return path, 0, errNoCgo
}

func deviceCount() (int, error) { return 0, errNoCgo }

func measureGPU(t Target, _ Options) GPUResult {
	return GPUResult{Index: t.Index, Err: errNoCgo.Error()}
}
