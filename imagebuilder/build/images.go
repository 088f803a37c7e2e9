package build

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

// ImageArchives checks every container image archive the profile at profilePath lists
// (see package ociarchive) and returns them in the profile's order. A missing or corrupt
// archive, or one that lacks the name the profile gives it, is an error naming the
// profile field, the file and the reason. gpuimage build, lock and lint call it.
func ImageArchives(profilePath string, p *profile.Profile) ([]*ociarchive.File, error) {
	var out []*ociarchive.File
	seen := map[string]int{}
	for i, im := range p.Images {
		field := fmt.Sprintf("%s: images[%d]", profilePath, i)
		f, err := ociarchive.InspectFile(profile.ArchivePath(profilePath, im.Path))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if im.Name != "" {
			want, err := ociarchive.Normalize(im.Name)
			if err != nil {
				return nil, fmt.Errorf("%s.name: %w", field, err)
			}
			if !slices.Contains(f.Names, want) {
				return nil, fmt.Errorf("%s: image archive %s does not carry %s (it carries %s); re-export it under that name or fix images[%d].name",
					field, f.Path, want, strings.Join(f.Names, ", "), i)
			}
		}
		if j, dup := seen[f.SHA256]; dup {
			return nil, fmt.Errorf("%s: image archive %s has the same content as images[%d]; list it once", field, f.Path, j)
		}
		seen[f.SHA256] = i
		out = append(out, f)
	}
	return out, nil
}

// archivePath is where an archive lives in the rootfs: named by its digest, so that
// the file names never collide and say which archive they are.
func archivePath(f *ociarchive.File) string {
	return path.Join(manifest.ImagesDir, f.SHA256+".tar")
}

// archiveDigests are the archives' digests in the profile's order, for the image id.
func archiveDigests(fs []*ociarchive.File) []string {
	var ds []string
	for _, f := range fs {
		ds = append(ds, f.SHA256)
	}
	return ds
}

// nodeArchives are the archives as the rootfs ships them.
func nodeArchives(fs []*ociarchive.File) []rootfs.ImageArchive {
	var out []rootfs.ImageArchive
	for _, f := range fs {
		out = append(out, rootfs.ImageArchive{Src: f.Path, Dst: archivePath(f), Names: f.Names})
	}
	return out
}

// manifestArchives are the archives as the manifest records them.
func manifestArchives(fs []*ociarchive.File) []manifest.ImageArchive {
	var out []manifest.ImageArchive
	for _, f := range fs {
		out = append(out, manifest.ImageArchive{Path: archivePath(f), SHA256: f.SHA256, Size: f.Size, Names: f.Names})
	}
	return out
}
