package httpboot

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/ipxe"
)

// maxQuery bounds the /boot.ipxe query; real ones are ~120 bytes.
const maxQuery = 2048

// ParseIdentity turns the /boot.ipxe query into an Identity. It returns
// ok=false without error when the query carries no mac (the first request
// of iPXE, which gets the Identify script).
func ParseIdentity(rawQuery string) (id identity.Identity, ok bool, err error) {
	if len(rawQuery) > maxQuery {
		return identity.Identity{}, false, fmt.Errorf("query of %d bytes is longer than %d", len(rawQuery), maxQuery)
	}
	q, err := parseQuery(rawQuery)
	if err != nil {
		return identity.Identity{}, false, err
	}
	mac := q["mac"]
	if mac == "" {
		return identity.Identity{}, false, nil
	}
	id, err = identity.New(mac, q["uuid"], q["serial"])
	if err != nil {
		return identity.Identity{}, false, err
	}
	return id, true, nil
}

// parseQuery parses a query, refusing repeated keys (which would make two
// parties read different values) and invalid escapes.
func parseQuery(raw string) (map[string]string, error) {
	out := map[string]string{}
	for part := range strings.SplitSeq(raw, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		key, err := unescape(k)
		if err != nil {
			return nil, fmt.Errorf("query key %q: %w", k, err)
		}
		val, err := unescape(v)
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", key, err)
		}
		switch key {
		case "mac", "uuid", "serial":
			if _, dup := out[key]; dup {
				return nil, fmt.Errorf("query parameter %s given twice", key)
			}
			out[key] = val
		}
	}
	return out, nil
}

func unescape(s string) (string, error) {
	// iPXE's :uristring escapes everything but unreserved characters;
	// "+" stays a plus (it is not a form post).
	return urlPathUnescape(s)
}

// serveScript handles /boot.ipxe.
func (h *Handler) serveScript(w http.ResponseWriter, r *http.Request) {
	remote := remoteAddr(r)
	id, ok, err := ParseIdentity(r.URL.RawQuery)
	if err != nil {
		h.metrics.scripts.WithLabelValues("bad-request").Inc()
		h.log.Warn("boot.ipxe: bad query", "from", remote, "err", err)
		http.Error(w, "gpuboot: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !ok {
		h.writeScript(w, "identify", ipxe.Script{Action: ipxe.Identify, ScriptURL: h.ScriptURL()})
		return
	}
	target, err := h.booter.BootTarget(r.Context(), id, remote)
	if err != nil {
		h.scriptError(w, id, fmt.Errorf("boot target: %w", err))
		return
	}
	switch target.Action {
	case Hold:
		h.log.Info("boot.ipxe: hold", "identity", id.Key(), "from", remote)
		h.writeScript(w, "hold", ipxe.Script{Action: ipxe.Hold, ScriptURL: h.ScriptURL()})
	case Boot:
		s, err := h.bootScript(target)
		if err != nil {
			h.scriptError(w, id, err)
			return
		}
		h.log.Info("boot.ipxe: boot", "identity", id.Key(), "from", remote, "image", target.ImageID)
		h.writeScript(w, "boot", s)
	default:
		h.scriptError(w, id, fmt.Errorf("booter returned unknown action %d", target.Action))
	}
}

// bootScript builds the Boot script input for target, refusing an image
// that does not verify.
func (h *Handler) bootScript(target Target) (ipxe.Script, error) {
	img, err := h.images.get(target.ImageID)
	if err != nil {
		return ipxe.Script{}, fmt.Errorf("image %s: %w", target.ImageID, err)
	}
	cmdline, err := img.readSmall(manifest.ArtifactCmdline, 64<<10)
	if err != nil {
		return ipxe.Script{}, fmt.Errorf("image %s: %w", target.ImageID, err)
	}
	base := h.cfg.BaseURL + "/images/" + target.ImageID + "/"
	return ipxe.Script{
		Action:      ipxe.Boot,
		ScriptURL:   h.ScriptURL(),
		ImageID:     target.ImageID,
		KernelURL:   base + manifest.ArtifactKernel,
		InitrdURL:   base + manifest.ArtifactInitrd,
		RootfsURL:   base + manifest.ArtifactRootfs,
		Cmdline:     string(cmdline),
		ExtraArgs:   target.ExtraArgs,
		EnrollAddr:  h.cfg.EnrollAddr,
		EnrollCAPin: h.cfg.EnrollCAPin,
	}, nil
}

// scriptError answers with a script that shows the failure and retries,
// so the machine stays in the network-boot loop instead of falling through
// to another boot device.
func (h *Handler) scriptError(w http.ResponseWriter, id identity.Identity, err error) {
	h.metrics.scripts.WithLabelValues("error").Inc()
	h.log.Error("boot.ipxe: cannot boot machine", "identity", id.Key(), "err", err)
	h.writeScript(w, "", ipxe.Script{Action: ipxe.Hold, ScriptURL: h.ScriptURL(), HoldMessage: "cannot be booted now (see gpuboot log)"})
}

func (h *Handler) writeScript(w http.ResponseWriter, result string, s ipxe.Script) {
	body, err := ipxe.Render(s)
	if err != nil {
		h.metrics.scripts.WithLabelValues("error").Inc()
		h.log.Error("boot.ipxe: render", "err", err)
		http.Error(w, "gpuboot: cannot render the boot script; see the server log", http.StatusInternalServerError)
		return
	}
	if result != "" {
		h.metrics.scripts.WithLabelValues(result).Inc()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(body)
}
