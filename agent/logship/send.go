package logship

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// InsertPath is the log store's JSON-lines insert endpoint with its parameters
// (docs/monitoring.md, Logs): the stream fields, and which fields hold the time and
// the message.
const InsertPath = "/insert/jsonline?_stream_fields=node,source,unit,namespace,pod,container&_time_field=_time&_msg_field=_msg"

// record is one JSON line as the store gets it.
type record struct {
	Time      string `json:"_time"`
	Msg       string `json:"_msg"`
	Node      string `json:"node,omitempty"`
	Source    string `json:"source"`
	BootID    string `json:"boot_id,omitempty"`
	Unit      string `json:"unit,omitempty"`
	Ident     string `json:"identifier,omitempty"`
	Priority  string `json:"priority,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Stream    string `json:"stream,omitempty"`
	Truncated string `json:"truncated,omitempty"`
}

// sender POSTs batches to the store.
type sender struct {
	url          string
	client       *http.Client
	node, bootID string
}

func newSender(baseURL string, tlsConfig *tls.Config, node, bootID string) *sender {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConfig
	tr.MaxIdleConnsPerHost = 2
	return &sender{url: baseURL + InsertPath, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, node: node, bootID: bootID}
}

// errRejected marks an answer about the batch itself, which sending it again cannot
// change (400, 413, 415, 422): the batch is dropped. Other answers (401 and 403 too: a
// certificate the gateway does not take yet may be renewed) are sent again.
var errRejected = errors.New("the log store rejected the batch")

// encode writes batch as gzipped JSON lines.
func (s *sender) encode(batch []Entry) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	enc := json.NewEncoder(zw)
	enc.SetEscapeHTML(false)
	for i := range batch {
		e := &batch[i]
		r := record{Time: e.Time.UTC().Format(time.RFC3339Nano), Msg: e.Msg, Node: s.node, Source: e.Source,
			BootID: cmp.Or(e.BootID, s.bootID), Unit: e.Unit, Ident: e.Identifier, Priority: e.Priority, Namespace: e.Namespace, Pod: e.Pod,
			Container: e.Container, Stream: e.Stream}
		if e.Truncated {
			r.Truncated = "true" // every value a JSON string (docs/contracts.md §15)
		}
		if err := enc.Encode(r); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// send POSTs batch; an error wrapping errRejected means: do not send it again.
func (s *sender) send(ctx context.Context, batch []Entry) error {
	body, err := s.encode(batch)
	if err != nil {
		return fmt.Errorf("%w: encode: %v", errRejected, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/stream+json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c == http.StatusBadRequest || c == http.StatusRequestEntityTooLarge || c == http.StatusUnsupportedMediaType || c == http.StatusUnprocessableEntity:
		return fmt.Errorf("%w: %s: %s", errRejected, resp.Status, bytes.TrimSpace(msg))
	default:
		return fmt.Errorf("log store answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
}
