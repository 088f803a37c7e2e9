#!/usr/bin/env python3
"""Serve the digits classifier over HTTP (gpurack workload sample).

POST /predict with {"pixels": [...]}: 64 numbers 0-16, or 8 rows of 8, an 8x8 digit as
scikit-learn's digits dataset has them. The answer is {"digit": D, "probabilities":
[...10]}. GET /healthz answers {"status": "ok"} once the model is loaded.
Environment: MODEL_PATH (the train image's final model), PORT (default 8080).
"""

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from device import pick_device
from digitsnet import PIXELS, SCALE, make_model, to_input

MAX_BODY = 64 * 1024


def load(path, device):
    if not os.path.exists(path):
        sys.exit(f"serve: no model at MODEL_PATH={path}; run the train image first")
    model = make_model().to(device)
    model.load_state_dict(torch.load(path, map_location=device)["model"])
    model.eval()
    return model


def parse_pixels(body):
    """The 64 pixel values of a request body, or a ValueError saying what is wrong."""
    try:
        req = json.loads(body)
    except ValueError as e:
        raise ValueError(f"the body is not JSON: {e}")
    pixels = req.get("pixels") if isinstance(req, dict) else None
    if isinstance(pixels, list) and len(pixels) == 8 and all(isinstance(r, list) for r in pixels):
        pixels = [v for row in pixels for v in row]
    if not isinstance(pixels, list) or len(pixels) != PIXELS:
        raise ValueError("want {\"pixels\": [64 numbers]} or 8 rows of 8")
    for v in pixels:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= SCALE:
            raise ValueError(f"pixel values are numbers from 0 to {SCALE:g}; got {v!r}")
    return pixels


class Handler(BaseHTTPRequestHandler):
    model = None
    device = None

    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"status": "ok", "device": str(self.device)})
        else:
            self.reply(404, {"error": "not found; use POST /predict or GET /healthz"})

    def do_POST(self):
        if self.path != "/predict":
            self.reply(404, {"error": "not found; use POST /predict or GET /healthz"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.reply(411, {"error": "Content-Length is required"})
            return
        if length > MAX_BODY:
            self.reply(413, {"error": f"the body is over {MAX_BODY} bytes"})
            return
        try:
            pixels = parse_pixels(self.rfile.read(length))
        except ValueError as e:
            self.reply(400, {"error": str(e)})
            return
        with torch.no_grad():
            probs = torch.softmax(self.model(to_input(pixels).to(self.device)), dim=1)[0].cpu()
        self.reply(200, {"digit": int(probs.argmax()), "probabilities": [round(float(p), 4) for p in probs]})


def main():
    # As a container's PID 1 the process would ignore SIGTERM; exit on it instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Handler.device = pick_device()
    Handler.model = load(os.environ.get("MODEL_PATH", "/work/model/digits.pt"), Handler.device)
    port = int(os.environ.get("PORT", "8080"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    print(f"serving the digits model on 0.0.0.0:{port} (POST /predict, GET /healthz)", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
