package alerting

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// client bounds every request the test makes to Alertmanager.
var client = &http.Client{Timeout: 10 * time.Second}

// alert is an alert as Alertmanager's API v2 takes it and its webhook posts it.
type alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// EndsAt, when set (RFC 3339) and past, resolves the alert.
	EndsAt string `json:"endsAt,omitempty"`
}

// notification is the webhook payload, as much of it as the tests read.
type notification struct {
	Receiver    string            `json:"receiver"`
	GroupLabels map[string]string `json:"groupLabels"`
	Alerts      []alert           `json:"alerts"`
}

// webhook stands in for the pager, chat and gpuboot endpoints: it records every
// notification, and answers 500 to a group whose Hostname is in fail, counting them.
type webhook struct {
	mu       sync.Mutex
	got      []notification
	fail     map[string]bool
	failures map[string]int // receiver/Hostname
}

func (w *webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	var n notification
	if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if h := n.GroupLabels["Hostname"]; w.fail[h] {
		w.failures[n.Receiver+"/"+h]++
		http.Error(rw, "receiver down (test)", http.StatusInternalServerError)
		return
	}
	w.got = append(w.got, n)
}

func (w *webhook) setFail(hostname string, fail bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fail[hostname] = fail
}

func (w *webhook) failed(receiver, hostname string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failures[receiver+"/"+hostname]
}

// alerts returns the alerts receiver was sent ("": any receiver) whose labels
// include match.
func (w *webhook) alerts(receiver string, match map[string]string) []alert {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []alert
	for _, n := range w.got {
		if receiver != "" && n.Receiver != receiver {
			continue
		}
		for _, a := range n.Alerts {
			if hasLabels(a.Labels, match) {
				out = append(out, a)
			}
		}
	}
	return out
}

func hasLabels(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// smtpSink stands in for the site's mail relay: it accepts every message and keeps
// its recipients and raw text.
type smtpSink struct {
	addr  string
	mu    sync.Mutex
	mails []string // "RCPT1,RCPT2\n" + message
}

func newSMTPSink(t *testing.T) *smtpSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &smtpSink{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *smtpSink) serve(c net.Conn) {
	defer c.Close()
	tp := textproto.NewConn(c)
	var rcpt []string
	reply := "220 relay.test ESMTP"
	for {
		if err := tp.PrintfLine("%s", reply); err != nil {
			return
		}
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		reply = "250 ok" // EHLO, MAIL, RSET, NOOP
		switch strings.ToUpper(verb) {
		case "RCPT":
			rcpt = append(rcpt, strings.Trim(strings.TrimPrefix(strings.ToUpper(arg), "TO:"), "<>"))
		case "DATA":
			if err := tp.PrintfLine("354 end with ."); err != nil {
				return
			}
			data, err := tp.ReadDotBytes()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.mails = append(s.mails, strings.Join(rcpt, ",")+"\n"+string(data))
			s.mu.Unlock()
			rcpt, reply = nil, "250 queued"
		case "QUIT":
			_ = tp.PrintfLine("221 bye")
			return
		}
	}
}

// sent reports whether a message to rcpt has a Subject line containing subject.
func (s *smtpSink) sent(rcpt, subject string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.mails {
		to, msg, _ := strings.Cut(m, "\n")
		if !strings.Contains(","+to+",", ","+strings.ToUpper(rcpt)+",") {
			continue
		}
		for _, l := range strings.Split(msg, "\n") {
			if strings.HasPrefix(l, "Subject: ") && strings.Contains(l, subject) {
				return true
			}
		}
	}
	return false
}

// gpubootTarget is a real gpuboot admin handler for the gpuboot receiver: its webhook
// URL and the alert-sender credential Alertmanager presents to it.
type gpubootTarget struct {
	url                       string
	caFile, certFile, keyFile string
}

// testConfig is the shipped configuration with every webhook pointed at hookURL/NAME,
// the SMTP relay at the sink (which offers no STARTTLS, so require_tls is off) and the
// route tree's timings cut to seconds. The gpuboot receiver keeps its TLS settings,
// pointed at gb's files, when gb is given; without gb it too goes to hookURL, in plain
// HTTP.
func testConfig(t *testing.T, hookURL, smtpAddr string, gb *gpubootTarget) []byte {
	data, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	global := cfg["global"].(map[string]any)
	global["smtp_smarthost"], global["smtp_require_tls"] = smtpAddr, false
	shorten(cfg["route"].(map[string]any), true)
	hooks := 0
	for _, r := range cfg["receivers"].([]any) {
		r := r.(map[string]any)
		configs, _ := r["webhook_configs"].([]any)
		for _, c := range configs {
			c := c.(map[string]any)
			c["url"] = hookURL + "/" + r["name"].(string)
			hooks++
			if r["name"] == "gpuboot" {
				gpubootTLS(t, c, gb)
			}
		}
	}
	if hooks < 4 {
		t.Fatalf("%s has %d webhooks, want one per receiver", configPath, hooks)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// gpubootTLS points the shipped gpuboot webhook c at gb, with gb's credential in its
// tls_config, whose keys the shipped file must name; without gb it drops http_config
// (c then goes to the plain test hook).
func gpubootTLS(t *testing.T, c map[string]any, gb *gpubootTarget) {
	t.Helper()
	httpConfig, _ := c["http_config"].(map[string]any)
	tlsConfig, _ := httpConfig["tls_config"].(map[string]any)
	for _, k := range []string{"ca_file", "cert_file", "key_file"} {
		if v, _ := tlsConfig[k].(string); !strings.HasPrefix(v, "/etc/gpurack/") {
			t.Fatalf("%s: the gpuboot receiver's http_config.tls_config.%s is %q, want the alert-sender credential's path under /etc/gpurack/", configPath, k, v)
		}
	}
	if gb == nil {
		delete(c, "http_config")
		return
	}
	c["url"] = gb.url
	tlsConfig["ca_file"], tlsConfig["cert_file"], tlsConfig["key_file"] = gb.caFile, gb.certFile, gb.keyFile
}

// shorten sets the root's timings, and overrides any a child route sets.
func shorten(route map[string]any, root bool) {
	for k, v := range map[string]string{"group_wait": "200ms", "group_interval": "1s", "repeat_interval": "1h"} {
		if _, ok := route[k]; ok || root {
			route[k] = v
		}
	}
	children, _ := route["routes"].([]any)
	for _, c := range children {
		shorten(c.(map[string]any), false)
	}
}

// am is a real Alertmanager on loopback with the test's receivers behind it.
type am struct {
	url    string
	amtool string
	hook   *webhook
	smtp   *smtpSink
}

// startAlertmanager runs alertmanager on a loopback port of the test's choosing,
// without gossip, its state in a temporary folder, and kills it when t ends (printing
// its log if t failed). Its gpuboot receiver posts to gb, or to the test hook when gb
// is nil.
func startAlertmanager(t *testing.T, gb *gpubootTarget) *am {
	bin, amtool := tool(t, "alertmanager"), tool(t, "amtool")
	hook := &webhook{fail: map[string]bool{}, failures: map[string]int{}}
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	sink := newSMTPSink(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, testConfig(t, srv.URL, sink.addr, gb), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logFile, err := os.Create(filepath.Join(dir, "alertmanager.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the process has its own copy
	log := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=debug")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("alertmanager's log:\n%s", log())
		}
	})
	a := &am{url: "http://" + addr, amtool: amtool, hook: hook, smtp: sink}
	waitFor(t, 30*time.Second, "alertmanager to answer /-/ready", func() bool {
		select {
		case <-done:
			t.Fatalf("alertmanager exited:\n%s", log())
		default:
		}
		resp, err := client.Get(a.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return a
}

// post sends alerts to the API v2, as the metrics server would.
func (a *am) post(t *testing.T, alerts ...alert) {
	t.Helper()
	body, _ := json.Marshal(alerts)
	resp, err := client.Post(a.url+"/api/v2/alerts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /api/v2/alerts: %s: %s", resp.Status, msg)
	}
}

// status is an alert's state as the API v2 reports it.
type status struct {
	State       string   `json:"state"`
	SilencedBy  []string `json:"silencedBy"`
	InhibitedBy []string `json:"inhibitedBy"`
}

// status returns the state of the one alert whose labels are match.
func (a *am) status(t *testing.T, match map[string]string) status {
	t.Helper()
	q := url.Values{}
	for k, v := range match {
		q.Add("filter", fmt.Sprintf("%s=%q", k, v))
	}
	resp, err := client.Get(a.url + "/api/v2/alerts?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []struct {
		Status status `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || len(got) != 1 {
		t.Fatalf("GET /api/v2/alerts %v: %d alerts, %v", match, len(got), err)
	}
	return got[0].Status
}

// metric sums the samples of Alertmanager's own metric name whose labels contain
// every one of labels (`integration="webhook"`).
func (a *am) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	resp, err := client.Get(a.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	sum := 0.0
lines:
	for _, l := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		for _, want := range labels {
			if !strings.Contains(l, want) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// waitFor polls cond until it holds, failing t when timeout passes first.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
