#!/usr/bin/env python3
"""Train the digits classifier (gpurack workload sample, docs/workload-images.md).

Data: scikit-learn's digits dataset, shipped inside python3-sklearn (no download).
Environment:
  CHECKPOINT_DIR  where checkpoint.pt is written after every epoch (required)
  MODEL_PATH      where the final model is saved for the serve image (required)
  EPOCHS          how many epochs in all (default 10)
Each epoch prints "epoch N loss L accuracy A". A checkpoint is written to a temporary
file in CHECKPOINT_DIR, fsynced and renamed over checkpoint.pt, so a crash or a full
volume leaves the previous checkpoint intact; a failed write is logged and the run
exits 1. On start, an existing checkpoint is resumed ("resuming from epoch N").
"""

import errno
import io
import os
import signal
import sys
import tempfile

import torch
from sklearn.datasets import load_digits
from torch import nn

from device import pick_device
from digitsnet import make_model, to_input

SEED = 0
BATCH = 64
CHECKPOINT = "checkpoint.pt"


def log(msg):
    print(msg, flush=True)


def env(name, default=None):
    value = os.environ.get(name, default)
    if value is None or value == "":
        sys.exit(f"train: set {name} (see the image's documentation)")
    return value


def save_atomically(obj, path):
    """torch.save obj to path: a temporary file beside it, fsync, rename, fsync the directory.

    The object is serialised in memory first and written with plain writes: torch's own
    file writer, hitting a full volume, raises from a destructor and aborts the process,
    where a plain write raises OSError (ENOSPC) that the caller reports.
    """
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        os.fchmod(fd, 0o644)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def data():
    digits = load_digits()
    x, y = to_input(digits.data), torch.as_tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED))
    x, y = x[order], y[order]
    cut = len(y) * 4 // 5
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def train_epoch(model, opt, x, y, epoch, device):
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED + epoch))
    total = 0.0
    for i in range(0, len(y), BATCH):
        idx = order[i:i + BATCH]
        xb, yb = x[idx].to(device), y[idx].to(device)
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item() * len(idx)
    return total / len(y)


def accuracy(model, x, y, device):
    model.eval()
    with torch.no_grad():
        return (model(x.to(device)).argmax(dim=1).cpu() == y).float().mean().item()


def main():
    # As a container's PID 1 the process would ignore SIGTERM; exit on it instead (the
    # last checkpoint is whole whenever the signal comes).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ckpt_dir, model_path = env("CHECKPOINT_DIR"), env("MODEL_PATH")
    epochs = int(env("EPOCHS", "10"))
    device = pick_device()
    torch.manual_seed(SEED)
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ckpt_path = os.path.join(ckpt_dir, CHECKPOINT)
    done = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        done = ckpt["epoch"]
        log(f"resuming from epoch {done}")
    (xtr, ytr), (xte, yte) = data()
    for epoch in range(done + 1, epochs + 1):
        loss = train_epoch(model, opt, xtr, ytr, epoch, device)
        acc = accuracy(model, xte, yte, device)
        log(f"epoch {epoch} loss {loss:.4f} accuracy {acc:.4f}")
        try:
            save_atomically({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt_path)
        except OSError as e:
            reason = "the volume is full" if e.errno == errno.ENOSPC else e.strerror
            kept = f"epoch {epoch - 1}" if epoch > 1 else "none"
            log(f"error: cannot write the checkpoint of epoch {epoch} to {ckpt_path}: {reason}; "
                f"the previous checkpoint ({kept}) is intact")
            return 1
    try:
        save_atomically({"model": model.state_dict(), "epochs": epochs}, model_path)
    except OSError as e:
        log(f"error: cannot save the final model to {model_path}: {e.strerror}")
        return 1
    log(f"saved the final model to {model_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
