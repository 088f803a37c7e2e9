package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/pki"
)

// Several control-plane hosts (issue 31; docs/ha.md; decision 0703): `upload-certs` on a
// host of the cluster seals the shared roots (clusterpki.SharedRoots) into a Secret that
// a bootstrap token may read; `join --control-plane` on a new host discovers the
// cluster with that token and the CA pin, opens the Secret with the certificate key,
// adds its etcd member as a learner and starts the control plane, promoting the member
// once it has caught up.
const (
	// ControlPlaneCertsSecret is the kube-system Secret upload-certs writes.
	ControlPlaneCertsSecret = "gpurack-control-plane-certs"
	// ControlPlaneJoinGroup is the bootstrap token group that may read it.
	ControlPlaneJoinGroup = "system:bootstrappers:gpurack:control-plane"
	// controlPlaneCertsRole is the kube-system Role (and RoleBinding) that lets it.
	controlPlaneCertsRole = "gpurack:control-plane-certs"
	// etcdEndpointsAnnotation lists the members' client URLs on the Secret, for the
	// joining host's etcd client.
	etcdEndpointsAnnotation = "gpurack.io/etcd-endpoints"
	// UploadCertsTTL is how long the token and the Secret live (kubeadm's two hours).
	UploadCertsTTL = 2 * time.Hour
	// promoteTimeout bounds the wait for a learner to catch up and be promoted.
	promoteTimeout = 3 * time.Minute
)

// Upload is what `join --control-plane` needs, as upload-certs made it.
type Upload struct {
	Server, Token, CAPin, CertificateKey string
	Expires                              time.Time
}

// JoinCommand is the command line a new host runs.
func (u Upload) JoinCommand() string {
	return fmt.Sprintf("controlplane-bootstrap join --control-plane --server %s --token %s --ca-cert-hash %s --certificate-key %s --config cluster.yaml --dir DIR",
		u.Server, u.Token, u.CAPin, u.CertificateKey)
}

// secretKey is a shared root's key in the Secret (no "/" allowed there).
func secretKey(name string) string { return strings.ReplaceAll(name, "/", "_") }

// UploadCerts seals this host's shared roots with a new certificate key into
// ControlPlaneCertsSecret, owned by a new bootstrap token of ttl (zero: UploadCertsTTL),
// so that both go when the token expires, and lets the token's group read it.
func (cp *ControlPlane) UploadCerts(ctx context.Context, ttl time.Duration) (Upload, error) {
	if ttl <= 0 {
		ttl = UploadCertsTTL
	}
	client, err := cp.Clientset()
	if err != nil {
		return Upload{}, err
	}
	st := GetEtcdStatus(ctx, cp.Config, cp.Layout)
	if st.Err != "" {
		return Upload{}, fmt.Errorf("read etcd's members for the joining host: %s", st.Err)
	}
	var endpoints []string
	for _, m := range st.Members {
		endpoints = append(endpoints, m.ClientURLs...)
	}
	files, err := clusterpki.ReadRoots(cp.Layout.PKIDir())
	if err != nil {
		return Upload{}, err
	}
	key, err := clusterpki.NewCertificateKey()
	if err != nil {
		return Upload{}, err
	}
	sealed, err := clusterpki.SealRoots(files, key)
	if err != nil {
		return Upload{}, err
	}
	tok, err := joinconfig.CreateToken(ctx, client, joinconfig.TokenOptions{TTL: ttl, Groups: []string{ControlPlaneJoinGroup},
		Description: "join --control-plane: discovers the cluster and reads " + ControlPlaneCertsSecret})
	if err != nil {
		return Upload{}, err
	}
	owner, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, bootstrapapi.BootstrapTokenSecretPrefix+tok.ID, metav1.GetOptions{})
	if err != nil {
		return Upload{}, err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: ControlPlaneCertsSecret, Namespace: metav1.NamespaceSystem,
		Annotations:     map[string]string{etcdEndpointsAnnotation: strings.Join(endpoints, ",")},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Secret", Name: owner.Name, UID: owner.UID}},
	}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{}}
	for name, b := range sealed {
		sec.Data[secretKey(name)] = b
	}
	// A new upload replaces the last: one key opens the Secret at a time.
	if err := client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, ControlPlaneCertsSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return Upload{}, err
	}
	if _, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return Upload{}, err
	}
	if err := ensureCertsRole(ctx, client); err != nil {
		return Upload{}, err
	}
	if err := joinconfig.WaitSigned(ctx, client, tok.String()); err != nil {
		return Upload{}, err
	}
	return Upload{Server: cp.Config.APIServer.Endpoint, Token: tok.String(), CAPin: cp.PKI.CAPin(), CertificateKey: key, Expires: tok.Expires}, nil
}

// ensureCertsRole lets ControlPlaneJoinGroup get ControlPlaneCertsSecret, and nothing else.
func ensureCertsRole(ctx context.Context, client kubernetes.Interface) error {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: controlPlaneCertsRole, Namespace: metav1.NamespaceSystem},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{ControlPlaneCertsSecret}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: controlPlaneCertsRole, Namespace: metav1.NamespaceSystem},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: controlPlaneCertsRole},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: ControlPlaneJoinGroup}}}
	roles, bindings := client.RbacV1().Roles(metav1.NamespaceSystem), client.RbacV1().RoleBindings(metav1.NamespaceSystem)
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = roles.Update(ctx, role, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// JoinOptions configure JoinControlPlane: Init's, and how to reach the cluster.
type JoinOptions struct {
	Options
	// Server is an API server of the cluster (host:port), Token the bootstrap token,
	// CAPin the cluster CA's pin and CertificateKey the key, as upload-certs printed.
	Server, Token, CAPin, CertificateKey string
}

// JoinControlPlane makes this host a control-plane host of the cluster at opts.Server.
// Nothing is written before the cluster's CA matches the pin, the token reads the
// shared roots and the key opens them, etcd's members all answer and there is room for
// one more (controlPlane.hosts); then the PKI is written, the member added as a learner
// and the control plane started; the learner is promoted once in sync. A failure after
// the member was added removes it again.
func JoinControlPlane(ctx context.Context, opts JoinOptions) (*ControlPlane, error) {
	cfg := opts.Config
	if cfg == nil {
		return nil, errors.New("join --control-plane needs --config: this host's cluster.yaml (its nodeName, addresses and ports; controlPlane.hosts as on the others)")
	}
	if !cfg.HA() {
		return nil, fmt.Errorf("controlPlane.hosts is %d in this host's configuration: a cluster that other hosts join has 3 or 5; set it on every host (docs/ha.md)", cfg.ControlPlane.Hosts)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	l := components.Layout{Dir: dir}
	if _, err := os.Stat(l.PKIDir()); err == nil {
		return nil, fmt.Errorf("%s already holds a cluster PKI: this host is a control-plane host already (or was: reset it first)", dir)
	}
	if err := checkClock(ctx, opts.Server, time.Now); err != nil {
		return nil, err
	}
	caPEM, err := discoverCA(ctx, opts.Server, opts.Token, opts.CAPin)
	if err != nil {
		return nil, err
	}
	roots, endpoints, err := fetchRoots(ctx, opts.Server, caPEM, opts.Token, opts.CertificateKey)
	if err != nil {
		return nil, err
	}
	etcdTLS, err := etcdTLSFromRoots(roots)
	if err != nil {
		return nil, err
	}
	peerURL := "https://" + net.JoinHostPort(cfg.APIServer.AdvertiseAddress, strconv.Itoa(cfg.Etcd.PeerPort))
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: etcdTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	defer cli.Close()
	if err := checkRoomForMember(ctx, cli, cfg); err != nil {
		return nil, err
	}
	if err := clusterpki.WriteRoots(l.PKIDir(), roots); err != nil {
		return nil, err
	}
	added, err := cli.MemberAddAsLearner(ctx, []string{peerURL})
	if err != nil {
		return nil, fmt.Errorf("add this host's etcd member (%s) as a learner: %w", peerURL, err)
	}
	var initial []string
	for _, m := range added.Members {
		name := m.Name
		if m.ID == added.Member.ID {
			name = cfg.NodeName
		}
		if len(m.PeerURLs) > 0 {
			initial = append(initial, name+"="+m.PeerURLs[0])
		}
	}
	cfg.Etcd.Join.InitialCluster = strings.Join(initial, ",")
	init := opts.Options
	init.Config, init.ConfigYAML = cfg, nil
	promoted := make(chan error, 1)
	pctx, cancel := context.WithTimeout(ctx, promoteTimeout)
	defer cancel()
	go func() { promoted <- promoteWhenReady(pctx, cli, added.Member.ID) }()
	cp, err := Init(ctx, init)
	if err == nil {
		err = <-promoted
	}
	if err != nil {
		if cp != nil {
			cp.Stop()
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		if _, rerr := cli.MemberRemove(rctx, added.Member.ID); rerr != nil {
			return nil, fmt.Errorf("%w; and removing the learner %x again failed (%v): remove it with etcdctl member remove from a host of the cluster", err, added.Member.ID, rerr)
		}
		return nil, fmt.Errorf("%w (this host's etcd member was removed again; run reset --dir %s before trying again)", err, dir)
	}
	return cp, nil
}

// maxClockSkew is how far this host's clock may be from the API server's when it joins:
// less than the backdating of the certificates it issues itself (pki.Backdate), so that
// the other hosts do not see them as not yet valid, and the token's expiry is judged
// on one time.
const maxClockSkew = pki.Backdate - time.Minute

// checkClock compares now with the Date of server's answer (any answer; /healthz is
// readable without credentials) and refuses a skew beyond maxClockSkew, naming it.
func checkClock(ctx context.Context, server string, now func() time.Time) error {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// Only the Date header is read, before anything about the server is trusted.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+server+"/healthz", nil)
	if err != nil {
		return err
	}
	sent := now()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("reach the API server at %s: %w", server, err)
	}
	resp.Body.Close()
	theirs, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return nil // no Date to compare with: the certificates' own checks remain
	}
	// The server's Date is truncated to the second: compare with the middle of the round trip.
	ours := sent.Add(now().Sub(sent) / 2)
	skew := ours.Sub(theirs)
	if skew < -maxClockSkew-time.Second || skew > maxClockSkew+time.Second {
		// A whole-second Date measures the skew to a second: it is said to 10 s.
		return fmt.Errorf("this host's clock is about %s %s the API server's at %s (more than %s): the certificates it issues would not yet be valid, or already expired, for the other hosts; fix its time sync (chrony, systemd-timesyncd) and join again",
			skew.Abs().Round(10*time.Second), map[bool]string{true: "ahead of", false: "behind"}[skew > 0], server, maxClockSkew)
	}
	return nil
}

// discoverCA reads kube-public/cluster-info from server without trusting it yet, checks
// its signature for token (only a holder of the token could have made it) and that its
// CA has pin, and returns the CA.
func discoverCA(ctx context.Context, server, token, pin string) ([]byte, error) {
	if err := pki.ValidatePin(pin); err != nil {
		return nil, fmt.Errorf("--ca-cert-hash: %w", err)
	}
	insecure := &rest.Config{Host: "https://" + server, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, Timeout: 10 * time.Second}
	client, err := kubernetes.NewForConfig(insecure)
	if err != nil {
		return nil, err
	}
	cm, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read cluster-info from %s: %w", server, err)
	}
	if err := joinconfig.VerifyClusterInfo(cm, token); err != nil {
		return nil, fmt.Errorf("%w: check --token (upload-certs' tokens live %s)", err, UploadCertsTTL)
	}
	kc, err := clientcmd.Load([]byte(cm.Data[bootstrapapi.KubeConfigKey]))
	if err != nil {
		return nil, fmt.Errorf("cluster-info's kubeconfig: %w", err)
	}
	for _, c := range kc.Clusters {
		cert, err := pki.DecodeCertPEM(c.CertificateAuthorityData)
		if err != nil {
			continue
		}
		if err := pki.VerifyPin(cert, pin); err != nil {
			return nil, fmt.Errorf("the cluster at %s: %w (--ca-cert-hash)", server, err)
		}
		return c.CertificateAuthorityData, nil
	}
	return nil, fmt.Errorf("cluster-info from %s names no CA", server)
}

// fetchRoots reads ControlPlaneCertsSecret with token, trusting caPEM, and opens it
// with key; it returns the roots and etcd's client URLs.
func fetchRoots(ctx context.Context, server string, caPEM []byte, token, key string) (map[string][]byte, []string, error) {
	rc := &rest.Config{Host: "https://" + server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}, Timeout: 10 * time.Second}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	sec, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, ControlPlaneCertsSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil, nil, fmt.Errorf("the token cannot read the shared certificates (%v): run upload-certs on a control-plane host and use the token it prints (it lives %s)", err, UploadCertsTTL)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the shared certificates: %w", err)
	}
	sealed := map[string][]byte{}
	for k, v := range sec.Data {
		name := k
		for _, r := range clusterpki.SharedRoots {
			if secretKey(r) == k {
				name = r
			}
		}
		sealed[name] = v
	}
	roots, err := clusterpki.OpenRoots(sealed, key)
	if err != nil {
		return nil, nil, err
	}
	var endpoints []string
	for _, e := range strings.Split(sec.Annotations[etcdEndpointsAnnotation], ",") {
		if u, err := url.Parse(e); err == nil && u.Scheme == "https" && u.Host != "" {
			endpoints = append(endpoints, e)
		}
	}
	if len(endpoints) == 0 {
		return nil, nil, fmt.Errorf("the shared certificates name no etcd endpoint (annotation %s): run upload-certs again", etcdEndpointsAnnotation)
	}
	return roots, endpoints, nil
}

// etcdTLSFromRoots is an etcd client credential issued in memory by the shared etcd CA:
// the joining host checks and changes the membership before it writes anything.
func etcdTLSFromRoots(roots map[string][]byte) (*tls.Config, error) {
	caCert, err := pki.DecodeCertPEM(roots[clusterpki.EtcdCACert])
	if err != nil {
		return nil, fmt.Errorf("the shared etcd CA: %w", err)
	}
	caKey, err := pki.DecodeKeyPEM(roots[clusterpki.EtcdCAKey])
	if err != nil {
		return nil, fmt.Errorf("the shared etcd CA key: %w", err)
	}
	ca := &pki.CA{Cert: caCert, Key: caKey}
	kp, err := ca.Issue(pki.CertRequest{CommonName: clusterpki.EtcdHealthcheckClientC, Usages: []pki.Usage{pki.ClientAuth}, Validity: time.Hour})
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: ca.CertPool(), Certificates: []tls.Certificate{kp.TLSCertificate()}, MinVersion: tls.VersionTLS12}, nil
}

// checkRoomForMember refuses a member that would risk the cluster: one beyond
// controlPlane.hosts, one while any member does not answer or is still a learner, and a
// name that is taken.
func checkRoomForMember(ctx context.Context, cli *clientv3.Client, cfg *clusterconfig.Config) error {
	list, err := cli.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("read etcd's members: %w", err)
	}
	n := len(list.Members)
	if n >= cfg.ControlPlane.Hosts {
		return fmt.Errorf("etcd has %d members and controlPlane.hosts is %d: a host beyond it is refused (replace a lost host: docs/ha.md, \"Replacing a control-plane host\")", n, cfg.ControlPlane.Hosts)
	}
	for _, m := range list.Members {
		if m.Name == cfg.NodeName {
			return fmt.Errorf("etcd already has a member named %s: give this host another nodeName, or remove that member first", m.Name)
		}
		if m.IsLearner {
			return fmt.Errorf("etcd member %s is still a learner (another join under way): wait for it, or remove it", m.Name)
		}
		if len(m.ClientURLs) == 0 {
			return fmt.Errorf("etcd member %x has never started: remove it (etcdctl member remove) before another host joins", m.ID)
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cli.Status(sctx, m.ClientURLs[0])
		cancel()
		if err != nil {
			return fmt.Errorf("etcd member %s (%s) does not answer: %v; with it down, adding a member would need %d of %d members up for quorum, and one more loss stops the cluster: bring it back, or replace it (docs/ha.md, \"Replacing a control-plane host\")",
				m.Name, m.ClientURLs[0], err, (n+1)/2+1, n+1)
		}
	}
	return nil
}

// promoteWhenReady promotes learner id once etcd lets it (it has caught up with the
// leader), trying every half second until ctx ends.
func promoteWhenReady(ctx context.Context, cli *clientv3.Client, id uint64) error {
	var last error
	for {
		if _, err := cli.MemberPromote(ctx, id); err == nil {
			return nil
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("this host's etcd member (learner %x) was not promoted: %v", id, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// leaveEtcd removes this host's member from etcd when others remain, for reset: the
// cluster then no longer counts it towards quorum. Without a running member here it
// says how to remove it from another host.
func leaveEtcd(ctx context.Context, l components.Layout) error {
	cfg, err := clusterconfig.Load(l.ConfigFile())
	if err != nil {
		return nil // not a control plane this can read: nothing to leave
	}
	tlsCfg, err := etcdClientTLS(l)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	local := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Etcd.ClientPort))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{local}, TLS: tlsCfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		if cfg.HA() {
			return fmt.Errorf("etcd does not answer here (%v), so this host's member %s cannot be removed from the cluster by reset: start it (init --dir), or remove the member from another host (etcdctl member remove), then reset again", err, cfg.NodeName)
		}
		return nil
	}
	var self uint64
	var others []string
	for _, m := range list.Members {
		if m.Name == cfg.NodeName {
			self = m.ID
		} else {
			others = append(others, m.ClientURLs...)
		}
	}
	if self == 0 || len(others) == 0 {
		return nil
	}
	cli.SetEndpoints(others...)
	// etcd refuses a removal that would leave fewer members up than quorum, and counts a
	// member as up once it has been connected for 5 s: right after another host
	// restarted, it refuses for a few seconds ("unhealthy cluster"), so try for 20.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := cli.MemberRemove(ctx, self)
		if err == nil {
			return nil
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			return fmt.Errorf("remove this host's etcd member %s (%x): %w; the cluster keeps it until it is removed (with fewer other members up than its quorum, etcd refuses: bring them back first, or remove it with etcdctl member remove from another host)", cfg.NodeName, self, err)
		}
		time.Sleep(time.Second)
	}
}

// etcdMembersProblem says what is wrong with n members for hosts, or "".
func etcdMembersProblem(n, hosts int) string {
	switch {
	case n == 2:
		return "2 etcd members: losing either host stops the cluster (quorum is 2 of 2); join a third (docs/ha.md)"
	case n < hosts:
		return fmt.Sprintf("%d of controlPlane.hosts' %d etcd members: join the missing host(s) (docs/ha.md)", n, hosts)
	case n > hosts && !slices.Contains([]int{1, 3, 5}, n):
		return fmt.Sprintf("%d etcd members, more than controlPlane.hosts' %d", n, hosts)
	}
	return ""
}
