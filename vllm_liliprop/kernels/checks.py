"""Shape and dtype checks for the Triton wrappers.

They read tensor metadata only (never values), so they cost no device synchronization and are
safe on the CUDA-graph hot path. Each failure raises ValueError naming the offending argument.
"""

import torch


def check_tensor(name: str, tensor, ndim: int, floating: bool = True) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")
    if floating and not tensor.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor (fp32/bf16/fp16), got {tensor.dtype}")


def check_same_device(**tensors) -> None:
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"tensors must share one device, got {listed}; move them with .to(device)")


def check_dim(name: str, tensor: torch.Tensor, dim: int, expected: int, what: str) -> None:
    if tensor.shape[dim] != expected:
        raise ValueError(
            f"{name}.shape[{dim}] must equal {what} ({expected}), got shape {tuple(tensor.shape)}"
        )


def check_k(k: int, vocab_size: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > vocab_size:
        raise ValueError(f"k ({k}) must not exceed the vocabulary size ({vocab_size}); lower k")


def row_coefficient(name: str, value, num_rows: int, device: torch.device):
    """alpha/beta as dels_fuse takes them -> (kernel argument, is_tensor, row stride).

    A number stays a kernel scalar. A 0-dim tensor is one weight for every row (stride 0), a
    1-D tensor, list or tuple of N weights is one weight per row (dels_fuse's per-slot schedule
    with slots as rows). A list/tuple costs a host-to-device copy: pass a tensor on the hot path.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or a per-row tensor, got a bool")
    if isinstance(value, (int, float)):
        return float(value), False, 0
    if isinstance(value, (list, tuple)):
        value = torch.tensor(value, dtype=torch.float32, device=device)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise ValueError(f"{name} must be a number or a floating tensor, got {value!r:.60}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but the logits are on {device}; move it there")
    if value.dim() == 0:
        return value.reshape(1), True, 0
    if value.dim() != 1 or value.shape[0] != num_rows:
        raise ValueError(
            f"{name} must be a number, a 0-dim tensor or a 1-D tensor of N={num_rows} per-row "
            f"weights, got shape {tuple(value.shape)}"
        )
    return value, True, value.stride(0)
