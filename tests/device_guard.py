"""A stand-in CUDA device for CPU tests: code runs on the CPU as if some tensors were on a GPU,
and an op that would mix devices on a real GPU raises.

What it is: ``GuardedCuda``, a ``TorchFunctionMode``. Inside it, a tensor is "on the GPU" when
``to_gpu`` (or code under test: ``.to("cuda")``, ``.cuda()``, a factory with ``device=`` a CUDA
device, ``nn.Module.to``) put it there, or when an op made it from such tensors. Such a tensor
reports ``device`` ``cuda:0`` and ``is_cuda`` True, so code that follows ``x.device`` takes
CUDA's branches; its data stays on the CPU, so ``.item()``, ``.tolist()`` and ``int()`` work
(host syncs, which CUDA allows) -- the gap the ``meta`` device leaves. ``.cpu()`` brings a tensor
back. The rules it enforces are CUDA's:

- an op may not take a GPU tensor and a CPU tensor of one or more dimensions (a 0-dim CPU
  tensor is a scalar, which CUDA kernels accept);
- indexing (``x[i]``, ``x[i] = v``, ``index_copy_``, ``index_put_``) accepts CPU index tensors
  on a GPU tensor, not GPU indices on a CPU tensor; ``copy_`` and ``to`` cross devices;
- a random op on the GPU may not draw from a CPU ``torch.Generator``.

What it is not: not a model of CUDA's numerics or memory, not a tracer; a tensor made outside
the mode and never passed to ``to_gpu`` is a CPU tensor. ``GuardedCuda.syncs`` counts the host
syncs (``item``, ``tolist``, ``int``, ``bool``, ``float`` of a GPU tensor) so a test can bound them.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

GPU = torch.device("cuda", 0)
T = torch.Tensor
INDEXING = {T.__getitem__, T.__setitem__, T.index_copy_, T.index_copy, T.index_put_,
            T.index_put, torch.index_copy, torch.index_put}
CROSSING = {T.copy_, torch._has_compatible_shallow_copy_type}
SYNCS = {T.item, T.tolist, T.__int__, T.__bool__, T.__float__, T.__index__}
PROPERTIES = {T.device.__get__: GPU, T.is_cuda.__get__: True}  # of a tensor on the GPU


class DeviceMixing(RuntimeError):
    """An op that would mix CUDA and CPU tensors on a real GPU."""


def _is_gpu_device(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class GuardedCuda(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self._gpu = WeakIdKeyDictionary()
        self.syncs = 0

    # ---- marking ---------------------------------------------------------------------------
    def on_gpu(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self._gpu

    def _mark(self, out, gpu: bool):
        def mark(t):
            if isinstance(t, torch.Tensor):
                if gpu:
                    self._gpu[t] = True
                else:
                    self._gpu.pop(t, None)
            return t
        tree_map(mark, out)
        return out

    def to_gpu(self, *tensors):
        """Put ``tensors`` (or a module's parameters and buffers) on the stand-in GPU."""
        for t in tensors:
            if isinstance(t, torch.nn.Module):
                self.to_gpu(*t.parameters(), *t.buffers())
            else:
                self._mark(t, True)
        return tensors[0] if len(tensors) == 1 else tensors

    # ---- the mode --------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in PROPERTIES and self.on_gpu(args[0]):
            return PROPERTIES[func]
        if func in SYNCS and self.on_gpu(args[0]):
            self.syncs += 1
        if func == T.data.__set__:
            func(*args, **kwargs)
            return self._mark(args[0], self.on_gpu(args[1]))
        if func in (T.to, T.cuda, T.cpu):
            return self._move(func, args, kwargs)
        to_gpu = _is_gpu_device(kwargs.get("device"))
        if to_gpu:
            kwargs["device"] = "cpu"
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        gpu = [t for t in tensors if self.on_gpu(t)]
        self._check(func, args, tensors, gpu, kwargs.get("generator"))
        out = func(*args, **kwargs)
        if func is T.__setitem__ or func in SYNCS:
            return out
        return self._mark(out, bool(gpu) or to_gpu) if (gpu or to_gpu) else out

    def _check(self, func, args, tensors, gpu, generator) -> None:
        if not gpu or func in CROSSING:
            return
        if func in INDEXING:
            if not self.on_gpu(args[0]):
                raise DeviceMixing(f"{_name(func)}: a CPU tensor indexed with a CUDA tensor")
            return
        cpu = [t for t in tensors if not self.on_gpu(t) and t.dim() > 0]
        if cpu:
            shapes = [tuple(t.shape) for t in cpu]
            raise DeviceMixing(f"{_name(func)}: CUDA tensors mixed with CPU tensors of shape "
                               f"{shapes}")
        if isinstance(generator, torch.Generator) and generator.device.type != "cuda":
            raise DeviceMixing(f"{_name(func)}: a CUDA op draws from a CPU generator")

    def _move(self, func, args, kwargs):
        """``to`` / ``cuda`` / ``cpu``: run on the CPU, mark by where the call sends it."""
        src, rest = args[0], list(args[1:])
        if func is T.cuda:
            dest, rest = True, []
        elif func is T.cpu:
            dest = False
        else:
            dest = self.on_gpu(src)
            for i, a in enumerate(rest):
                if isinstance(a, (str, torch.device)):
                    dest, rest[i] = _is_gpu_device(a), "cpu"
                elif isinstance(a, torch.Tensor):  # .to(other): other's device and dtype
                    dest, rest[i] = self.on_gpu(a), a.dtype
            if "device" in kwargs and kwargs["device"] is not None:
                dest, kwargs["device"] = _is_gpu_device(kwargs["device"]), "cpu"
        out = T.to(src, *rest, **kwargs) if func is T.to else src
        if out is src and dest != self.on_gpu(src):
            out = src.clone()  # a real move copies
        return self._mark(out, dest)


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
