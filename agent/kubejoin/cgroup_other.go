//go:build !linux

package kubejoin

import "errors"

func isCgroup2(string) (bool, error) {
	return false, errors.New("cgroup detection needs Linux")
}
