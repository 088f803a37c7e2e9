package apilb

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// checkClient is the HTTP client for one upstream's health checks: it verifies the
// apiserver's certificate against roots for host, presents no client certificate
// (the apiserver serves /readyz to anonymous clients), and limits each check to timeout.
func checkClient(roots *x509.CertPool, host string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			// No proxy from the environment: a check must reach the apiserver directly,
			// as the spliced connections do.
			Proxy:       nil,
			DialContext: (&net.Dialer{Timeout: timeout}).DialContext,
			TLSClientConfig: &tls.Config{
				RootCAs:    roots,
				ServerName: host,
				MinVersion: tls.VersionTLS12,
			},
			TLSHandshakeTimeout:    timeout,
			ResponseHeaderTimeout:  timeout,
			MaxResponseHeaderBytes: 64 << 10,
			// One kept connection per upstream: a check a second is then one small request,
			// not a TCP and TLS handshake, which costs a node under emulation (and the
			// apiserver, with every node checking) a share of a CPU. A server that died
			// resets it, and the next check dials anew and is refused; a frozen one lets
			// the request time out; either way the check fails within Timeout.
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     time.Minute,
		},
		// A redirect is not readiness: the 3xx itself is judged, and fails.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// check asks u's /readyz once; nil means the apiserver answered 200.
func (u *upstream) check(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+u.addr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /readyz: %s", resp.Status)
	}
	return nil
}

// watch checks u at once and then every interval until ctx ends, recording each
// outcome. A check cut short by ctx's end is not recorded: it says nothing of u.
func (b *Balancer) watch(ctx context.Context, u *upstream) {
	tick := time.NewTicker(b.interval)
	defer tick.Stop()
	for {
		err := u.check(ctx)
		if ctx.Err() != nil {
			return
		}
		b.setHealth(u, err)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// setHealth records the outcome of a health check or a dial on u (err nil: healthy).
// When u turns unhealthy, or another upstream turns healthy, the connections spliced
// to every unhealthy upstream are closed, both sides, so that their clients reconnect
// through the balancer to a healthy one rather than wait on a failing one. While no
// upstream is healthy they are kept: there is nowhere better to send them, and a check
// that was only slow must not cut kubelet off. It logs the first outcome and each
// change, once.
func (b *Balancer) setHealth(u *upstream, err error) {
	b.mu.Lock()
	was, known := u.healthy, u.known
	u.known = true
	u.healthy = err == nil
	u.lastErr = ""
	if err != nil {
		u.lastErr = err.Error()
		if was {
			u.downs++
		}
	}
	var drop []*link
	if changed := was != u.healthy || !known; changed && b.anyHealthy() {
		for _, o := range b.ups {
			if !o.healthy {
				for l := range o.links {
					drop = append(drop, l)
				}
			}
		}
	}
	b.mu.Unlock()

	for _, l := range drop {
		l.close()
	}
	switch {
	case err != nil && was:
		b.log.Warn("apiserver upstream unhealthy", "upstream", u.addr, "error", err, "closed", len(drop))
	case err == nil && (!was || !known):
		b.log.Info("apiserver upstream healthy", "upstream", u.addr, "closed", len(drop))
	}
}

// anyHealthy reports whether some upstream is healthy; b.mu is held.
func (b *Balancer) anyHealthy() bool {
	for _, o := range b.ups {
		if o.healthy {
			return true
		}
	}
	return false
}
