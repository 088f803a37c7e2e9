package kubejoin

import "golang.org/x/sys/unix"

func isCgroup2(root string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return false, err
	}
	return st.Type == cgroup2SuperMagic, nil
}
