package enroll

import (
	"fmt"
	"strings"

	"github.com/gpurack/gpurack/pxe/policy"
)

// StartWarnings returns what gpuboot serve logs at Warning when it starts with cfg: the
// settings under which a claimed identity, which anyone on the provisioning network
// can read and repeat, is enough to receive a machine's join secrets, each naming the
// setting that closes the gap (issue 33). Empty when none applies. The approval mode
// auto has its own (policy.Policy.Warning).
func StartWarnings(cfg Config) []string {
	id, reenroll := cfg.Identity, cfg.Reenroll
	if id == "" {
		id = IdentityMACUUIDSerial
	}
	if reenroll == "" {
		reenroll = ReenrollAuto
	}
	var out []string
	if l := cfg.Policy.List; cfg.Policy.Mode == policy.Allowlist && l != nil {
		withEK := 0
		ekFiles, noEKFiles := map[string]bool{}, map[string]bool{}
		for _, e := range l.Entries {
			if e.EKHash != "" {
				withEK++
				ekFiles[e.Source] = true
			} else {
				noEKFiles[e.Source] = true
			}
		}
		anyTPM := "the first TPM"
		if id == IdentityTPMOrFallback {
			anyTPM = "the first agent, with any TPM or none,"
		}
		switch {
		case !id.usesTPM() && withEK > 0:
			out = append(out, fmt.Sprintf("approval allowlist with identity %s: the %d rows of %s that name a TPM EK approve nobody, since this identity mode checks no TPM; "+
				"the other rows approve whoever registers first with a listed serial and MAC: set enrollment.identity: tpm", id, withEK, filesOf(l, ekFiles)))
		case !id.usesTPM():
			out = append(out, fmt.Sprintf("approval allowlist with identity %s: whoever registers first with a listed serial and MAC is approved and receives the machine's join secrets "+
				"(both are printed on the machine and sent on the wire at every boot); set enrollment.identity: tpm and give each row of %s its ekHash or ekCertificate", id, l.Source))
		case withEK < len(l.Entries):
			out = append(out, fmt.Sprintf("approval allowlist with identity %s: %d of the %d rows of %s name no TPM EK: %s that registers with such a row's serial and MAC is approved; "+
				"give each row its ekHash or ekCertificate (the vendor ships them) and set enrollment.identity: tpm", id, len(l.Entries)-withEK, len(l.Entries), filesOf(l, noEKFiles), anyTPM))
		}
	}
	if cfg.Policy.Mode == policy.Auto && id != IdentityTPM {
		out = append(out, fmt.Sprintf("approval auto with identity %s: an agent need not even have a TPM to be approved; set enrollment.identity: tpm so that at least every approved machine is bound to its TPM", id))
	}
	if reenroll == ReenrollAuto && id != IdentityTPM {
		out = append(out, fmt.Sprintf("reenroll auto with identity %s: a key that claims an enrolled machine's identity after its agent has been silent for %s takes the identity over and receives its join secrets; "+
			"set enrollment.identity: tpm (the same TPM re-enrolls at once, another is a conflict for an operator), or reenroll: manual", id, keyLivenessWords))
	}
	return out
}

// filesOf names the manifest files of l that are in files, in l's order: "a.csv" or
// "a.csv, b.csv".
func filesOf(l *policy.List, files map[string]bool) string {
	var out []string
	for _, s := range l.Sources {
		if files[s] {
			out = append(out, s)
		}
	}
	return strings.Join(out, ", ")
}

// keyLivenessWords is inventory.KeyLiveness as the warnings say it.
const keyLivenessWords = "3 minutes"
