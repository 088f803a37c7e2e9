package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// EtcdStatus is etcd's membership as `status` reports it (issue 31): every member, the
// leader, and each member's health as its own client URL answers.
type EtcdStatus struct {
	Members []EtcdMember
	// Leader is the leader's name, "" when no member answered with one.
	Leader string
	// Err says why the membership could not be read (etcd down, no credentials).
	Err string
	// Problem says what is wrong with the membership against controlPlane.hosts (two
	// members, or fewer than the hosts), "" when nothing is.
	Problem string
}

// EtcdMember is one member of the etcd cluster.
type EtcdMember struct {
	Name, ID   string
	PeerURLs   []string
	ClientURLs []string
	Learner    bool
	// Healthy: the member answered a status call on its first client URL; Err says
	// why not.
	Healthy bool
	Err     string
	Leader  bool
	// DBSize is its database's size in bytes, RaftIndex its raft log's index.
	DBSize    int64
	RaftIndex uint64
}

// etcdStatusTimeout bounds the whole etcd part of `status`.
const etcdStatusTimeout = 5 * time.Second

// GetEtcdStatus reads etcd's membership through this host's member, with the
// apiserver's etcd client certificate, and asks every member for its status.
func GetEtcdStatus(ctx context.Context, cfg *clusterconfig.Config, l components.Layout) EtcdStatus {
	ctx, cancel := context.WithTimeout(ctx, etcdStatusTimeout)
	defer cancel()
	tlsCfg, err := etcdClientTLS(l)
	if err != nil {
		return EtcdStatus{Err: err.Error()}
	}
	endpoint := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Etcd.ClientPort))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return EtcdStatus{Err: fmt.Sprintf("etcd client for %s: %v", endpoint, err)}
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return EtcdStatus{Err: fmt.Sprintf("etcd member list from %s: %v", endpoint, err)}
	}
	var st EtcdStatus
	var leaderID uint64
	for _, m := range list.Members {
		em := EtcdMember{Name: m.Name, ID: fmt.Sprintf("%x", m.ID), PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner}
		if len(m.ClientURLs) == 0 {
			em.Err = "no client URL (not started yet)"
		} else if s, err := cli.Status(ctx, m.ClientURLs[0]); err != nil {
			em.Err = err.Error()
		} else {
			em.Healthy = len(s.Errors) == 0
			if !em.Healthy {
				em.Err = fmt.Sprint(s.Errors)
			}
			em.DBSize, em.RaftIndex = s.DbSize, s.RaftIndex
			if s.Leader != 0 {
				leaderID = s.Leader
			}
		}
		st.Members = append(st.Members, em)
	}
	voters := 0
	for i, m := range list.Members {
		if m.ID == leaderID {
			st.Members[i].Leader = true
			st.Leader = m.Name
		}
		if !m.IsLearner {
			voters++
		}
	}
	st.Problem = etcdMembersProblem(voters, cfg.ControlPlane.Hosts)
	return st
}

// etcdClientTLS is the apiserver's etcd client credential, trusting the etcd CA: how
// this host's tools talk to its etcd member.
func etcdClientTLS(l components.Layout) (*tls.Config, error) {
	conf, err := tlsTrusting(l.PKI(clusterpki.EtcdCACert))
	if err != nil {
		return nil, fmt.Errorf("etcd CA: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(l.PKI(clusterpki.APIServerEtcdCert), l.PKI(clusterpki.APIServerEtcdKey))
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate: %w", err)
	}
	conf.Certificates = []tls.Certificate{cert}
	return conf, nil
}
