package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SPDX document constants (SPDX 2.3, https://spdx.github.io/spdx-spec/v2.3/).
const (
	spdxVersion     = "SPDX-2.3"
	spdxDataLicense = "CC0-1.0" // §6.2: the only value allowed
	spdxDocumentID  = "SPDXRef-DOCUMENT"
	spdxImageID     = "SPDXRef-Image"
	spdxNoAssertion = "NOASSERTION"
	spdxCreator     = "Tool: gpuimage"

	// spdxNamespaceBase starts every document namespace (§6.5: a unique
	// absolute URI, not necessarily resolvable). The .invalid top-level
	// domain (RFC 2606) can never name a real host, so the URI cannot be
	// mistaken for a location, and the image id makes it unique.
	spdxNamespaceBase = "https://gpurack.invalid/spdx/images/"
)

// Package is one Debian package installed in an image, as the lock file
// pins it (docs/contracts.md §8).
type Package struct {
	// Name, Version and Arch are the Debian package name, version (epoch
	// included, for example "1:2.38.1-5+deb12u1") and architecture
	// ("amd64", "all").
	Name    string
	Version string
	Arch    string
	// SHA256 is the lowercase hex SHA-256 of the .deb file.
	SHA256 string
	// License is the package's SPDX license expression, for example
	// "GPL-2.0-only OR MIT"; empty means NOASSERTION (Debian's copyright
	// files are not machine-readable SPDX).
	License string
}

type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string            `json:"name"`
	SPDXID           string            `json:"SPDXID"`
	VersionInfo      string            `json:"versionInfo"`
	DownloadLocation string            `json:"downloadLocation"`
	FilesAnalyzed    bool              `json:"filesAnalyzed"`
	Checksums        []spdxChecksum    `json:"checksums,omitempty"`
	LicenseConcluded string            `json:"licenseConcluded"`
	LicenseDeclared  string            `json:"licenseDeclared"`
	CopyrightText    string            `json:"copyrightText"`
	ExternalRefs     []spdxExternalRef `json:"externalRefs,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

// SBOM returns the image's SPDX 2.3 JSON document (sbom.spdx.json).
//
// The document is named name and describes one package for the image
// itself (SPDXRef-Image, version = imageID), which CONTAINS one package per
// entry of pkgs. Each Debian package has downloadLocation NOASSERTION, its
// .deb's SHA256 checksum, and a purl external reference
// pkg:deb/debian/NAME@VERSION?arch=ARCH. created is written as the
// document's creation time in UTC; pass time.Unix(SOURCE_DATE_EPOCH, 0) so
// that a rebuild gives the same bytes. The output is deterministic:
// packages are sorted by name, architecture and version, and the document
// namespace is derived from imageID.
func SBOM(imageID, name string, created time.Time, pkgs []Package) ([]byte, error) {
	var errs []error
	if !isHex(imageID, 40) {
		errs = append(errs, fmt.Errorf("image id %q must be 40 lowercase hex characters", imageID))
	}
	if err := checkText(name); err != nil {
		errs = append(errs, fmt.Errorf("document name: %w", err))
	}
	if created.IsZero() || created.Year() > 9999 || created.Before(time.Unix(0, 0)) {
		errs = append(errs, fmt.Errorf("created time %v is out of range: pass time.Unix(SOURCE_DATE_EPOCH, 0)", created))
	}
	sorted := slices.Clone(pkgs)
	slices.SortFunc(sorted, func(a, b Package) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		if c := strings.Compare(a.Arch, b.Arch); c != 0 {
			return c
		}
		return strings.Compare(a.Version, b.Version)
	})
	for i, p := range sorted {
		if err := checkPackage(p); err != nil {
			errs = append(errs, err)
		}
		if i > 0 && sorted[i-1].Name == p.Name && sorted[i-1].Arch == p.Arch {
			errs = append(errs, fmt.Errorf("package %s (%s) is listed twice (versions %q and %q): an image holds one version per package and architecture", p.Name, p.Arch, sorted[i-1].Version, p.Version))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("SBOM: %w", err)
	}

	doc := spdxDocument{
		SPDXVersion:       spdxVersion,
		DataLicense:       spdxDataLicense,
		SPDXID:            spdxDocumentID,
		Name:              name,
		DocumentNamespace: spdxNamespaceBase + imageID,
		CreationInfo: spdxCreationInfo{
			Created:  created.UTC().Format("2006-01-02T15:04:05Z"),
			Creators: []string{spdxCreator},
		},
		Packages: []spdxPackage{{
			Name:             name,
			SPDXID:           spdxImageID,
			VersionInfo:      imageID,
			DownloadLocation: spdxNoAssertion,
			LicenseConcluded: spdxNoAssertion,
			LicenseDeclared:  spdxNoAssertion,
			CopyrightText:    spdxNoAssertion,
		}},
		Relationships: []spdxRelationship{{
			SPDXElementID:      spdxDocumentID,
			RelationshipType:   "DESCRIBES",
			RelatedSPDXElement: spdxImageID,
		}},
	}
	used := map[string]bool{spdxDocumentID: true, spdxImageID: true}
	for _, p := range sorted {
		id := packageSPDXID(p, used)
		license := p.License
		if license == "" {
			license = spdxNoAssertion
		}
		doc.Packages = append(doc.Packages, spdxPackage{
			Name:             p.Name,
			SPDXID:           id,
			VersionInfo:      p.Version,
			DownloadLocation: spdxNoAssertion,
			Checksums:        []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: p.SHA256}},
			LicenseConcluded: spdxNoAssertion,
			LicenseDeclared:  license,
			CopyrightText:    spdxNoAssertion,
			ExternalRefs: []spdxExternalRef{{
				ReferenceCategory: "PACKAGE-MANAGER",
				ReferenceType:     "purl",
				ReferenceLocator:  debPURL(p),
			}},
		})
		doc.Relationships = append(doc.Relationships, spdxRelationship{
			SPDXElementID:      spdxImageID,
			RelationshipType:   "CONTAINS",
			RelatedSPDXElement: id,
		})
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("SBOM: %w", err)
	}
	return buf.Bytes(), nil
}

func checkPackage(p Package) error {
	what := fmt.Sprintf("package %q", p.Name)
	if !debToken(p.Name, "abcdefghijklmnopqrstuvwxyz0123456789+-.") || !isAlnum(p.Name[0]) {
		return fmt.Errorf("%s: a Debian package name is lowercase letters, digits, '+', '-' and '.', starting with a letter or digit", what)
	}
	if !debToken(p.Version, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.+-~:") {
		return fmt.Errorf("%s: version %q is not a Debian version", what, p.Version)
	}
	if !debToken(p.Arch, "abcdefghijklmnopqrstuvwxyz0123456789-") {
		return fmt.Errorf("%s: architecture %q is not a Debian architecture such as \"amd64\" or \"all\"", what, p.Arch)
	}
	if !isHex(p.SHA256, 64) {
		return fmt.Errorf("%s: sha256 %q must be 64 lowercase hex characters (the .deb's digest from the lock file)", what, p.SHA256)
	}
	if p.License != "" && !debToken(p.License, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.+-:() ") {
		return fmt.Errorf("%s: license %q is not an SPDX license expression", what, p.License)
	}
	return nil
}

// debToken reports whether s is non-empty, at most 256 bytes, and made of
// bytes from allowed.
func debToken(s, allowed string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(allowed, s[i]) < 0 {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// packageSPDXID returns "SPDXRef-Package-deb-NAME-VERSION-ARCH" with every
// character outside [A-Za-z0-9.-] replaced by '-' (SPDX 2.3 §7.2), plus
// "-2", "-3", … if sanitising made two packages' ids equal.
func packageSPDXID(p Package, used map[string]bool) string {
	raw := "SPDXRef-Package-deb-" + p.Name + "-" + p.Version + "-" + p.Arch
	b := []byte(raw)
	for i, c := range b {
		if !isAlnum(c) && c != '.' && c != '-' {
			b[i] = '-'
		}
	}
	id := string(b)
	for n := 2; used[id]; n++ {
		id = string(b) + "-" + strconv.Itoa(n)
	}
	used[id] = true
	return id
}

// debPURL returns the package URL of a Debian package
// (https://github.com/package-url/purl-spec, type "deb"):
// pkg:deb/debian/NAME@VERSION?arch=ARCH, percent-encoding any character
// outside [A-Za-z0-9.+~:_-] (none in a valid Debian name, version or
// architecture).
func debPURL(p Package) string {
	return "pkg:deb/debian/" + purlEscape(p.Name) + "@" + purlEscape(p.Version) + "?arch=" + purlEscape(p.Arch)
}

func purlEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isAlnum(c) || strings.IndexByte(".+~:_-", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
