"""Collation: turn a list of samples into one batch.

``default_collate`` follows ``torch.utils.data.default_collate`` rule for rule,
but its leaves are numpy arrays, so the core never needs torch::

    sample leaf (batch[0])          collated leaf
    ------------------------------  -------------------------------------------
    numpy array                     array of shape (B, *shape), dtype promoted
                                    as torch.stack would
    numpy scalar (np.bool_, number) array of shape (B,)
    int / bool / float              int64 / bool / float64 array (a batch led
                                    by an int takes torch's inferred dtype,
                                    e.g. [1, 2.5] -> float32)
    str / bytes                     the samples, unchanged
    torch.Tensor                    torch.stack(batch) (a tensor, as torch)
    Mapping                         same mapping type, values collated per key
    namedtuple                      same namedtuple, collated per field
    tuple                           list, collated per position
    other Sequence                  same sequence type where it can be rebuilt

A whole pipeline speaks torch in two steps that stay separate on purpose:
``default_collate`` (numpy, can run in a worker process, writing into shared
memory) and :func:`to_torch` (zero-copy ``torch.from_numpy``, in the main
process). ``torch_default_collate`` is the two composed and equals
``torch.utils.data.default_collate`` in values, dtypes, shapes and containers.

User types are taught with :func:`register_collate`; variable-length
sequences are padded by :class:`PadCollate`. Errors name the place in the
sample that failed (``batch["image"]``), the samples that disagree (by
dataset index when a loader collates, else by place in the batch) and how::

    RuntimeError: stack expects each tensor to be equal size, but got
    [3, 224, 224] at entry 0 and [3, 200, 224] at entry 5. default_collate:
    cannot stack batch["image"]: dataset[40] has shape (3, 224, 224) but
    dataset[17] has shape (3, 200, 224) ...

torch is imported only when a sample holds tensors (it is then already
loaded) or when a ``torch_*`` function, :func:`to_torch` or
:class:`TorchPadCollate` is called.

Modules, one concept each; each imports only modules above it in this list::

    allocation.py  the Allocator protocol: where outputs are allocated
    context.py     what stays fixed during one collation (name, allocator, padding)
    errors.py      paths into the sample (batch["image"][3]) and error messages
    dtypes.py      torch's dtype inference and promotion, on numpy dtypes
    registry.py    register_collate, and torch's collate_fn_map lookup
    leaves.py      collating leaves: arrays, numbers, tensors
    pad_leaf.py    padding one leaf along its first axis (numpy or torch)
    rules.py       the recursion: default_collate, collate, collate_into
    convert.py     default_convert, to_torch, torch_default_convert/_collate
    padding.py     PadCollate, TorchPadCollate, Padded
"""

from .allocation import Allocate, Allocator, HeapAllocator, allocate_batch  # noqa: F401  (the allocation protocol)
from .convert import array_to_tensor, default_convert, to_torch, torch_default_collate, torch_default_convert  # noqa: F401
from .errors import naming_samples  # noqa: F401  (the engine: errors name samples by dataset index)
from .padding import PadCollate, Padded, TorchPadCollate
from .registry import CollateFn, CollateFnMap, register_collate, unregister_collate  # noqa: F401
from .rules import collate, collate_into, default_collate  # noqa: F401  (collate_into: used by the engine, bench)

__all__ = [
    "default_collate",
    "default_convert",
    "collate",
    "torch_default_collate",
    "torch_default_convert",
    "to_torch",
    "register_collate",
    "unregister_collate",
    "PadCollate",
    "TorchPadCollate",
    "Padded",
]
