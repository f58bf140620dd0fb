"""``Any`` in conveyor's public signatures only where there is a reason:
torch's own signature leaves the same parameter untyped (or takes more than
its annotation says), or the value is the user's own (a sample, a batch).

Every bare ``Any`` (a parameter or return annotated ``Any`` itself, not a
container of user values such as a state dict's ``dict[str, Any]``) in a
signature of a name in ``conveyor.__all__`` must be listed below with its
reason; a new one fails until it is typed or listed, and a listed one that
is gone fails too, so the list stays true.
"""

from __future__ import annotations

import inspect

import conveyor

TORCH_UNTYPED = "torch.utils.data leaves it untyped"
TORCH_WIDER = "torch types it as a Dataset/Tensor, yet takes lists and arrays too; so does conveyor"
USERS = "the user's own value (a sample, a batch, an index or a key)"

#: "Name.method:parameter" -> why it is Any.
ALLOWED = {
    "DataLoader.__init__:dataset": TORCH_WIDER,
    "DataLoader.__init__:multiprocessing_context": TORCH_UNTYPED,
    "DataLoader.__init__:generator": TORCH_UNTYPED + " (a torch or numpy Generator here)",
    "Subset.__init__:dataset": TORCH_WIDER,
    "TensorDataset.__init__:tensors": TORCH_WIDER,
    "StackDataset.__init__:args": TORCH_WIDER,
    "StackDataset.__init__:kwargs": TORCH_WIDER,
    "random_split:dataset": TORCH_WIDER,
    "default_collate:return": TORCH_UNTYPED + "; a batch of the user's samples",
    "default_convert:data": TORCH_UNTYPED + "; " + USERS,
    "default_convert:return": TORCH_UNTYPED + "; " + USERS,
    "WorkerInfo.__init__:dataset": TORCH_UNTYPED + " (its WorkerInfo takes keyword attributes)",
    "WorkerInfo.__init__:rng": "conveyor's own attribute: a SampleRandom, or None where torch's WorkerInfo has none",
    "PadCollate.__init__:pad_value": "a fill value of the samples' own type, or a mapping of them per key",
    "PadCollate.collate_into:return": "a batch of the user's samples",
    "ShardedIterable.__init__:source": "an iterable or a callable returning one (the user's shards)",
    "ShardedSampler.__init__:sampler": "any sampler, read by duck typing (state_dict when it has one), as torch's "
    "samplers are",
    "SkippedSample.__init__:index": USERS,
    "Pack.__init__:docs": "any map-style dataset of the user's documents (len and []), read by duck typing",
    "RayWorkers.__init__:scheduling_strategy": "one of Ray's scheduling strategy objects or names, passed to Ray as "
    "it is",
}


def bare_anys() -> set[str]:
    found = set()
    for name in conveyor.__all__:
        obj = getattr(conveyor, name)
        if inspect.isclass(obj):
            methods = ["__init__"] + [k for k, v in vars(obj).items() if callable(v) and not k.startswith("_")]
            functions = [(f"{name}.{m}", getattr(obj, m)) for m in methods]
        elif inspect.isfunction(obj):
            functions = [(name, obj)]
        else:
            continue
        for label, function in functions:
            if not (inspect.isfunction(function) or inspect.ismethod(function)):
                continue
            signature = inspect.signature(function)
            annotations = {p.name: p.annotation for p in signature.parameters.values()}
            annotations["return"] = signature.return_annotation
            for parameter, annotation in annotations.items():
                if str(annotation) in ("Any", "typing.Any", "Optional[Any]", "Any | None"):
                    found.add(f"{label}:{parameter}")
    return found


def test_every_bare_any_in_a_public_signature_has_its_reason():
    unexplained = sorted(bare_anys() - set(ALLOWED))
    assert not unexplained, f"type these, or list them in ALLOWED with the reason: {unexplained}"


def test_the_reasons_list_names_only_anys_that_are_there():
    gone = sorted(set(ALLOWED) - bare_anys())
    assert not gone, f"no longer Any (remove them from ALLOWED): {gone}"
