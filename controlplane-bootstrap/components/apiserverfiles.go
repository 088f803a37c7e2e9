package components

import "fmt"

// EncryptionConfig renders the EncryptionConfiguration that encrypts Secrets
// at rest with secretbox (XSalsa20-Poly1305) under key, a base64 32-byte key.
// The identity provider comes second so that Secrets written before
// encryption was turned on can still be read.
func EncryptionConfig(key string) []byte {
	return fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources:
      - secrets
    providers:
      - secretbox:
          keys:
            - name: key1
              secret: %s
      - identity: {}
`, key)
}

// AuditPolicy is the audit policy kube-apiserver logs with: metadata for
// Secrets, ConfigMaps and token reviews (never their content), request bodies
// for changes to RBAC, admission policies, nodes and CSRs, metadata for every
// other request, and nothing for health checks and the high-rate reads and
// lease renewals of the control plane itself.
var AuditPolicy = []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
  - RequestReceived
rules:
  - level: None
    nonResourceURLs:
      - /healthz*
      - /readyz*
      - /livez*
      - /version
  - level: None
    resources:
      - group: coordination.k8s.io
        resources: ["leases"]
    verbs: ["get", "update"]
  - level: None
    resources:
      - group: ""
        resources: ["events"]
  - level: None
    users:
      - system:kube-scheduler
      - system:kube-controller-manager
    verbs: ["get", "list", "watch"]
  - level: Metadata
    resources:
      - group: ""
        resources: ["secrets", "configmaps", "serviceaccounts/token"]
      - group: authentication.k8s.io
        resources: ["tokenreviews"]
  - level: Request
    verbs: ["create", "update", "patch", "delete"]
    resources:
      - group: rbac.authorization.k8s.io
      - group: admissionregistration.k8s.io
      - group: certificates.k8s.io
      - group: ""
        resources: ["nodes"]
  - level: Metadata
`)
