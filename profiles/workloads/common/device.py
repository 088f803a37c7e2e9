"""Device choice shared by gpurack's workload samples.

CUDA when PyTorch sees a GPU, otherwise the CPU, and the choice is printed plainly:
Debian's python3-torch 1.13 is built without CUDA, so on these images
torch.cuda.is_available() is false and the samples compute on the CPU.
"""

import torch


def pick_device():
    """Return the torch device to compute on, after saying which and why."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        print(f"CUDA is available: computing on the GPU ({name})", flush=True)
        return torch.device("cuda")
    why = "this PyTorch build has no CUDA support" if torch.version.cuda is None else "no GPU is visible"
    print(f"CUDA is not available (torch.cuda.is_available() is false: {why}): computing on the CPU", flush=True)
    return torch.device("cpu")


if __name__ == "__main__":
    pick_device()
