package components

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// Health is the result of one health probe.
type Health struct {
	Component string
	URL       string
	OK        bool
	Detail    string // the body (trimmed) or the error
	Took      time.Duration
}

func (h Health) String() string {
	state := "ok"
	if !h.OK {
		state = "NOT ready"
	}
	return fmt.Sprintf("%-24s %-9s %s (%s)", h.Component, state, h.URL, h.Detail)
}

// Prober checks the components' health endpoints. The apiserver's /readyz
// is checked against the cluster CA (it is open to anonymous clients); the
// controller-manager and scheduler serve self-signed certificates on
// loopback, which are not verified; etcd's metrics listener is plain HTTP on
// loopback.
type Prober struct {
	ClusterCA *x509.CertPool
}

// Probe checks c once within timeout.
func (p Prober) Probe(ctx context.Context, c Component, timeout time.Duration) Health {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tlsCfg := &tls.Config{InsecureSkipVerify: true} // loopback, self-signed serving certs
	if c.Name == APIServer && p.ClusterCA != nil {
		tlsCfg = &tls.Config{RootCAs: p.ClusterCA}
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
	start := time.Now()
	h := Health{Component: c.Name, URL: c.HealthURL}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.HealthURL, nil)
	if err != nil {
		h.Detail = err.Error()
		return h
	}
	resp, err := client.Do(req)
	h.Took = time.Since(start)
	if err != nil {
		h.Detail = describeDialError(err)
		return h
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := strings.TrimSpace(string(body))
	switch {
	case resp.StatusCode != http.StatusOK:
		h.Detail = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, firstLine(text))
	case c.Name == Etcd:
		h.OK = strings.Contains(text, `"health":"true"`)
		h.Detail = text
	case c.HealthAnyValue:
		h.OK = true
		h.Detail = "HTTP 200"
	case c.HealthText != "":
		h.OK = strings.Contains(text, c.HealthText)
		h.Detail = text
	default:
		h.OK = text == "ok"
		h.Detail = text
	}
	return h
}

func describeDialError(err error) string {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "connection refused: not listening (is it running?)"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	return err.Error()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// PortInUseError names the component whose port another process holds.
type PortInUseError struct {
	Component string
	Port      Port
	Err       error
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("%s: port %s (%s in cluster.yaml) is already in use by another process: stop that process or choose another port", e.Component, e.Port.Addr(), e.Port.Field)
}

// CheckPorts tries to listen on every port of comps and returns a
// *PortInUseError for the first one that is taken.
func CheckPorts(comps []Component) error {
	for _, c := range comps {
		for _, p := range c.Ports {
			l, err := net.Listen("tcp", p.Addr())
			if err != nil {
				if errors.Is(err, syscall.EADDRINUSE) {
					return &PortInUseError{Component: c.Name, Port: p, Err: err}
				}
				return fmt.Errorf("%s: cannot listen on %s (%s in cluster.yaml): %w", c.Name, p.Addr(), p.Field, err)
			}
			l.Close()
		}
	}
	return nil
}
