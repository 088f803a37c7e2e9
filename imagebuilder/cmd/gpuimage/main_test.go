package main

import (
	"os"
	"testing"
)

// runAsGPUImage, set to 1 in the environment, makes the test binary run gpuimage's
// main instead of the tests, so that a test can run gpuimage in a process of its own
// (another umask, time zone or working directory) without building it first.
const runAsGPUImage = "GPURACK_TEST_RUN_AS_GPUIMAGE"

func TestMain(m *testing.M) {
	if os.Getenv(runAsGPUImage) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}
