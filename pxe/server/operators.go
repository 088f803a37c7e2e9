package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/enroll"
)

// issuedFile records the operator certificates gpuboot issued, one per line:
// "NAME SERIAL_HEX NOT_AFTER_RFC3339", so `gpuboot operators revoke NAME` can find them.
const issuedFile = "issued"

// recordOperatorCert appends an issued operator certificate to STATEDIR/operators/issued.
func recordOperatorCert(stateDir, name, serial string, notAfter time.Time) error {
	dir := filepath.Join(stateDir, "operators")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, issuedFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%s %s %s\n", name, serial, notAfter.UTC().Format(time.RFC3339)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// operatorSerials returns the serials recorded for name.
func operatorSerials(stateDir, name string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, "operators", issuedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == name && !slices.Contains(out, f[1]) {
			out = append(out, f[1])
		}
	}
	return out, sc.Err()
}

// operatorCreds revokes operators' credentials for AdminService.RevokeOperator.
type operatorCreds struct {
	stateDir   string
	tokensFile string
	svc        *enroll.Service
	log        *slog.Logger
}

var _ admin.OperatorCredentials = (*operatorCreds)(nil)

func (o *operatorCreds) RevokeOperator(_ context.Context, name, actor, reason string, extra []string) ([]string, int, error) {
	serials, err := operatorSerials(o.stateDir, name)
	if err != nil {
		return nil, 0, status.Errorf(codes.Internal, "read the record of issued operator certificates: %v", err)
	}
	serials = append(serials, extra...)
	tokens := 0
	if o.tokensFile != "" {
		if tokens, err = admin.RemoveOperatorTokens(o.tokensFile, name); err != nil {
			return nil, 0, status.Errorf(codes.Internal, "remove %s's tokens from %s: %v", name, o.tokensFile, err)
		}
	}
	if len(serials) == 0 && tokens == 0 {
		return nil, 0, status.Errorf(codes.NotFound, "no certificate or token recorded for operator %q (certificates issued before gpuboot recorded them: pass --serial)", name)
	}
	done, err := o.svc.RevokeSerials(serials)
	o.log.Warn("operator credentials revoked", "operator", name, "by", actor, "reason", reason, "certificates", done, "tokens", tokens)
	return done, tokens, err
}
