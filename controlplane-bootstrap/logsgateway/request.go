// Package logsgateway is the log store's ingestion gateway (docs/contracts.md §15,
// decision 0694): the only way nodes write to VictoriaLogs. It verifies the client
// certificate of every request against the cluster CA (kubelet's: CN system:node:NAME,
// O system:nodes), takes only POST /insert/jsonline with the contract's query arguments,
// reads the whole body within a bound, and forwards it to VictoriaLogs on loopback with
// fixed stream fields and extra_fields=node=NAME, so that the node field is the
// certificate's whatever the body says.
//
// The decisions (who the client is, whether the query is allowed, how the upstream
// URL reads) are pure functions in this file; gateway.go does the I/O. It is not a
// general proxy: nothing but ingestion reaches the store through it, and it knows
// nothing about querying (the logs command asks VictoriaLogs on loopback directly).
package logsgateway

import (
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// The contract's query arguments (docs/contracts.md §15): the only values a node may
// send, and the ones the gateway sends VictoriaLogs whatever the node sent.
const (
	// StreamFields decide how VictoriaLogs groups lines into streams.
	StreamFields = "node,source,unit,namespace,pod,container"
	TimeField    = "_time"
	MsgField     = "_msg"
	// NodeField is the field the gateway sets from the certificate.
	NodeField = "node"
)

// InsertPath is the one path nodes may use.
const InsertPath = "/insert/jsonline"

// NodesGroup and NodeUserPrefix are kubelet's client certificate subject: O and the
// prefix of the CN (Kubernetes' Node authorizer names).
const (
	NodesGroup     = "system:nodes"
	NodeUserPrefix = "system:node:"
)

// dnsSubdomain is a Kubernetes node name (RFC 1123 subdomain, at most 253).
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ErrNotANode is a verified certificate that is not a node's.
var ErrNotANode = errors.New("not a node certificate")

// NodeName returns the node a verified client certificate names: CN
// system:node:NAME, O including system:nodes, NAME a DNS subdomain. The chain has been
// verified by the TLS handshake against the cluster CA; this only reads the subject.
func NodeName(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", fmt.Errorf("%w: no client certificate (present kubelet's, CN %sNAME, O %s)", ErrNotANode, NodeUserPrefix, NodesGroup)
	}
	cn := cert.Subject.CommonName
	name, ok := strings.CutPrefix(cn, NodeUserPrefix)
	if !ok {
		return "", fmt.Errorf("%w: CN %q is not %sNAME", ErrNotANode, cn, NodeUserPrefix)
	}
	if len(name) > 253 || !dnsSubdomain.MatchString(name) {
		return "", fmt.Errorf("%w: CN %q: %q is not a node name (a DNS subdomain)", ErrNotANode, cn, name)
	}
	if !slices.Contains(cert.Subject.Organization, NodesGroup) {
		return "", fmt.Errorf("%w: CN %q without O %s", ErrNotANode, cn, NodesGroup)
	}
	return name, nil
}

// contractArgs are the query arguments a node may send, each with its one value.
var contractArgs = map[string]string{
	"_stream_fields": StreamFields,
	"_time_field":    TimeField,
	"_msg_field":     MsgField,
}

// CheckQuery checks a request's raw query string: only the contract's arguments, each
// at most once and with the contract's value. The error names the argument, for a 400.
func CheckQuery(rawQuery string) error {
	if len(rawQuery) > 1024 {
		return fmt.Errorf("query string of %d bytes: the contract's arguments take under 100", len(rawQuery))
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return fmt.Errorf("query string: %v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		want, ok := contractArgs[k]
		if !ok {
			return fmt.Errorf("query argument %q is not accepted: send only _stream_fields=%s, _time_field=%s and _msg_field=%s (docs/contracts.md §15)", k, StreamFields, TimeField, MsgField)
		}
		if len(q[k]) != 1 {
			return fmt.Errorf("query argument %q is given %d times: give it once", k, len(q[k]))
		}
		if q[k][0] != want {
			return fmt.Errorf("query argument %s=%q: the gateway takes only %s=%s", k, q[k][0], k, want)
		}
	}
	return nil
}

// UpstreamURL is the VictoriaLogs insert URL for node's lines: base (http://HOST:PORT)
// with the contract's arguments and extra_fields=node=NODE, which VictoriaLogs stores
// in place of any node field of the body.
func UpstreamURL(base, node string) string {
	v := url.Values{}
	v.Set("_stream_fields", StreamFields)
	v.Set("_time_field", TimeField)
	v.Set("_msg_field", MsgField)
	v.Set("extra_fields", NodeField+"="+node)
	return strings.TrimSuffix(base, "/") + InsertPath + "?" + v.Encode()
}

// CheckEncoding accepts no Content-Encoding, identity or gzip (any case).
func CheckEncoding(enc string) (gzip bool, err error) {
	switch strings.ToLower(strings.TrimSpace(enc)) {
	case "", "identity":
		return false, nil
	case "gzip":
		return true, nil
	}
	return false, fmt.Errorf("Content-Encoding %q is not accepted: send gzip or no encoding", enc)
}
