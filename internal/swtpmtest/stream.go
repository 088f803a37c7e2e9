package swtpmtest

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"
)

// Stream is a TPM reached over a byte stream that carries raw TPM commands and
// responses, such as swtpm's server socket (`swtpm socket --server type=tcp`). Each
// response is read in full by its header's size. It is safe for concurrent use.
type Stream struct {
	mu sync.Mutex
	rw io.ReadWriteCloser
}

// NewStream wraps rw.
func NewStream(rw io.ReadWriteCloser) *Stream { return &Stream{rw: rw} }

// maxResponse bounds a response (TPM 2.0 responses are at most a few KiB).
const maxResponse = 64 << 10

// rcRetry is TPM_RC_RETRY: the TPM could not start the command and it is to be sent
// again.
const rcRetry = 0x922

// Send implements transport.TPM. It sends a command again, after 1 ms doubling to 1 s,
// while the TPM answers TPM_RC_RETRY, as go-tpm does for a device.
func (s *Stream) Send(cmd []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for wait := time.Millisecond; ; wait *= 2 {
		rsp, err := s.send(cmd)
		if err != nil || wait > time.Second || len(rsp) < 10 || binary.BigEndian.Uint32(rsp[6:10]) != rcRetry {
			return rsp, err
		}
		time.Sleep(wait)
	}
}

func (s *Stream) send(cmd []byte) ([]byte, error) {
	if _, err := s.rw.Write(cmd); err != nil {
		return nil, fmt.Errorf("swtpm: send TPM command: %w", err)
	}
	hdr := make([]byte, 10)
	if _, err := io.ReadFull(s.rw, hdr); err != nil {
		return nil, fmt.Errorf("swtpm: read TPM response header: %w", err)
	}
	size := int(binary.BigEndian.Uint32(hdr[2:6]))
	if size < len(hdr) || size > maxResponse {
		return nil, fmt.Errorf("swtpm: TPM response of %d bytes: not a TPM 2.0 response", size)
	}
	rsp := make([]byte, size)
	copy(rsp, hdr)
	if _, err := io.ReadFull(s.rw, rsp[len(hdr):]); err != nil {
		return nil, fmt.Errorf("swtpm: read TPM response: %w", err)
	}
	return rsp, nil
}

// Close closes the stream.
func (s *Stream) Close() error { return s.rw.Close() }
