package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
)

// TestPrintEtcd: status' etcd part names the leader and each member's health and role
// (a learner as learner, a member that did not answer as UNHEALTHY, with why; never the components' "ok", which scripts count), and says
// why the membership is unknown when it could not be read.
func TestPrintEtcd(t *testing.T) {
	var out bytes.Buffer
	printEtcd(&out, &controlplane.EtcdStatus{Leader: "cp-1", Members: []controlplane.EtcdMember{
		{Name: "cp-1", ID: "a1", ClientURLs: []string{"https://10.0.0.2:2379"}, Healthy: true, Leader: true, DBSize: 3 << 20, RaftIndex: 42},
		{Name: "cp-2", ID: "b2", ClientURLs: []string{"https://10.0.0.3:2379"}, Err: "context deadline exceeded"},
		{Name: "cp-3", ID: "c3", ClientURLs: []string{"https://10.0.0.4:2379"}, Healthy: true, Learner: true},
	}})
	got := out.String()
	if strings.Contains(got, " ok ") {
		t.Errorf("status' etcd part says \" ok \", which scripts count as a component's row:\n%s", got)
	}
	for _, want := range []string{
		"etcd: 3 member(s), leader cp-1",
		"cp-1    a1  healthy    leader    3.0 MiB",
		"cp-2    b2  UNHEALTHY  follower",
		"context deadline exceeded",
		"cp-3    c3  healthy    learner",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("status' etcd part lacks %q:\n%s", want, got)
		}
	}
	out.Reset()
	printEtcd(&out, &controlplane.EtcdStatus{Err: "etcd member list from https://127.0.0.1:2379: context deadline exceeded"})
	if !strings.HasPrefix(out.String(), "etcd: membership unknown: etcd member list") {
		t.Errorf("unreadable membership: %q", out.String())
	}
	out.Reset()
	printEtcd(&out, &controlplane.EtcdStatus{Members: []controlplane.EtcdMember{{Name: "cp-1"}}})
	if !strings.Contains(out.String(), "leader none (no quorum?)") {
		t.Errorf("no leader: %q", out.String())
	}
}
