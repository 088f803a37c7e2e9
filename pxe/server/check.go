package server

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/tftp"
)

// Level is how a Finding of `gpuboot config check` counts.
type Level string

// The levels: an error is something `gpuboot serve` refuses or that stops machines
// from booting or enrolling; a warning is what serve logs at Warning when it starts.
const (
	LevelOK      Level = "ok"
	LevelWarning Level = "warning"
	LevelError   Level = "error"
)

// Finding is one line of `gpuboot config check`: what was checked, how it went, and
// what to fix.
type Finding struct {
	Level Level `json:"level"`
	// Check names the part: config, pki, inventory, allowlist, policy, gossip,
	// cluster, images, image, rack, bmc, tokens, dhcp, tftp or enrollment.
	Check   string `json:"check"`
	Message string `json:"message"`
}

// certWarnBefore is how long before a certificate expires the check warns.
const certWarnBefore = 30 * 24 * time.Hour

// Check does with cfg what `gpuboot serve` does when it starts, short of opening the
// inventory (serve holds its lock), writing anything, contacting the cluster or
// binding a port, and returns one Finding per check: the state directory's
// certificates, every allowlist file (rows counted per file) and their merge, the EK
// roots, every rack's gossip key, the enroller kubeconfig, every image a selector or
// rack names (present in the store and verified against images.trustedKeys, as
// serve verifies it before serving it), racks no image reaches, the BMC credentials,
// the operator tokens, the DHCP interfaces, the TFTP directory and every warning
// serve logs at start. It does the start steps through serve's own functions where
// they have no side effect, with a logger that turns their warnings and errors into
// findings.
func Check(cfg *config.Config) []Finding {
	c := &checker{cfg: cfg}
	c.pki()
	c.inventory()
	pol := c.policy()
	c.gossipKeys()
	c.cluster()
	c.images()
	c.racks()
	c.bmc(pol)
	c.tokens()
	c.metricsServer()
	c.network()
	for _, w := range enroll.StartWarnings(enroll.Config{Policy: pol,
		Identity: enroll.IdentityMode(cfg.Enrollment.Identity), Reenroll: enroll.Reenroll(cfg.Enrollment.Reenroll)}) {
		c.add(LevelWarning, "enrollment", "%s", w)
	}
	return c.out
}

// checker collects findings.
type checker struct {
	cfg *config.Config
	out []Finding
}

func (c *checker) add(level Level, check, format string, args ...any) {
	c.out = append(c.out, Finding{Level: level, Check: check, Message: fmt.Sprintf(format, args...)})
}

// log is a logger that records what serve's start functions log at Warning and Error
// as findings of check.
func (c *checker) log(check string) *slog.Logger {
	return slog.New(&findingHandler{c: c, check: check})
}

// pki loads the CA, the server certificate and the revocation list as serve does, and
// says when a certificate expires soon or does not name advertise.
func (c *checker) pki() {
	g := &gpuboot{cfg: c.cfg, log: c.log("pki")}
	if _, err := g.startPKI(context.Background()); err != nil {
		c.add(LevelError, "pki", "%v", err)
		return
	}
	now, bad := time.Now(), false
	for _, kp := range []struct {
		what  string
		until time.Time
	}{{"the gpurack CA", g.ca.Cert.NotAfter}, {"the server certificate " + c.cfg.ServerCertPath(), g.serverKP.Cert.NotAfter}} {
		switch left := kp.until.Sub(now); {
		case left <= 0:
			c.add(LevelError, "pki", "%s expired on %s: nothing can connect to gpuboot over TLS until it is renewed (gpuboot certs server --advertise … for the server certificate)", kp.what, kp.until.UTC().Format(time.RFC3339))
			bad = true
		case left < certWarnBefore:
			c.add(LevelWarning, "pki", "%s expires on %s, in %d days: renew it (gpuboot certs check-expiration lists them all)", kp.what, kp.until.UTC().Format(time.RFC3339), int(left.Hours()/24))
		}
	}
	if _, err := netip.ParseAddr(c.cfg.Advertise); err != nil && g.serverKP.Cert.VerifyHostname(c.cfg.Advertise) != nil {
		c.add(LevelError, "pki", "the server certificate %s does not name advertise %q (it names %s): agents dial that name and refuse the certificate; reissue it with gpuboot certs server --advertise %s,…",
			c.cfg.ServerCertPath(), c.cfg.Advertise, strings.Join(g.serverKP.Cert.DNSNames, ", "), c.cfg.Advertise)
		bad = true
	}
	if !bad {
		c.add(LevelOK, "pki", "CA %s, server certificate valid until %s, %d revoked certificates", g.ca.Pin(),
			g.serverKP.Cert.NotAfter.UTC().Format("2006-01-02"), g.revoked.Len())
	}
}

// inventory says whether inventory.db exists; it is not opened, since a running
// gpuboot serve holds its lock.
func (c *checker) inventory() {
	p := c.cfg.InventoryPath()
	switch _, err := os.Stat(p); {
	case err == nil:
		c.add(LevelOK, "inventory", "%s present (not opened: gpuboot serve holds it)", p)
	case errors.Is(err, fs.ErrNotExist):
		c.add(LevelOK, "inventory", "%s does not exist yet: gpuboot serve creates it", p)
	default:
		c.add(LevelError, "inventory", "%v", err)
	}
}

// policy parses every allowlist file on its own (rows counted per file), merges them,
// and runs serve's policy start (EK roots, the policy's warnings). It returns the
// policy serve would run with (without the list when the list does not load).
func (c *checker) policy() policy.Policy {
	var lists []*policy.List
	failed := false
	for _, p := range c.cfg.Policy.Allowlist {
		l, err := policy.LoadList(p)
		if err != nil {
			c.add(LevelError, "allowlist", "%v", err)
			failed = true
			continue
		}
		lists = append(lists, l)
		c.add(LevelOK, "allowlist", "%s: %d rows", p, len(l.Entries))
	}
	if !failed && len(lists) > 1 {
		if _, err := policy.MergeLists(lists...); err != nil {
			for _, e := range strings.Split(err.Error(), "\n") {
				c.add(LevelError, "allowlist", "%s", e)
			}
			failed = true
		} else {
			c.add(LevelOK, "allowlist", "%d files merged: no serial, MAC or EK in two of them", len(lists))
		}
	}
	cfg := *c.cfg
	if failed {
		cfg.Policy.Allowlist = nil // reported above; the rest of the policy is still checked
	}
	g := &gpuboot{cfg: &cfg, log: c.log("policy")}
	if _, err := g.startPolicy(context.Background()); err != nil {
		c.add(LevelError, "policy", "%v", err)
		return g.policy
	}
	if err := g.policy.Validate(); err != nil && !failed {
		c.add(LevelError, "policy", "%v", err)
	}
	if g.ekRoots != nil {
		c.add(LevelOK, "policy", "enrollment.ekRoots: %d certificates", len(g.ekRoots.Roots()))
	}
	c.add(LevelOK, "policy", "approval %s, identity %s, reenroll %s", g.policy.Mode, c.cfg.Enrollment.Identity, c.cfg.Enrollment.Reenroll)
	return g.policy
}

// gossipKeys reads each rack's gossip key ring as serve does, without creating a
// missing one (serve creates it at start).
func (c *checker) gossipKeys() {
	for _, r := range c.cfg.Racks {
		p := filepath.Join(c.cfg.GossipDir(), r.Name+".key")
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			c.add(LevelOK, "gossip", "rack %s: no key yet (%s): gpuboot serve creates it at start", r.Name, p)
		case err != nil:
			c.add(LevelError, "gossip", "rack %s: %v", r.Name, err)
		default:
			if _, err := enroll.ParseGossipRing(b); err != nil {
				c.add(LevelError, "gossip", "rack %s: %s: %v: fix or remove the file (a removed key is made anew, and the rack's agents then need their next JoinBundle)", r.Name, p, err)
			} else {
				c.add(LevelOK, "gossip", "rack %s: key ring %s", r.Name, p)
			}
		}
	}
}

// cluster loads the enroller kubeconfig; the API server is not contacted.
func (c *checker) cluster() {
	cc := c.cfg.Cluster
	if cc.Kubeconfig == "" {
		g := &gpuboot{cfg: c.cfg, log: c.log("cluster")}
		g.startCluster(context.Background()) // only warns without a kubeconfig
		return
	}
	cl, err := nodecontrol.Load(cc.Kubeconfig)
	if err != nil {
		c.add(LevelError, "cluster", "cluster.kubeconfig: %v", err)
		return
	}
	c.add(LevelOK, "cluster", "cluster.kubeconfig %s loaded (API server %s, not contacted)", cc.Kubeconfig, cl.Endpoint())
	if cc.ClearAfter != 0 {
		c.add(LevelWarning, "cluster", "cluster.clearAfter is ignored: the taint follows GPUHealthy and the agent's --clear-after is the only hysteresis (decision 0205); remove it from the configuration")
	}
}

// imageUse is where an image id is named: selectors and racks.
type imageUse struct {
	id    string
	users []string
}

// imagesNamed lists the images selectors and racks' defaultImage name, in the order
// they appear, each with what names it.
func imagesNamed(cfg *config.Config) []imageUse {
	var out []imageUse
	add := func(id, user string) {
		for i := range out {
			if out[i].id == id {
				out[i].users = append(out[i].users, user)
				return
			}
		}
		out = append(out, imageUse{id: id, users: []string{user}})
	}
	for _, s := range cfg.Selectors {
		add(s.Image, fmt.Sprintf("selector %q", s.Name))
	}
	for _, r := range cfg.Racks {
		if r.DefaultImage != "" {
			add(r.DefaultImage, fmt.Sprintf("rack %s defaultImage", r.Name))
		}
	}
	return out
}

// images loads images.trustedKeys as serve does and verifies every image a selector or
// rack names as serve does before it serves one: in the store, its manifest signed by
// a trusted key, every artifact matching it.
func (c *checker) images() {
	keys, err := manifest.LoadPublicKeys(c.cfg.Images.TrustedKeys...)
	if err != nil {
		c.add(LevelError, "images", "images.trustedKeys: %v", err)
	} else {
		ids := make([]string, len(keys))
		for i, k := range keys {
			ids[i] = manifest.KeyID(k)
		}
		c.add(LevelOK, "images", "images.trustedKeys: %s", strings.Join(ids, ", "))
	}
	if fi, err := os.Stat(c.cfg.Images.Store); err != nil || !fi.IsDir() {
		c.add(LevelError, "images", "images.store %s is not a directory: create it and copy images into it (gpuimage build's output directories)", c.cfg.Images.Store)
		return
	}
	for _, u := range imagesNamed(c.cfg) {
		c.image(u, keys, err == nil)
	}
}

// image checks one image; keysOK is false when the trusted keys did not load (the
// image is then only looked for).
func (c *checker) image(u imageUse, keys []ed25519.PublicKey, keysOK bool) {
	who := strings.Join(u.users, ", ")
	dir := filepath.Join(c.cfg.Images.Store, u.id)
	if _, err := os.Stat(dir); err != nil {
		c.add(LevelError, "image", "%s (%s) is not in the image store %s: copy it there, or name an image that is", u.id, who, c.cfg.Images.Store)
		return
	}
	if !keysOK {
		c.add(LevelError, "image", "%s (%s) not verified: images.trustedKeys did not load", u.id, who)
		return
	}
	m, err := manifest.VerifyDir(dir, keys)
	if err != nil {
		c.add(LevelError, "image", "%s (%s) does not verify, so gpuboot serves none of it: %v", u.id, who, err)
		return
	}
	c.add(LevelOK, "image", "%s (%s): profile %s, signature and %d artifacts verified", u.id, who, m.Profile, len(m.Artifacts))
}

// racks warns of a rack whose machines no image reaches: no defaultImage, and no
// selector that can match it (one without a rack term, or with its name).
func (c *checker) racks() {
	for _, r := range c.cfg.Racks {
		if r.DefaultImage != "" {
			continue
		}
		reached := slices.ContainsFunc(c.cfg.Selectors, func(s policy.Selector) bool {
			rack, named := s.Match[policy.LabelRack]
			return !named || rack == r.Name
		})
		if !reached {
			c.add(LevelWarning, "rack", "rack %s has no defaultImage and no selector matches its machines: they boot nothing and wait; set racks[].defaultImage (an image id from gpuimage build) or add a selector with match: {rack: %s}", r.Name, r.Name)
		}
	}
}

// bmc loads STATEDIR/bmc-credentials.yaml as serve does, and warns of manifest rows
// that name a BMC no account covers.
func (c *checker) bmc(pol policy.Policy) {
	access := loadBMCAccess(c.cfg.StateDir, c.log("bmc"))
	if access.Unavailable != nil {
		return // logged at Error by loadBMCAccess
	}
	path := filepath.Join(c.cfg.StateDir, bmc.CredentialsFile)
	missing := "has no account for rack %[1]s and no default: `gpuboot machines power` fails for them until you add one"
	if access.Credentials != nil {
		c.add(LevelOK, "bmc", "%s loaded", path)
	} else {
		c.add(LevelOK, "bmc", "%s does not exist: power control through BMCs is off", path)
		missing = "does not exist: `gpuboot machines power` fails for them until you create it (mode 0600) with a default account or one for rack %[1]s"
	}
	if pol.List == nil {
		return
	}
	uncovered := map[string]int{} // rack → rows
	var racks []string
	for _, e := range pol.List.Entries {
		if e.BMC == "" {
			continue
		}
		rack := e.Rack
		if rack == "" {
			rack = c.cfg.DefaultRack
		}
		if _, err := access.Credentials.Endpoint(e.BMC, rack); err != nil {
			if uncovered[rack] == 0 {
				racks = append(racks, rack)
			}
			uncovered[rack]++
		}
	}
	for _, r := range racks {
		c.add(LevelWarning, "bmc", "%d manifest rows of rack %s name a BMC, but %s %s", uncovered[r], r, path, fmt.Sprintf(missing, r))
	}
}

// tokens loads the operator tokens file as serve does.
func (c *checker) tokens() {
	if t := mustTokens(c.cfg, c.log("tokens")); t != nil {
		c.add(LevelOK, "tokens", "operator tokens file %s readable", c.cfg.Admin.TokensFile)
	}
}

// metricsServer says whether the graphs page has a metrics server, and whether it
// answers /-/ready from here (a warning when not: the page then says why).
func (c *checker) metricsServer() {
	u := c.cfg.Metrics.PrometheusURL
	if u == "" {
		c.add(LevelOK, "metrics", "metrics.prometheusURL is empty: the graphs page (/graphs) says the metrics server is not configured")
		return
	}
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(strings.TrimSuffix(u, "/") + "/-/ready")
	if err != nil {
		c.add(LevelWarning, "metrics", "metrics server %s: %v: the graphs page will say it is unreachable", u, err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.add(LevelWarning, "metrics", "metrics server %s: /-/ready answered HTTP %d: is it a Prometheus, and ready?", u, resp.StatusCode)
		return
	}
	c.add(LevelOK, "metrics", "metrics server %s ready: the graphs page (/graphs) draws from it", u)
}

// network checks the DHCP interfaces and the TFTP directory as serve does before it
// binds its ports (ports are not bound).
func (c *checker) network() {
	cfg := c.cfg
	ipxeDir := ""
	if cfg.TFTPEnabled() {
		ipxeDir = tftpDir(cfg)
		if ts, err := tftp.New(tftp.Config{Dir: ipxeDir, SinglePort: cfg.TFTP.SinglePort}, nil, c.log("tftp")); err != nil {
			c.add(LevelError, "tftp", "%v", err)
		} else {
			c.add(LevelOK, "tftp", "%s: %d files to serve (%s)", ipxeDir, len(ts.Files()), strings.Join(ts.Files(), ", "))
		}
	}
	if !cfg.DHCPEnabled() {
		return
	}
	_, httpPort, _ := net.SplitHostPort(cfg.Listen.HTTP)
	scriptURL := "http://" + net.JoinHostPort(cfg.Advertise, httpPort) + "/boot.ipxe"
	for _, in := range cfg.Interfaces {
		if _, err := net.InterfaceByName(in.Name); err != nil {
			c.add(LevelError, "dhcp", "interface %s: %v: name an interface of this host (run the check on gpuboot's host)", in.Name, err)
			continue
		}
		dc, err := dhcpConfig(cfg, in.Name, scriptURL, ipxeDir != "")
		if err != nil {
			c.add(LevelError, "dhcp", "%v", err)
			continue
		}
		c.add(LevelOK, "dhcp", "%s mode on %s, answering as %s", dc.Mode, in.Name, dc.ServerIP)
	}
}

// findingHandler is a slog.Handler that records Warning and Error records as
// findings: "message (key=value, …)".
type findingHandler struct {
	c     *checker
	check string
	attrs []slog.Attr
}

func (h *findingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *findingHandler) Handle(_ context.Context, r slog.Record) error {
	level := LevelWarning
	if r.Level >= slog.LevelError {
		level = LevelError
	}
	var kv []string
	for _, a := range h.attrs {
		kv = append(kv, a.String())
	}
	r.Attrs(func(a slog.Attr) bool { kv = append(kv, a.String()); return true })
	msg := r.Message
	if len(kv) > 0 {
		msg += " (" + strings.Join(kv, ", ") + ")"
	}
	h.c.add(level, h.check, "%s", msg)
	return nil
}

func (h *findingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &findingHandler{c: h.c, check: h.check, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *findingHandler) WithGroup(string) slog.Handler { return h }
