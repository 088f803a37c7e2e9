package config

import (
	"strings"
	"testing"
	"time"
)

// TestAgentCertValidity: enrollment.agentCertValidity is a duration, left out for the
// enrollment service's default (a year), at least a minute; a shorter or negative one
// is an error on its line that says what to give; the example sets a year.
func TestAgentCertValidity(t *testing.T) {
	c, err := Parse("g.yaml", []byte(minimal))
	if err != nil || c.Enrollment.AgentCertValidity != 0 {
		t.Fatalf("left out: %v, %v; want 0 (the default)", c.Enrollment.AgentCertValidity, err)
	}
	c, err = Parse("g.yaml", []byte(minimal+"enrollment: {agentCertValidity: 10m}\n"))
	if err != nil || c.Enrollment.AgentCertValidity != 10*time.Minute {
		t.Fatalf("10m: %v, %v", c.Enrollment.AgentCertValidity, err)
	}
	for _, v := range []string{"30s", "-1h"} {
		_, err := Parse("g.yaml", []byte(minimal+"enrollment: {agentCertValidity: "+v+"}\n"))
		if err == nil || !strings.Contains(err.Error(), "g.yaml:6: enrollment.agentCertValidity") || !strings.Contains(err.Error(), "at least 1m0s") {
			t.Errorf("%s: %v; want an error on line 6 asking for at least a minute", v, err)
		}
	}
	if _, err := Parse("g.yaml", []byte(minimal+"enrollment: {agentCertValidity: a year}\n")); err == nil || !strings.Contains(err.Error(), "agentCertValidity") {
		t.Errorf("not a duration: %v", err)
	}
}
