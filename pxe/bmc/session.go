package bmc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"
)

// session is one logged-in Redfish session with a BMC.
type session struct {
	address string
	source  string
	client  *gofish.APIClient
}

// logoutTimeout bounds the DELETE of the session, which runs even when the caller's
// context is done.
const logoutTimeout = 10 * time.Second

// open connects to ep and logs in: it reads the service root and POSTs the credentials
// to its Links.Sessions (DSP0266 "Session management"), once.
func open(ctx context.Context, ep Endpoint, opts Options) (*session, error) {
	address, err := NormalizeAddress(ep.Address)
	if err != nil {
		return nil, err
	}
	if ep.Username == "" {
		return nil, errorf(KindInvalid, nil, "BMC %s: no user name: %s", address, credentialsHint(ep.CredentialsSource))
	}
	httpClient, err := newHTTPClient(address, ep, opts.RequestTimeout)
	if err != nil {
		return nil, err
	}
	s := &session{address: address, source: ep.CredentialsSource}
	s.client, err = gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:          address,
		Username:          ep.Username,
		Password:          ep.Password,
		HTTPClient:        httpClient,
		NoModifyTransport: true,
		ReuseConnections:  true,
	})
	if err != nil {
		httpClient.CloseIdleConnections()
		return nil, s.explain(err, "logging in")
	}
	if sess, err := s.client.GetSession(); err != nil || sess.Token == "" {
		s.client.HTTPClient.CloseIdleConnections()
		return nil, errorf(KindFailed, err, "BMC %s accepted the login but returned no X-Auth-Token session; it does not implement Redfish sessions as DSP0266 asks", address)
	}
	return s, nil
}

// close deletes the session and drops the connections. It returns the DELETE's error,
// which does not change what the call did: the BMC expires an idle session itself.
func (s *session) close() error {
	defer s.client.HTTPClient.CloseIdleConnections()
	sess, err := s.client.GetSession()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), logoutTimeout)
	defer cancel()
	if _, err := s.client.WithContext(ctx).Delete(sess.ID); err != nil {
		return s.explain(err, "deleting its Redfish session "+sess.ID)
	}
	return nil
}

// NormalizeAddress checks that address is "https://host[:port]" (or http, for a lab
// emulator) and returns it without a trailing slash. It refuses a user in the URL:
// credentials are never part of an address.
func NormalizeAddress(address string) (string, error) {
	if strings.Contains(address, "@") {
		// Not echoed: what is before the @ may be a password.
		return "", errorf(KindInvalid, nil, "a BMC address holds an @: give only https://host[:port], without a user or password")
	}
	u, err := url.Parse(strings.TrimSpace(address))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", errorf(KindInvalid, err, "BMC address %q is not a URL like https://10.0.0.5 or https://bmc-r1-07:8443", address)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", errorf(KindInvalid, nil, "BMC address %q: give only https://host[:port], without a path or query (the Redfish root /redfish/v1/ is implied)", address)
	}
	return u.Scheme + "://" + u.Host, nil
}

// newHTTPClient is the client for one BMC: TLS as ep asks, and every request bounded
// by requestTimeout, connecting included.
func newHTTPClient(address string, ep Endpoint, requestTimeout time.Duration) (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: ep.Insecure} //nolint:gosec // the operator's choice for self-signed BMCs
	if len(ep.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ep.CAPEM) {
			return nil, errorf(KindInvalid, nil, "BMC %s: the CA for it holds no PEM certificate", address)
		}
		tlsConfig.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: requestTimeout}
	transport := &http.Transport{
		DialContext:           dialer.DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   requestTimeout,
		ResponseHeaderTimeout: requestTimeout,
		IdleConnTimeout:       time.Minute,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{Transport: transport, Timeout: requestTimeout}, nil
}

// credentialsHint says where to fix the credentials.
func credentialsHint(source string) string {
	if source == "" {
		source = "bmc-credentials.yaml in gpuboot's state directory"
	}
	return "check the BMC user and password in gpuboot's state (" + source + ")"
}

// explain turns an error from a request to the BMC into one that says what to fix.
func (s *session) explain(err error, doing string) error {
	e := s.classify(err, doing)
	e.located = true
	return e
}

// classify is explain's decision, by what err is.
func (s *session) classify(err error, doing string) *Error {
	var rf *schemas.Error
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case errors.As(err, &rf) && rf.HTTPReturnedStatusCode == http.StatusUnauthorized:
		return errorf(KindCredentials, err, "BMC %s refused the credentials (401): %s", s.address, credentialsHint(s.source))
	case errors.As(err, &rf) && rf.HTTPReturnedStatusCode == http.StatusForbidden:
		return errorf(KindCredentials, err, "BMC %s refused %s (403 %s): the BMC user lacks the privilege; power control needs a user with the ConfigureComponents privilege (Operator or Administrator role)", s.address, doing, redfishMessage(rf))
	case errors.As(err, &rf):
		return errorf(KindFailed, err, "BMC %s answered %d to %s: %s", s.address, rf.HTTPReturnedStatusCode, doing, redfishMessage(rf))
	case errors.As(err, &certErr), errors.As(err, &unknownAuth), errors.As(err, &hostErr):
		return errorf(KindUnreachable, err, "BMC %s: its TLS certificate is not trusted (%v): give its CA in bmc-credentials.yaml (ca), or set insecure: true for a self-signed BMC certificate", s.address, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errorf(KindTimeout, err, "BMC %s: gave up %s: %v", s.address, doing, err)
	}
	var urlErr *url.Error
	var netErr *net.OpError
	if errors.As(err, &urlErr) || errors.As(err, &netErr) {
		return errorf(KindUnreachable, err, "BMC %s is unreachable (%s: %v): check the machine's bmc address and that gpuboot's host can reach the BMC network", s.address, doing, rootCause(err))
	}
	return errorf(KindFailed, err, "BMC %s: %s: %v", s.address, doing, err)
}

// redfishMessage is the message of a Redfish error body (DSP0266 "Error responses"):
// its message and the MessageIds and messages of its @Message.ExtendedInfo.
func redfishMessage(rf *schemas.Error) string {
	parts := []string{}
	if rf.Message != "" {
		parts = append(parts, rf.Message)
	}
	for i, info := range rf.ExtendedInfos {
		if i == 0 && len(parts) == 1 && info.Message == rf.Message {
			parts = parts[:0] // the same message again, with its MessageId
		}
		switch {
		case info.Message != "" && info.MessageID != "":
			parts = append(parts, fmt.Sprintf("%s (%s)", info.Message, info.MessageID))
		case info.Message != "":
			parts = append(parts, info.Message)
		case info.MessageID != "":
			parts = append(parts, info.MessageID)
		}
	}
	if len(parts) == 0 {
		return "no error message"
	}
	return strings.Join(parts, "; ")
}

// rootCause is the innermost error of a url.Error chain ("connection refused"), which
// says more than the request URL it is wrapped in.
func rootCause(err error) error {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return urlErr.Err
	}
	return err
}
