// Package pki creates and uses the gpurack certificate authorities: a
// self-signed CA, the leaf certificates it issues for the roles of
// docs/contracts.md §4 (servers, agents, operators), with a fresh key or for a key
// its holder keeps (an agent's ed25519 key), their PEM files on disk, the
// kubeadm-style CA pin that the agent receives on the kernel command line
// (docs/contracts.md §3), and gpuboot's list of revoked certificates.
//
// It is used by gpuboot (the gpurack CA) and controlplane-bootstrap (the
// cluster CA). It is not a general X.509 toolkit: keys it makes are ECDSA P-256,
// there are no intermediate CAs, and revocation is a plain list of serial
// numbers consulted during the TLS handshake, not CRLs or OCSP.
package pki
