// Package manifest defines a gpurack node image's manifest (manifest.json),
// its ed25519 signature (manifest.sig), the image id, and the image's SPDX
// 2.3 SBOM (sbom.spdx.json), as docs/contracts.md §7 pins them down. gpuimage
// writes these files; gpuimage verify and gpuboot check them with VerifyDir
// before serving an image.
//
// An image directory holds:
//
//	vmlinuz  initrd.img  rootfs.squashfs  cmdline  sbom.spdx.json
//	manifest.json  (Marshal's canonical bytes; lists every file above with size and sha256)
//	manifest.sig   (the raw 64-byte ed25519 signature over manifest.json's exact bytes)
//
// The signing keys are PEM files in the formats openssl reads (PKIX
// "PUBLIC KEY", PKCS#8 "PRIVATE KEY"), so a signature can be checked
// without gpurack:
//
//	openssl pkeyutl -verify -rawin -pubin -inkey pub.pem -sigfile manifest.sig -in manifest.json
//
// What the signature protects against is in docs/contracts.md §7: a tampered or
// corrupted store, not an attacker on the provisioning network.
//
// This package does not build images, lay out the store or serve it; it
// only reads and writes the files named here.
package manifest
