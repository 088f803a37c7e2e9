//go:build !linux

package podnet

import (
	"context"
	"errors"
	"net/netip"
	"sync"
)

// NoNFTablesError is a kernel without nftables (Linux only).
type NoNFTablesError struct{ Err error }

func (e *NoNFTablesError) Error() string { return "nftables unavailable: " + e.Err.Error() }

// Is makes errors.Is(err, ErrNoNFTables) hold.
func (e *NoNFTablesError) Is(target error) bool { return target == ErrNoNFTables }

func startFlannel(context.Context, *sync.WaitGroup, Config, netip.Prefix) (int, error) {
	return 0, errors.New("pod network: flannel runs on Linux only")
}
