package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/enroll"
)

// issuedFile records the operator certificates gpuboot issued, one per line:
// "NAME SERIAL_HEX NOT_AFTER_RFC3339 level=LEVEL", so `gpuboot operators revoke NAME`
// can find them. Lines written before levels have no level= field (those certificates
// are admins').
const issuedFile = "issued"

// auditFile is the append-only record of operator revocations: one JSON object
// (auditLine) per line.
const auditFile = "audit"

// maxAuditRead bounds how much of the audit record ListOperatorAudit reads: its tail.
const maxAuditRead = 8 << 20

// recordOperatorCert appends an issued operator certificate to STATEDIR/operators/issued.
func recordOperatorCert(stateDir, name, serial string, notAfter time.Time, level pki.OperatorLevel) error {
	return appendOperatorsFile(stateDir, issuedFile, fmt.Sprintf("%s %s %s level=%s\n", name, serial, notAfter.UTC().Format(time.RFC3339), level.Name()))
}

// appendOperatorsFile appends line to STATEDIR/operators/file and syncs it.
func appendOperatorsFile(stateDir, file, line string) error {
	dir := filepath.Join(stateDir, "operators")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
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
	auditMu    sync.Mutex // one audit write or read at a time
}

var _ admin.OperatorCredentials = (*operatorCreds)(nil)

func (o *operatorCreds) RevokeOperator(_ context.Context, r admin.Revocation) ([]string, int, error) {
	done, tokens, err := o.revoke(r)
	entry := auditLine{Time: time.Now().UTC(), Actor: r.Actor, ActorLevel: r.ActorLevel.Name(), Operator: r.Operator,
		Serials: done, TokensRemoved: tokens, Reason: r.Reason}
	if err != nil {
		entry.Error = status.Convert(err).Message()
	}
	if aerr := o.audit(entry); aerr != nil {
		// The revocation stands (it cannot be undone here); the operator must know the
		// audit record misses it.
		o.log.Error("operator revocation not written to the audit record", "operator", r.Operator, "by", r.Actor, "err", aerr)
		if err == nil {
			err = status.Errorf(codes.Internal, "operator %s revoked (%d certificate(s), %d token(s)), but writing the audit record %s failed: %v; fix the state directory and note the revocation by hand",
				r.Operator, len(done), tokens, filepath.Join(o.stateDir, "operators", auditFile), aerr)
		}
	}
	return done, tokens, err
}

func (o *operatorCreds) revoke(r admin.Revocation) ([]string, int, error) {
	serials, err := operatorSerials(o.stateDir, r.Operator)
	if err != nil {
		return nil, 0, status.Errorf(codes.Internal, "read the record of issued operator certificates: %v", err)
	}
	serials = append(serials, r.Serials...)
	tokens := 0
	if o.tokensFile != "" {
		if tokens, err = admin.RemoveOperatorTokens(o.tokensFile, r.Operator); err != nil {
			return nil, 0, status.Errorf(codes.Internal, "remove %s's tokens from %s: %v", r.Operator, o.tokensFile, err)
		}
	}
	if len(serials) == 0 && tokens == 0 {
		return nil, 0, status.Errorf(codes.NotFound, "no certificate or token recorded for operator %q (certificates issued before gpuboot recorded them: pass --serial)", r.Operator)
	}
	done, err := o.svc.RevokeSerials(serials)
	o.log.Warn("operator credentials revoked", "operator", r.Operator, "by", r.Actor, "level", r.ActorLevel.Name(), "reason", r.Reason, "certificates", done, "tokens", tokens)
	return done, tokens, err
}

// auditLine is one line of the audit record.
type auditLine struct {
	Time          time.Time `json:"time"`
	Actor         string    `json:"actor"`
	ActorLevel    string    `json:"actorLevel"`
	Operator      string    `json:"operator"`
	Serials       []string  `json:"serials,omitempty"`
	TokensRemoved int       `json:"tokensRemoved"`
	Reason        string    `json:"reason,omitempty"`
	Error         string    `json:"error,omitempty"`
}

func (o *operatorCreds) audit(e auditLine) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	o.auditMu.Lock()
	defer o.auditMu.Unlock()
	return appendOperatorsFile(o.stateDir, auditFile, string(b)+"\n")
}

func (o *operatorCreds) OperatorAudit(_ context.Context, limit int) ([]*bootv1.OperatorAuditEntry, error) {
	o.auditMu.Lock()
	lines, err := readAudit(filepath.Join(o.stateDir, "operators", auditFile))
	o.auditMu.Unlock()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the audit record: %v", err)
	}
	if limit > 0 && len(lines) > limit {
		lines = lines[len(lines)-limit:]
	}
	out := make([]*bootv1.OperatorAuditEntry, 0, len(lines))
	for _, l := range lines {
		out = append(out, &bootv1.OperatorAuditEntry{Time: timestamppb.New(l.Time), Actor: l.Actor, ActorLevel: l.ActorLevel,
			Operator: l.Operator, Serials: l.Serials, TokensRemoved: int32(l.TokensRemoved), Reason: l.Reason, Error: l.Error})
	}
	return out, nil
}

// readAudit reads the audit record, the last maxAuditRead bytes of it at most (a
// partial first line is skipped). A missing record is empty.
func readAudit(path string) ([]auditLine, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	skipFirst := false
	if fi.Size() > maxAuditRead {
		if _, err := f.Seek(fi.Size()-maxAuditRead, io.SeekStart); err != nil {
			return nil, err
		}
		skipFirst = true
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAuditRead))
	if err != nil {
		return nil, err
	}
	var out []auditLine
	for n, line := range strings.Split(string(data), "\n") {
		if (n == 0 && skipFirst) || strings.TrimSpace(line) == "" {
			continue
		}
		var l auditLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			return nil, fmt.Errorf("%s: an entry is not JSON (%v): the record was edited or cut short; move the line aside", path, err)
		}
		out = append(out, l)
	}
	return out, nil
}
