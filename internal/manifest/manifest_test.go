package manifest

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func hexOf(c byte, n int) string { return strings.Repeat(string(c), n) }

// testManifest returns a valid manifest whose artifacts are deliberately
// not sorted.
func testManifest() *Manifest {
	return &Manifest{
		SchemaVersion:   1,
		ImageID:         "0123456789abcdef0123456789abcdef01234567",
		Profile:         "h100-550",
		ProfileDigest:   hexOf('1', 64),
		LockDigest:      "sha256:" + hexOf('2', 64),
		BuilderVersion:  "0.1.0",
		SourceDateEpoch: 1700000000,
		Kernel:          Kernel{Version: "6.1.0-28-amd64", Package: "linux-image-6.1.0-28-amd64"},
		Driver: &Driver{
			Version:  "550.127.08",
			Flavor:   FlavorOpen,
			Vermagic: "6.1.0-28-amd64 SMP preempt mod_unload modversions ",
		},
		KubernetesVersion: "v1.31.4",
		Binaries: map[string]FileDigest{
			BinaryKubelet: {SHA256: hexOf('3', 64), Size: 58000000},
			BinaryAgent:   {SHA256: hexOf('4', 64), Size: 31000000},
		},
		Artifacts: []Artifact{
			{Name: ArtifactRootfs, SHA256: hexOf('5', 64), Size: 900000000},
			{Name: ArtifactKernel, SHA256: hexOf('6', 64), Size: 8000000},
			{Name: ArtifactInitrd, SHA256: hexOf('7', 64), Size: 30000000},
			{Name: ArtifactCmdline, SHA256: hexOf('8', 64), Size: 120},
			{Name: ArtifactSBOM, SHA256: hexOf('9', 64), Size: 400000},
		},
	}
}

const goldenManifest = `{
  "schemaVersion": 1,
  "imageId": "0123456789abcdef0123456789abcdef01234567",
  "profile": "h100-550",
  "profileDigest": "1111111111111111111111111111111111111111111111111111111111111111",
  "lockDigest": "sha256:2222222222222222222222222222222222222222222222222222222222222222",
  "builderVersion": "0.1.0",
  "sourceDateEpoch": 1700000000,
  "kernel": {
    "version": "6.1.0-28-amd64",
    "package": "linux-image-6.1.0-28-amd64"
  },
  "driver": {
    "version": "550.127.08",
    "flavor": "open",
    "vermagic": "6.1.0-28-amd64 SMP preempt mod_unload modversions "
  },
  "kubernetesVersion": "v1.31.4",
  "binaries": {
    "gpuagent": {
      "sha256": "4444444444444444444444444444444444444444444444444444444444444444",
      "size": 31000000
    },
    "kubelet": {
      "sha256": "3333333333333333333333333333333333333333333333333333333333333333",
      "size": 58000000
    }
  },
  "artifacts": [
    {
      "name": "cmdline",
      "sha256": "8888888888888888888888888888888888888888888888888888888888888888",
      "size": 120
    },
    {
      "name": "initrd.img",
      "sha256": "7777777777777777777777777777777777777777777777777777777777777777",
      "size": 30000000
    },
    {
      "name": "rootfs.squashfs",
      "sha256": "5555555555555555555555555555555555555555555555555555555555555555",
      "size": 900000000
    },
    {
      "name": "sbom.spdx.json",
      "sha256": "9999999999999999999999999999999999999999999999999999999999999999",
      "size": 400000
    },
    {
      "name": "vmlinuz",
      "sha256": "6666666666666666666666666666666666666666666666666666666666666666",
      "size": 8000000
    }
  ]
}
`

func TestMarshalCanonical(t *testing.T) {
	m := testManifest()
	orig := append([]Artifact(nil), m.Artifacts...)
	got, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != goldenManifest {
		t.Errorf("Marshal output differs from the golden bytes:\n%s", got)
	}
	if !reflect.DeepEqual(m.Artifacts, orig) {
		t.Errorf("Marshal reordered the caller's artifacts")
	}
	// Byte-stable: again, and from a manifest built in another order.
	for i := 0; i < 20; i++ {
		m2 := testManifest()
		m2.Artifacts[0], m2.Artifacts[4] = m2.Artifacts[4], m2.Artifacts[0]
		m2.Binaries = map[string]FileDigest{BinaryAgent: m.Binaries[BinaryAgent], BinaryKubelet: m.Binaries[BinaryKubelet]}
		again, err := Marshal(m2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, got) {
			t.Fatalf("Marshal is not byte-stable:\n%s\nvs\n%s", again, got)
		}
	}
	// Marshal refuses what Parse would refuse.
	bad := testManifest()
	bad.ImageID = "x"
	if _, err := Marshal(bad); err == nil || !strings.Contains(err.Error(), "imageId") {
		t.Errorf("Marshal(invalid) err = %v", err)
	}
	// A no-GPU image has no driver field at all.
	m.Driver = nil
	noGPU, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(noGPU, []byte(`"driver"`)) {
		t.Errorf("driver field present for a no-GPU image")
	}
}

func TestParseRoundTrip(t *testing.T) {
	for _, gpu := range []bool{true, false} {
		m := testManifest()
		if !gpu {
			m.Driver = nil
		}
		data, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		sortArtifacts(m.Artifacts)
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip (gpu=%v):\n got %+v\nwant %+v", gpu, got, m)
		}
		if a, ok := got.Artifact(ArtifactRootfs); !ok || a.Size != 900000000 {
			t.Errorf("Artifact(rootfs) = %+v, %v", a, ok)
		}
	}
	// Parse accepts unsorted artifacts and any key order, and sorts.
	m := testManifest()
	raw, _ := json.Marshal(m) // encoding/json order, artifacts unsorted
	got, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.Artifacts[0].Name != ArtifactCmdline {
		t.Errorf("Parse did not sort artifacts: %v", got.Artifacts)
	}
}

// mutate returns the test manifest as JSON after f has changed its generic
// form.
func mutate(t *testing.T, f func(m map[string]any)) []byte {
	t.Helper()
	data, err := Marshal(testManifest())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func artifact(m map[string]any, i int) map[string]any {
	return m["artifacts"].([]any)[i].(map[string]any)
}

func TestParseRejects(t *testing.T) {
	good, err := Marshal(testManifest())
	if err != nil {
		t.Fatal(err)
	}
	replace := func(old, new string) []byte {
		if !bytes.Contains(good, []byte(old)) {
			t.Fatalf("test bug: %q not in manifest", old)
		}
		return bytes.Replace(good, []byte(old), []byte(new), 1)
	}
	tests := []struct {
		name  string
		data  []byte
		wants []string // substrings of the error
	}{
		{"schema version 2", mutate(t, func(m map[string]any) { m["schemaVersion"] = 2 }), []string{"schemaVersion", "not supported"}},
		{"schema version missing", mutate(t, func(m map[string]any) { delete(m, "schemaVersion") }), []string{"schemaVersion", "missing"}},
		{"image id upper case", mutate(t, func(m map[string]any) { m["imageId"] = "0123456789ABCDEF0123456789abcdef01234567" }), []string{"imageId", "40 lowercase hex"}},
		{"image id short", mutate(t, func(m map[string]any) { m["imageId"] = "abc" }), []string{"imageId"}},
		{"image id missing", mutate(t, func(m map[string]any) { delete(m, "imageId") }), []string{"imageId"}},
		{"profile with slash", mutate(t, func(m map[string]any) { m["profile"] = "a/b" }), []string{"profile"}},
		{"profile digest", mutate(t, func(m map[string]any) { m["profileDigest"] = "md5:abc" }), []string{"profileDigest", "SHA-256"}},
		{"lock digest", mutate(t, func(m map[string]any) { m["lockDigest"] = "" }), []string{"lockDigest"}},
		{"builder version blank", mutate(t, func(m map[string]any) { m["builderVersion"] = "  " }), []string{"builderVersion", "blank"}},
		{"builder version control char", mutate(t, func(m map[string]any) { m["builderVersion"] = "1.0\n" }), []string{"builderVersion", "control"}},
		{"negative epoch", mutate(t, func(m map[string]any) { m["sourceDateEpoch"] = -1 }), []string{"sourceDateEpoch", "negative"}},
		{"fractional epoch", mutate(t, func(m map[string]any) { m["sourceDateEpoch"] = 1.5 }), []string{"sourceDateEpoch", "whole number"}},
		{"kernel version missing", mutate(t, func(m map[string]any) { delete(m["kernel"].(map[string]any), "version") }), []string{"kernel.version"}},
		{"kernel null", mutate(t, func(m map[string]any) { m["kernel"] = nil }), []string{"kernel", "null"}},
		{"kernel a string", mutate(t, func(m map[string]any) { m["kernel"] = "6.1" }), []string{"kernel", "JSON object"}},
		{"driver flavor", mutate(t, func(m map[string]any) { m["driver"].(map[string]any)["flavor"] = "closed" }), []string{"driver.flavor", `"open" or "proprietary"`}},
		{"driver vermagic", mutate(t, func(m map[string]any) { m["driver"].(map[string]any)["vermagic"] = "" }), []string{"driver.vermagic"}},
		{"kubernetes version", mutate(t, func(m map[string]any) { delete(m, "kubernetesVersion") }), []string{"kubernetesVersion"}},
		{"kubelet missing", mutate(t, func(m map[string]any) { delete(m["binaries"].(map[string]any), "kubelet") }), []string{"binaries", `"kubelet" is missing`}},
		{"binaries null", mutate(t, func(m map[string]any) { m["binaries"] = nil }), []string{"binaries", "null"}},
		{"binary sha", mutate(t, func(m map[string]any) {
			m["binaries"].(map[string]any)["kubelet"].(map[string]any)["sha256"] = "zz"
		}), []string{`binaries["kubelet"].sha256`}},
		{"binary size", mutate(t, func(m map[string]any) {
			m["binaries"].(map[string]any)["gpuagent"].(map[string]any)["size"] = -5
		}), []string{`binaries["gpuagent"].size`, "negative"}},
		{"binary name", mutate(t, func(m map[string]any) {
			m["binaries"].(map[string]any)["../x"] = map[string]any{"sha256": hexOf('a', 64), "size": 1}
		}), []string{`binaries["../x"]`}},
		{"artifact traversal", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = "../../etc/passwd" }), []string{"artifacts[0].name", "path separator"}},
		{"artifact dotdot", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = ".." }), []string{"artifacts[0].name", "starts with '.'"}},
		{"artifact absolute", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = "/vmlinuz" }), []string{"artifacts[0].name"}},
		{"artifact empty name", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = "" }), []string{"artifacts[0].name", "empty"}},
		{"artifact backslash", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = `a\b` }), []string{"artifacts[0].name"}},
		{"artifact space", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = "a b" }), []string{"artifacts[0].name"}},
		{"artifact is manifest", mutate(t, func(m map[string]any) { artifact(m, 0)["name"] = "manifest.json" }), []string{"artifacts[0].name", "cannot be an artifact"}},
		{"artifact sha upper", mutate(t, func(m map[string]any) { artifact(m, 2)["sha256"] = hexOf('A', 64) }), []string{`artifacts["rootfs.squashfs"].sha256`}},
		{"artifact sha short", mutate(t, func(m map[string]any) { artifact(m, 2)["sha256"] = hexOf('a', 63) }), []string{`artifacts["rootfs.squashfs"].sha256`}},
		{"artifact size negative", mutate(t, func(m map[string]any) { artifact(m, 2)["size"] = -1 }), []string{`artifacts["rootfs.squashfs"].size`}},
		{"artifact size string", mutate(t, func(m map[string]any) { artifact(m, 2)["size"] = "10" }), []string{"size", "whole number"}},
		{"artifact size null", mutate(t, func(m map[string]any) { artifact(m, 2)["size"] = nil }), []string{"artifacts[2].size", "null"}},
		{"duplicate artifact", mutate(t, func(m map[string]any) {
			m["artifacts"] = append(m["artifacts"].([]any), artifact(m, 0))
		}), []string{`artifacts["cmdline"]`, "more than once"}},
		{"rootfs missing", mutate(t, func(m map[string]any) {
			as := m["artifacts"].([]any)
			m["artifacts"] = append(as[:2:2], as[3:]...)
		}), []string{"artifacts", `"rootfs.squashfs" is missing`}},
		{"unknown field", mutate(t, func(m map[string]any) { m["signedBy"] = "me" }), []string{"signedBy", "unknown"}},
		{"unknown nested field", mutate(t, func(m map[string]any) { m["kernel"].(map[string]any)["arch"] = "amd64" }), []string{"kernel.arch", "unknown"}},
		{"unknown artifact field", mutate(t, func(m map[string]any) { artifact(m, 1)["mode"] = 420 }), []string{"artifacts[1].mode", "unknown"}},
		{"key case", replace(`"imageId"`, `"imageID"`), []string{"imageID", "case-sensitive", `"imageId"`}},
		{"nested key case", replace(`"sha256": "8888`, `"SHA256": "8888`), []string{"artifacts[0].SHA256", "case-sensitive"}},
		{"duplicate key", replace(`"profile": "h100-550",`, `"profile": "h100-550", "profile": "other",`), []string{"profile", "more than once"}},
		{"duplicate binary", replace(`"binaries": {`, `"binaries": {"kubelet": {"sha256": "`+hexOf('b', 64)+`", "size": 1},`), []string{`binaries["kubelet"]`, "more than once"}},
		{"trailing data", append(append([]byte(nil), good...), []byte(`{}`)...), []string{"after its closing"}},
		{"trailing garbage", append(append([]byte(nil), good...), 'x'), []string{"after its closing"}},
		{"truncated", good[:len(good)/2], []string{"not valid JSON"}},
		{"empty", nil, []string{"not valid JSON"}},
		{"null", []byte("null"), []string{"null"}},
		{"array", []byte("[]"), []string{"JSON"}},
		{"invalid UTF-8", replace(`h100-550`, "h100-\xff"), []string{"UTF-8"}},
		{"too large", append(bytes.Repeat([]byte(" "), MaxManifestSize), good...), []string{"bytes"}},
		{"deep nesting", []byte(`{"kernel":` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100) + `}`), []string{"nested"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(tt.data)
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", m)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidateReportsAll(t *testing.T) {
	m := testManifest()
	m.ImageID = ""
	m.Kernel.Version = ""
	m.Artifacts[0].SHA256 = "x"
	err := m.Validate()
	if err == nil {
		t.Fatal("Validate accepted an invalid manifest")
	}
	for _, w := range []string{"imageId", "kernel.version", `artifacts["rootfs.squashfs"].sha256`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %s: %v", w, err)
		}
	}
}

func TestImageID(t *testing.T) {
	profile := []byte("name: h100-550\n")
	lock := []byte(`{"profileDigest":"x"}`)
	bins := map[string]string{BinaryAgent: hexOf('a', 64), BinaryKubelet: hexOf('b', 64)}
	id := ImageID(profile, lock, "0.1.0", bins, nil)

	// Golden, computed separately (in Python) from the framing documented on
	// ImageID. Changing the framing changes every image id, which must be a
	// deliberate decision (and a new domain string).
	const golden = "2d66c704777bf0d200dd7d7e9b72a047207a9f70"
	if id != golden {
		t.Errorf("ImageID = %s, want the golden %s", id, golden)
	}
	if !isHex(id, 40) {
		t.Errorf("ImageID %q is not 40 lowercase hex characters", id)
	}
	if again := ImageID(profile, lock, "0.1.0", map[string]string{BinaryKubelet: hexOf('b', 64), BinaryAgent: hexOf('a', 64)}, nil); again != id {
		t.Errorf("ImageID is not stable: %s vs %s", again, id)
	}

	variants := map[string]string{
		"profile":         ImageID([]byte("name: h100-551\n"), lock, "0.1.0", bins, nil),
		"lock":            ImageID(profile, []byte(`{"profileDigest":"y"}`), "0.1.0", bins, nil),
		"builder":         ImageID(profile, lock, "0.1.1", bins, nil),
		"agent digest":    ImageID(profile, lock, "0.1.0", map[string]string{BinaryAgent: hexOf('c', 64), BinaryKubelet: hexOf('b', 64)}, nil),
		"kubelet digest":  ImageID(profile, lock, "0.1.0", map[string]string{BinaryAgent: hexOf('a', 64), BinaryKubelet: hexOf('c', 64)}, nil),
		"binary renamed":  ImageID(profile, lock, "0.1.0", map[string]string{"gpuagent2": hexOf('a', 64), BinaryKubelet: hexOf('b', 64)}, nil),
		"binary dropped":  ImageID(profile, lock, "0.1.0", map[string]string{BinaryAgent: hexOf('a', 64)}, nil),
		"no binaries":     ImageID(profile, lock, "0.1.0", nil, nil),
		"digests swapped": ImageID(profile, lock, "0.1.0", map[string]string{BinaryAgent: hexOf('b', 64), BinaryKubelet: hexOf('a', 64)}, nil),
		// Moving bytes across a field boundary must change the id.
		"boundary profile/lock":   ImageID(append(append([]byte(nil), profile...), lock[0]), lock[1:], "0.1.0", bins, nil),
		"boundary lock/builder":   ImageID(profile, append(append([]byte(nil), lock...), '0'), ".1.0", bins, nil),
		"boundary name/digest":    ImageID(profile, lock, "0.1.0", map[string]string{BinaryAgent + "a": hexOf('a', 63), BinaryKubelet: hexOf('b', 64)}, nil),
		"boundary builder/binary": ImageID(profile, lock, "0.1.0"+BinaryAgent, map[string]string{BinaryKubelet: hexOf('b', 64)}, nil),
	}
	seen := map[string]string{id: "base"}
	for name, v := range variants {
		if prev, dup := seen[v]; dup {
			t.Errorf("%s gives the same id as %s: %s", name, prev, v)
		}
		seen[v] = name
	}
	if a, b := ImageID(nil, nil, "", nil, nil), ImageID([]byte{}, []byte{}, "", map[string]string{}, []string{}); a != b {
		t.Errorf("nil and empty inputs differ: %s %s", a, b)
	}

	// Image archives: their content changes the id, and so do their order and
	// number; the framing stays unambiguous.
	a1, a2 := hexOf('1', 64), hexOf('2', 64)
	archives := map[string]string{
		"one archive":          ImageID(profile, lock, "0.1.0", bins, []string{a1}),
		"archive changed":      ImageID(profile, lock, "0.1.0", bins, []string{a2}),
		"two archives":         ImageID(profile, lock, "0.1.0", bins, []string{a1, a2}),
		"two archives swapped": ImageID(profile, lock, "0.1.0", bins, []string{a2, a1}),
		"archive split":        ImageID(profile, lock, "0.1.0", bins, []string{a1[:32], a1[32:]}),
		"empty digest":         ImageID(profile, lock, "0.1.0", bins, []string{""}),
	}
	for name, v := range archives {
		if prev, dup := seen[v]; dup {
			t.Errorf("%s gives the same id as %s: %s", name, prev, v)
		}
		seen[v] = name
	}
}

func TestImagesRoundTripAndValidate(t *testing.T) {
	m := testManifest()
	m.Images = []ImageArchive{{Path: ImagesDir + "/" + hexOf('a', 64) + ".tar", SHA256: hexOf('a', 64), Size: 4096, Names: []string{"gpurack.io/probe:v1"}}}
	data, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Images, m.Images) {
		t.Errorf("images after a round trip: %+v, want %+v", back.Images, m.Images)
	}
	for name, c := range map[string]struct {
		im   ImageArchive
		want string
	}{
		"outside the images dir": {ImageArchive{Path: "/etc/x.tar", SHA256: hexOf('a', 64), Names: []string{"a:b"}}, "images[0].path"},
		"bad digest":             {ImageArchive{Path: ImagesDir + "/x.tar", SHA256: "x", Names: []string{"a:b"}}, "images[0].sha256"},
		"no names":               {ImageArchive{Path: ImagesDir + "/x.tar", SHA256: hexOf('a', 64)}, "images[0].names"},
		"negative size":          {ImageArchive{Path: ImagesDir + "/x.tar", SHA256: hexOf('a', 64), Size: -1, Names: []string{"a:b"}}, "images[0].size"},
	} {
		bad := testManifest()
		bad.Images = []ImageArchive{c.im}
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %s", name, err, c.want)
		}
	}
	// A manifest without images does not mention them (older readers accept it).
	plain, _ := Marshal(testManifest())
	if bytes.Contains(plain, []byte(`"images"`)) {
		t.Error("a manifest without images has an images field")
	}
}
