// Command probe is the small workload the node tests run from a preloaded image
// (make probe-image packs it with hack/imagearchive, no registry involved). It is a
// static binary that answers HTTP and resolves names through the pod's DNS, so one
// pod shows that the node runs preloaded images, that cluster DNS answers and that
// Services route.
//
//	probe [serve] [-listen :8080]   HTTP: /, /healthz, /resolve?name=N, /devices (probe
//	                                devices' list), /fetch?url=U (over a new connection;
//	                                the answer has the status and connectMicros)
//	probe resolve NAME [WANT]       print NAME's addresses; exit 1 if it does not resolve
//	                                (or, with WANT, if WANT is not among them)
//	probe fetch [--patience D] URL...
//	                                GET each URL, print URL, status and the TCP connect
//	                                time (the first packet's round trip); exit 1 on no
//	                                answer. With --patience, a URL that does not answer
//	                                is tried again over a new connection until D has
//	                                passed since the probe started, and its line says
//	                                how many tries it took. The lines also go to the
//	                                pod's termination message (/dev/termination-log),
//	                                for a test to read.
//	probe restart UNIT...           restart the host's systemd units through the system
//	                                bus (a pod that mounts the host's /run/dbus, as
//	                                root), each waited for; exit 1 if one fails
//	probe hold URL DURATION [EVERY] GET URL every EVERY (default 2s) for DURATION over
//	                                one connection; exit 1 at the first request that
//	                                fails, saying what ended the connection (reset,
//	                                closed, timed out). The summary goes to the
//	                                termination message.
//	probe chroot DIR CMD [ARG...]   run CMD with DIR as the root directory (a privileged
//	                                pod with the host's / mounted at DIR: the node's own
//	                                tools, for a test's diagnostics)
//	probe cat FILE                  print FILE (at most 4 KiB, the termination message's
//	                                bound) and leave it as the termination message: a
//	                                host-network pod reads the node's /proc/net this way
//	probe flip HOST:PORT NS POLICY [N]
//	                                N times (default 5): delete NetworkPolicy NS/POLICY
//	                                through the apiserver (as the pod's service account)
//	                                and connect to HOST:PORT until a connection passes,
//	                                then create it again and connect until one is
//	                                dropped; report each time. Also the termination message.
//	probe mem COMM                  the memory of the processes named COMM (in a pod
//	                                with the host's PID namespace, privileged: the
//	                                node's): VmRSS, VmHWM, RssAnon, RssFile and RSS by
//	                                mapping from /proc/PID/smaps. Also the termination
//	                                message.
//	probe write FILE MIB            write MIB MiB of random data and FILE.sha256 (volume.go)
//	probe verify FILE               check FILE against FILE.sha256 (volume.go)
//	probe bench A B RUNS MIB        O_DIRECT sequential write and read in A and B,
//	                                alternating, RUNS each; medians and A/B (volume.go)
//	probe devices [HOLD]            list the container's /dev/nvidia* nodes (type and
//	                                major:minor) and its NVIDIA_ and GPURACK_ variables:
//	                                what it got of GPUs. Also the termination message.
//	                                Then stay up for HOLD (default 0), holding them.
//	probe train DIR EPOCHS [EPOCH_TIME]
//	                                logistic regression on a fixed synthetic dataset,
//	                                on the CPU (it says so, and that CUDA is
//	                                unavailable), a checkpoint in DIR after every epoch
//	                                (written, synced, renamed), going on from DIR's
//	                                checkpoint when there is one; each epoch padded with
//	                                sleep to EPOCH_TIME (train.go)
//
// fetch trusts the pod's service-account CA for https (the apiserver through the
// kubernetes Service) when the pod has one.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"golang.org/x/sys/unix"
)

// serviceAccountCA is where kubelet mounts the cluster CA into a pod.
const serviceAccountCA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

func main() {
	if err := run(os.Args[1:], os.Stdout, "/dev/termination-log"); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

// run carries out one command line (without the program name); termLog is where
// the commands that report a result also leave it as the termination message.
func run(args []string, stdout io.Writer, termLog string) error {
	name := "serve"
	if len(args) > 0 {
		if _, ok := commands[args[0]]; ok {
			name, args = args[0], args[1:]
		}
	}
	return commands[name](args, stdout, termLog)
}

// command is one of probe's commands: its arguments after the command's name, where
// it prints, and the termination message's file.
type command func(args []string, stdout io.Writer, termLog string) error

// commands is probe's command table; a command line that names none of them serves.
var commands = map[string]command{
	"serve":   serveCommand,
	"resolve": resolveCommand,
	"fetch":   fetchCommand,
	"hold":    holdCommand,
	"restart": restartCommand,
	"chroot":  chrootCommand,
	"devices": devicesCommand,
	"flip":    flipCommand,
	"cat":     catCommand,
	"mem":     memCommand,
	"write":   writeCommand,
	"verify":  verifyCommand,
	"bench":   benchCommand,
	"train":   trainCommand,
	"predict": predictCommand,
}

func resolveCommand(args []string, stdout io.Writer, _ string) error {
	if len(args) != 1 && len(args) != 2 {
		return errors.New("usage: probe resolve NAME [WANT]")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := resolve(ctx, args[0])
	if err != nil {
		return err
	}
	for _, a := range addrs {
		fmt.Fprintln(stdout, a)
	}
	if len(args) == 2 && !slices.Contains(addrs, args[1]) {
		return fmt.Errorf("%s resolves to %v, not %s", args[0], addrs, args[1])
	}
	return nil
}

func restartCommand(args []string, stdout io.Writer, _ string) error {
	if len(args) == 0 {
		return errors.New("usage: probe restart UNIT [UNIT]")
	}
	// A unit such as gpuagent (Type=notify) is done once it says it is ready,
	// which on an emulated machine takes longer than the other commands' limit.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return restartUnits(ctx, args, stdout)
}

func fetchCommand(args []string, stdout io.Writer, termLog string) error {
	usage := errors.New("usage: probe fetch [--patience DURATION] URL [URL]")
	var patience time.Duration
	if len(args) > 0 && args[0] == "--patience" {
		if len(args) < 2 {
			return usage
		}
		d, err := time.ParseDuration(args[1])
		if err != nil || d <= 0 {
			return fmt.Errorf("probe fetch: --patience %q: want a duration such as 90s", args[1])
		}
		patience, args = d, args[2:]
	}
	if len(args) == 0 {
		return usage
	}
	until := time.Now().Add(patience)
	// Every URL is tried, each with its own limit, so that one failure still
	// says how the others went.
	var out strings.Builder
	failed := 0
	for _, u := range args {
		status, connect, tries, err := fetchPatiently(u, until)
		if err != nil {
			failed++
			fmt.Fprintf(&out, "%s error: %v%s\n", u, err, triesNote(tries))
			continue
		}
		fmt.Fprintf(&out, "%s %s%s connect=%s\n", u, status, triesNote(tries), connect)
	}
	report(stdout, termLog, out.String())
	if failed > 0 {
		return fmt.Errorf("%d of %d URLs did not answer", failed, len(args))
	}
	return nil
}

// fetchPatiently fetches u over a new connection (each try pays its own connect),
// each try limited to 10 s, trying again until one answers or until has passed. It
// returns the answer of the last try and how many there were.
func fetchPatiently(u string, until time.Time) (status string, connect time.Duration, tries int, err error) {
	if _, err := httpURL(u); err != nil {
		return "", 0, 1, err // no try can answer
	}
	for {
		tries++
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		status, connect, err = fetchTimed(ctx, newClient(serviceAccountCA), u)
		cancel()
		if err == nil || !time.Now().Before(until) {
			return status, connect, tries, err
		}
		time.Sleep(time.Second)
	}
}

// triesNote is what a fetch line says of its tries: nothing for one.
func triesNote(tries int) string {
	if tries <= 1 {
		return ""
	}
	return fmt.Sprintf(" (after %d tries)", tries)
}

func holdCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 2 && len(args) != 3 {
		return errors.New("usage: probe hold URL DURATION [EVERY]")
	}
	d, err := time.ParseDuration(args[1])
	every := 2 * time.Second
	if err == nil && len(args) == 3 {
		every, err = time.ParseDuration(args[2])
	}
	if err != nil || d <= 0 || every <= 0 {
		return fmt.Errorf("probe hold: DURATION and EVERY are durations such as 3m and 2s: %v", args[1:])
	}
	summary, err := hold(serviceAccountCA, args[0], d, every)
	report(stdout, termLog, summary+"\n")
	return err
}

func flipCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 3 && len(args) != 4 {
		return errors.New("usage: probe flip HOST:PORT NAMESPACE POLICY [N]")
	}
	n := 5
	if len(args) == 4 {
		var err error
		if n, err = strconv.Atoi(args[3]); err != nil || n < 1 || n > 100 {
			return fmt.Errorf("probe flip: N %q: want a count from 1 to 100", args[3])
		}
	}
	api, err := inClusterAPI()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	text, err := flip(ctx, api, args[0], args[1], args[2], n)
	report(stdout, termLog, text)
	return err
}

func devicesCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) > 1 {
		return errors.New("usage: probe devices [HOLD]")
	}
	var hold time.Duration
	if len(args) == 1 {
		d, err := time.ParseDuration(args[0])
		if err != nil || d < 0 {
			return fmt.Errorf("probe devices: HOLD %q is not a duration like 30s", args[0])
		}
		hold = d
	}
	text, err := devices("/dev", os.Environ())
	if err != nil {
		return err
	}
	report(stdout, termLog, text)
	time.Sleep(hold) // the container keeps its devices that long
	return nil
}

// termLogMax is the most a termination message holds (kubelet cuts it there).
const termLogMax = 4096

func catCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 1 {
		return errors.New("usage: probe cat FILE")
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	if len(b) > termLogMax {
		return fmt.Errorf("%s: %d bytes, more than the termination message's %d", args[0], len(b), termLogMax)
	}
	report(stdout, termLog, string(b))
	return nil
}

func chrootCommand(args []string, _ io.Writer, _ string) error {
	if len(args) < 2 {
		return errors.New("usage: probe chroot DIR CMD [ARG...]")
	}
	return chrootExec(args[0], args[1:])
}

func serveCommand(args []string, _ io.Writer, _ string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address to serve HTTP on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srv := &http.Server{Addr: *listen, Handler: newHandler(hostname(), newClient(serviceAccountCA)), ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

// report prints text and leaves it as the termination message at termLog, which is
// how a test reads a result without pod logs.
func report(stdout io.Writer, termLog, text string) {
	fmt.Fprint(stdout, text)
	if err := os.WriteFile(termLog, []byte(text), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "probe: termination message:", err)
	}
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}

// maxName bounds a name to resolve (RFC 1035 §2.3.4: 255 octets).
const maxName = 255

// resolve returns name's addresses, sorted, with the resolver the pod is given
// (/etc/resolv.conf, which kubelet points at cluster DNS).
func resolve(ctx context.Context, name string) ([]string, error) {
	if name == "" || len(name) > maxName {
		return nil, fmt.Errorf("name %q: want a DNS name of 1 to %d characters", name, maxName)
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return nil, err
	}
	sort.Strings(addrs)
	return addrs, nil
}

// newClient is an HTTP client that also trusts the CA at caFile when it exists.
func newClient(caFile string) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConfig(caFile)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// tlsConfig trusts the system's CAs and also the one at caFile when it exists.
func tlsConfig(caFile string) *tls.Config {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if pem, err := os.ReadFile(caFile); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// fetch GETs u and returns the response's status line ("200 OK"); any answer is a
// success, since reaching the server is what is probed.
func fetch(ctx context.Context, c *http.Client, u string) (string, error) {
	status, _, err := fetchTimed(ctx, c, u)
	return status, err
}

// fetchTimed is fetch that also says how long the TCP connect took: SYN to SYN-ACK,
// the first packet's round trip (through kube-proxy's DNAT for a ClusterIP).
func fetchTimed(ctx context.Context, c *http.Client, u string) (string, time.Duration, error) {
	var connectStart time.Time
	var connect time.Duration
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(string, string) { connectStart = time.Now() },
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				connect = time.Since(connectStart)
			}
		},
	})
	if _, err := httpURL(u); err != nil {
		return "", 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.Status, connect, nil
}

// httpURL parses u, which must be an http or https URL with a host.
func httpURL(u string) (*url.URL, error) {
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return nil, fmt.Errorf("url %q: want an http or https URL", u)
	}
	return pu, nil
}

// hold GETs u every interval for d over one connection it dials itself (for https,
// trusting caFile too), and fails at the first request that errs: with no transport
// in between to retry quietly on a new connection, the error says what ended the
// held one (a reset, the peer's close, a timeout). It returns a summary either way.
func hold(caFile, u string, d, every time.Duration) (string, error) {
	pu, err := httpURL(u)
	if err != nil {
		return fmt.Sprintf("hold %s: not an http or https URL", u), err
	}
	addr := pu.Host
	if pu.Port() == "" {
		addr = net.JoinHostPort(pu.Hostname(), map[string]string{"http": "80", "https": "443"}[pu.Scheme])
	}
	start := time.Now()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return fmt.Sprintf("hold %s: no connection", u), err
	}
	defer conn.Close()
	name := conn.LocalAddr().String() + "->" + conn.RemoteAddr().String()
	if pu.Scheme == "https" {
		c := tlsConfig(caFile)
		c.ServerName = pu.Hostname()
		conn = tls.Client(conn, c)
	}
	br := bufio.NewReader(conn)
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return fmt.Sprintf("hold %s: bad request", u), err
	}
	n := 0
	for ; n == 0 || time.Since(start) < d; n++ {
		if n > 0 {
			time.Sleep(every)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		err := req.Write(conn)
		if err == nil {
			var resp *http.Response
			if resp, err = http.ReadResponse(br, req); err == nil {
				_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
			}
		}
		if err != nil {
			at := time.Since(start).Round(time.Millisecond)
			return fmt.Sprintf("hold %s: request %d at %s failed after %d over the connection %s: %v", u, n+1, at, n, name, err),
				fmt.Errorf("the connection held for %s ended: %w", at, err)
		}
	}
	return fmt.Sprintf("hold %s: %d requests over one connection (%s) for %s", u, n, name, time.Since(start).Round(time.Millisecond)), nil
}

// newHandler serves the probe's HTTP endpoints; every answer is JSON but /.
func newHandler(host string, client *http.Client) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "probe on %s\n", host)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /resolve", func(w http.ResponseWriter, r *http.Request) {
		addrs, err := resolve(r.Context(), r.URL.Query().Get("name"))
		reply(w, map[string]any{"name": r.URL.Query().Get("name"), "addresses": addrs}, err)
	})
	// /fetch opens a new connection each time: its first packet is what a
	// NetworkPolicy judges, and connectMicros is that packet's round trip.
	fresh := &http.Client{Timeout: client.Timeout, Transport: client.Transport}
	if tr, ok := client.Transport.(*http.Transport); ok {
		tr = tr.Clone()
		tr.DisableKeepAlives = true
		fresh.Transport = tr
	}
	mux.HandleFunc("GET /fetch", func(w http.ResponseWriter, r *http.Request) {
		status, connect, err := fetchTimed(r.Context(), fresh, r.URL.Query().Get("url"))
		reply(w, map[string]any{"url": r.URL.Query().Get("url"), "status": status, "connectMicros": connect.Microseconds()}, err)
	})
	mux.HandleFunc("GET /devices", func(w http.ResponseWriter, r *http.Request) {
		text, err := devices("/dev", os.Environ())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, text)
	})
	return mux
}

// reply writes v as JSON, or the error with 502 (the probe's target failed).
func reply(w http.ResponseWriter, v map[string]any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		v = map[string]any{"error": err.Error()}
	}
	json.NewEncoder(w).Encode(v)
}

// restartUnits restarts each unit through systemd's D-Bus API and waits for the job.
func restartUnits(ctx context.Context, units []string, stdout io.Writer) error {
	conn, err := sdbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("system bus (mount the host's /run/dbus and run as root): %w", err)
	}
	defer conn.Close()
	for _, u := range units {
		done := make(chan string, 1)
		start := time.Now()
		if _, err := conn.RestartUnitContext(ctx, u, "replace", done); err != nil {
			return fmt.Errorf("restart %s: %w", u, err)
		}
		select {
		case r := <-done:
			if r != "done" {
				return fmt.Errorf("restart %s: job %s", u, r)
			}
		case <-ctx.Done():
			return fmt.Errorf("restart %s: %w", u, ctx.Err())
		}
		fmt.Fprintf(stdout, "restarted %s in %s\n", u, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// chrootExec replaces the probe with argv run inside root.
func chrootExec(root string, argv []string) error {
	if err := syscall.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, argv, os.Environ())
}

// devices lists what a container got of GPUs: each device node in dir whose name
// starts with nvidia, as "PATH c MAJOR:MINOR" (or the file type), then the NVIDIA_ and
// GPURACK_ variables of env, sorted.
func devices(dir string, env []string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var lines []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "nvidia") {
			continue
		}
		p := dir + "/" + e.Name()
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return "", err
		}
		kind := e.Type().String()
		if st.Mode&syscall.S_IFMT == syscall.S_IFCHR {
			kind = fmt.Sprintf("c %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		lines = append(lines, p+" "+kind)
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "NVIDIA_") || strings.HasPrefix(kv, "GPURACK_") {
			lines = append(lines, kv)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n", nil
}
