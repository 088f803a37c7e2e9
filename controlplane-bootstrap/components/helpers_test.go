package components

import (
	"os/exec"
	"strconv"
)

var lookPath = exec.LookPath

func itoa(i int) string { return strconv.Itoa(i) }
