package manifest

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

func testPackages() []Package {
	return []Package{
		{Name: "util-linux", Version: "2.38.1-5+deb12u1", Arch: "amd64", SHA256: hexOf('c', 64)},
		{Name: "bsdutils", Version: "1:2.38.1-5+deb12u1", Arch: "amd64", SHA256: hexOf('a', 64), License: "GPL-2.0-or-later"},
		{Name: "libc6", Version: "2.36-9+deb12u9", Arch: "amd64", SHA256: hexOf('b', 64), License: "LGPL-2.1-or-later AND GPL-2.0-or-later"},
		{Name: "libc6", Version: "2.36-9+deb12u9", Arch: "i386", SHA256: hexOf('d', 64)},
		{Name: "tzdata", Version: "2024a-0+deb12u1", Arch: "all", SHA256: hexOf('e', 64)},
	}
}

const testImageID = "0123456789abcdef0123456789abcdef01234567"

func TestSBOM(t *testing.T) {
	created := time.Unix(1700000000, 0).In(time.FixedZone("X", 3600))
	out, err := SBOM(testImageID, "gpurack-h100-550", created, testPackages())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(out, []byte("}\n")) {
		t.Errorf("SBOM does not end with a newline")
	}
	// Deterministic: reversed input, same bytes.
	rev := testPackages()
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	again, err := SBOM(testImageID, "gpurack-h100-550", created, rev)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, again) {
		t.Errorf("SBOM depends on input order")
	}

	var doc struct {
		SPDXVersion       string `json:"spdxVersion"`
		DataLicense       string `json:"dataLicense"`
		SPDXID            string `json:"SPDXID"`
		Name              string `json:"name"`
		DocumentNamespace string `json:"documentNamespace"`
		CreationInfo      struct {
			Created  string   `json:"created"`
			Creators []string `json:"creators"`
		} `json:"creationInfo"`
		Packages []struct {
			Name             string `json:"name"`
			SPDXID           string `json:"SPDXID"`
			VersionInfo      string `json:"versionInfo"`
			DownloadLocation string `json:"downloadLocation"`
			FilesAnalyzed    *bool  `json:"filesAnalyzed"`
			LicenseConcluded string `json:"licenseConcluded"`
			LicenseDeclared  string `json:"licenseDeclared"`
			CopyrightText    string `json:"copyrightText"`
			Checksums        []struct {
				Algorithm     string `json:"algorithm"`
				ChecksumValue string `json:"checksumValue"`
			} `json:"checksums"`
			ExternalRefs []struct {
				ReferenceCategory string `json:"referenceCategory"`
				ReferenceType     string `json:"referenceType"`
				ReferenceLocator  string `json:"referenceLocator"`
			} `json:"externalRefs"`
		} `json:"packages"`
		Relationships []struct {
			SPDXElementID      string `json:"spdxElementId"`
			RelationshipType   string `json:"relationshipType"`
			RelatedSPDXElement string `json:"relatedSpdxElement"`
		} `json:"relationships"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("SBOM is not the expected JSON: %v\n%s", err, out)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.DataLicense != "CC0-1.0" || doc.SPDXID != "SPDXRef-DOCUMENT" || doc.Name != "gpurack-h100-550" {
		t.Errorf("document header: %+v", doc)
	}
	if doc.DocumentNamespace != "https://gpurack.invalid/spdx/images/"+testImageID || strings.Contains(doc.DocumentNamespace, "#") {
		t.Errorf("documentNamespace = %q", doc.DocumentNamespace)
	}
	if doc.CreationInfo.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("created = %q, want the SOURCE_DATE_EPOCH in UTC", doc.CreationInfo.Created)
	}
	if len(doc.CreationInfo.Creators) != 1 || doc.CreationInfo.Creators[0] != "Tool: gpuimage" {
		t.Errorf("creators = %v", doc.CreationInfo.Creators)
	}
	if len(doc.Packages) != 6 {
		t.Fatalf("%d packages, want the image + 5", len(doc.Packages))
	}
	image := doc.Packages[0]
	if image.SPDXID != "SPDXRef-Image" || image.VersionInfo != testImageID {
		t.Errorf("image package = %+v", image)
	}

	idRE := regexp.MustCompile(`^SPDXRef-[A-Za-z0-9.-]+$`)
	ids := map[string]bool{"SPDXRef-DOCUMENT": true}
	var order []string
	for _, p := range doc.Packages {
		if !idRE.MatchString(p.SPDXID) {
			t.Errorf("SPDXID %q has characters outside [A-Za-z0-9.-]", p.SPDXID)
		}
		if ids[p.SPDXID] {
			t.Errorf("SPDXID %q used twice", p.SPDXID)
		}
		ids[p.SPDXID] = true
		if p.DownloadLocation != "NOASSERTION" || p.FilesAnalyzed == nil || *p.FilesAnalyzed {
			t.Errorf("%s: downloadLocation %q filesAnalyzed %v", p.Name, p.DownloadLocation, p.FilesAnalyzed)
		}
		if p.SPDXID == "SPDXRef-Image" {
			continue
		}
		order = append(order, p.Name+"/"+p.ExternalRefs[0].ReferenceLocator)
		if len(p.Checksums) != 1 || p.Checksums[0].Algorithm != "SHA256" || len(p.Checksums[0].ChecksumValue) != 64 {
			t.Errorf("%s: checksums %+v", p.Name, p.Checksums)
		}
		if len(p.ExternalRefs) != 1 || p.ExternalRefs[0].ReferenceCategory != "PACKAGE-MANAGER" || p.ExternalRefs[0].ReferenceType != "purl" {
			t.Errorf("%s: externalRefs %+v", p.Name, p.ExternalRefs)
		}
	}
	wantOrder := []string{
		"bsdutils/pkg:deb/debian/bsdutils@1:2.38.1-5+deb12u1?arch=amd64",
		"libc6/pkg:deb/debian/libc6@2.36-9+deb12u9?arch=amd64",
		"libc6/pkg:deb/debian/libc6@2.36-9+deb12u9?arch=i386",
		"tzdata/pkg:deb/debian/tzdata@2024a-0+deb12u1?arch=all",
		"util-linux/pkg:deb/debian/util-linux@2.38.1-5+deb12u1?arch=amd64",
	}
	if strings.Join(order, "\n") != strings.Join(wantOrder, "\n") {
		t.Errorf("packages/purls:\n%s\nwant\n%s", strings.Join(order, "\n"), strings.Join(wantOrder, "\n"))
	}
	if got := doc.Packages[1].SPDXID; got != "SPDXRef-Package-deb-bsdutils-1-2.38.1-5-deb12u1-amd64" {
		t.Errorf("bsdutils SPDXID = %q", got)
	}
	if doc.Packages[1].LicenseDeclared != "GPL-2.0-or-later" || doc.Packages[5].LicenseDeclared != "NOASSERTION" {
		t.Errorf("licenseDeclared: %q, %q", doc.Packages[1].LicenseDeclared, doc.Packages[5].LicenseDeclared)
	}

	// Relationships: the document DESCRIBES the image, which CONTAINS each
	// package; every element referred to exists.
	if len(doc.Relationships) != 6 {
		t.Fatalf("%d relationships, want 6", len(doc.Relationships))
	}
	r0 := doc.Relationships[0]
	if r0.SPDXElementID != "SPDXRef-DOCUMENT" || r0.RelationshipType != "DESCRIBES" || r0.RelatedSPDXElement != "SPDXRef-Image" {
		t.Errorf("first relationship = %+v", r0)
	}
	for _, r := range doc.Relationships[1:] {
		if r.SPDXElementID != "SPDXRef-Image" || r.RelationshipType != "CONTAINS" || !ids[r.RelatedSPDXElement] {
			t.Errorf("relationship %+v", r)
		}
	}
}

func TestSBOMIDCollision(t *testing.T) {
	// "a+b" and "a-b" both sanitise to "a-b".
	pkgs := []Package{
		{Name: "a+b", Version: "1", Arch: "amd64", SHA256: hexOf('1', 64)},
		{Name: "a-b", Version: "1", Arch: "amd64", SHA256: hexOf('2', 64)},
	}
	out, err := SBOM(testImageID, "x", time.Unix(0, 0), pkgs)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"SPDXRef-Package-deb-a-b-1-amd64"`)) || !bytes.Contains(out, []byte(`"SPDXRef-Package-deb-a-b-1-amd64-2"`)) {
		t.Errorf("colliding SPDXIDs were not made unique:\n%s", out)
	}
}

func TestSBOMRejects(t *testing.T) {
	good := testPackages()
	created := time.Unix(1700000000, 0)
	with := func(f func(p *Package)) []Package {
		ps := testPackages()
		f(&ps[0])
		return ps
	}
	tests := []struct {
		name    string
		imageID string
		created time.Time
		pkgs    []Package
		want    string
	}{
		{"bad image id", "XYZ", created, good, "image id"},
		{"zero time", testImageID, time.Time{}, good, "created"},
		{"bad sha", testImageID, created, with(func(p *Package) { p.SHA256 = "abc" }), "sha256"},
		{"empty name", testImageID, created, with(func(p *Package) { p.Name = "" }), "package name"},
		{"upper-case name", testImageID, created, with(func(p *Package) { p.Name = "Util" }), "package name"},
		{"bad version", testImageID, created, with(func(p *Package) { p.Version = "1 2" }), "version"},
		{"bad arch", testImageID, created, with(func(p *Package) { p.Arch = "" }), "architecture"},
		{"bad license", testImageID, created, with(func(p *Package) { p.License = "GPL; rm -rf" }), "license"},
		{"duplicate", testImageID, created, append(testPackages(), Package{Name: "libc6", Version: "2.36-9", Arch: "amd64", SHA256: hexOf('f', 64)}), "listed twice"},
	}
	for _, tt := range tests {
		_, err := SBOM(tt.imageID, "x", tt.created, tt.pkgs)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want one containing %q", tt.name, err, tt.want)
		}
	}
	// No packages is a valid (if odd) SBOM.
	if _, err := SBOM(testImageID, "x", created, nil); err != nil {
		t.Errorf("empty package list: %v", err)
	}
}
