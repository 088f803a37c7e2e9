//go:build linux && !amd64 && !386

package netnstest

import "syscall"

const sysSetns = syscall.SYS_SETNS
