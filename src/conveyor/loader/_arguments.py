"""The DataLoader's arguments, checked when it is built: each mistake is a
TypeError or ValueError at construction that names the argument and the
fix, with torch's words first where torch has a message for it.
"""

from __future__ import annotations

import multiprocessing
import numbers
import warnings
from typing import Any, Optional

from .._engine import portable
from .._engine.workers.launch import START_METHODS
from ..dataset import is_iterable_dataset, is_map_dataset
from ..ray_options import RayWorkers
from ..sampler.arguments import is_int


def check_iterable(value: Any, name: str) -> None:
    if not hasattr(value, "__iter__"):
        raise TypeError(
            f"{name} must be iterable (a Sampler or any object with __iter__), got "
            f"{type(value).__name__}; pass e.g. {name}=SequentialSampler(dataset)"
        )


#: DataLoader(worker_method=): worker processes, threads of the main process,
#: or Ray actors on a cluster (also a conveyor.RayWorkers(...) with their options).
WORKER_METHODS = ("multiprocessing", "thread", "ray")


def check_worker_method(worker_method: Any) -> None:
    if isinstance(worker_method, RayWorkers):
        return
    if not isinstance(worker_method, str) or worker_method not in WORKER_METHODS:
        raise ValueError(
            f"worker_method must be one of {WORKER_METHODS!r} (worker processes; threads of this "
            f"process for datasets that wait on I/O; Ray actors on a cluster) or conveyor.RayWorkers(...) "
            f"(Ray actors with their resources and placement), got {worker_method!r}"
        )


def local_processes(worker_method: Any) -> bool:
    """Whether ``worker_method`` starts worker processes on this machine."""
    return isinstance(worker_method, str) and worker_method == "multiprocessing"


def check_multiprocessing_context(context: Any, num_workers: int, worker_method: Any) -> Any:
    """The start method's context object (as torch keeps it), or None."""
    if context is None:
        return None
    if num_workers == 0:
        raise ValueError(
            f"multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
            f"but got num_workers={num_workers}"
        )
    if not local_processes(worker_method):
        name = "RayWorkers(...)" if isinstance(worker_method, RayWorkers) else repr(worker_method)
        raise ValueError(
            f"multiprocessing_context chooses how worker processes start on this machine, and "
            f"worker_method={name} starts none here; drop one of them"
        )
    if isinstance(context, str):
        valid = [m for m in START_METHODS if m in multiprocessing.get_all_start_methods()]
        if context not in valid:
            raise ValueError(
                f"multiprocessing_context option should specify a valid start method in {valid!r}, "
                f"but got multiprocessing_context={context!r}"
            )
        return multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            f"multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={context}"
        )
    return context


def check_workers(
    num_workers: Any,
    timeout: Any,
    prefetch_factor: Any,
    persistent_workers: bool,
    worker_method: Any = "multiprocessing",
) -> None:
    if not is_int(num_workers):
        raise TypeError(f"num_workers must be an int, got {type(num_workers).__name__} ({num_workers!r})")
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} ({timeout!r})")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative (conveyor: 0 waits without limit)")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to "
            "enable multiprocessing, otherwise set prefetch_factor to None."
        )
    if prefetch_factor is not None:
        if not is_int(prefetch_factor):
            raise TypeError(
                f"prefetch_factor must be an int, got {type(prefetch_factor).__name__} ({prefetch_factor!r})"
            )
        if prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if prefetch_factor == 0:
            raise ValueError(
                "prefetch_factor=0 would keep no batch in flight and load nothing; use 1 or more (the default is 2)"
            )
    if num_workers > 0 and local_processes(worker_method):
        unsupported = portable.workers_unsupported()
        if unsupported is not None:
            raise NotImplementedError(unsupported)
    if persistent_workers and num_workers == 0:
        raise ValueError(
            "persistent_workers option needs num_workers > 0 (conveyor: set num_workers, or drop "
            "persistent_workers=True)"
        )


def warn_worker_count(num_workers: int, worker_method: Any, available: int) -> None:
    """torch's warning for more worker processes than usable cores (threads
    wait on I/O, not cores, and Ray actors use the cluster's: no warning)."""
    if num_workers > available and local_processes(worker_method):
        warnings.warn(
            f"This DataLoader will create {num_workers} worker processes in total. Our suggested "
            f"max number of worker in current system is {available}, which is smaller than what this "
            f"DataLoader is going to create. Please be aware that excessive worker creation might get "
            f"DataLoader running slow or even freeze, lower the worker number to avoid potential "
            f"slowness/freeze if necessary.",
            stacklevel=3,
        )


def check_skip_bad_samples(value: Any, iterable: bool) -> Any:
    """The SkipBudget ``DataLoader(skip_bad_samples=value)`` means, or None."""
    from ..skips import SkipBudget

    budget = SkipBudget.of(value)
    if budget is not None and iterable:
        raise ValueError(
            "skip_bad_samples needs a map-style dataset: an IterableDataset's generator cannot go on after it "
            "raised; catch the error inside __iter__ and skip the item there instead"
        )
    return budget


def check_batching(
    iterable: bool, shuffle: Any, sampler: Any, batch_sampler: Any, batch_size: Any, drop_last: bool
) -> tuple:
    """The sampler and batching options, checked as torch checks them (and
    a few more); (shuffle, batch_size, drop_last) as the loader keeps them."""
    if iterable:
        check_iterable_options(shuffle, sampler, batch_sampler)
    else:
        shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError(
            "sampler option is mutually exclusive with shuffle (conveyor: a sampler decides the "
            "order itself; pass shuffle=False, or drop sampler= and keep shuffle=True)"
        )
    if sampler is not None:
        check_iterable(sampler, "sampler")
    if batch_sampler is not None:
        check_iterable(batch_sampler, "batch_sampler")
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                "drop_last (conveyor: the batch sampler already decides batches and order; leave "
                "those arguments at their defaults)"
            )
        batch_size = None
        drop_last = False
    elif batch_size is None:
        if drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive with "
                "drop_last (conveyor: pass drop_last=False, or give a batch_size)"
            )
    else:
        check_batch_size(batch_size)
    return shuffle, batch_size, drop_last


def default_prefetch(num_workers: int, prefetch_factor: Optional[int]) -> Optional[int]:
    """The prefetch_factor a pass uses: the one given, else torch's 2 with
    workers. Left to conveyor (not given), small batches may keep more in
    flight (executor/dispatch.py); a given one is an exact bound."""
    if num_workers > 0 and prefetch_factor is None:
        return 2
    return prefetch_factor


def check_stall_warning(stall_warning: Any) -> None:
    if not isinstance(stall_warning, numbers.Real) or isinstance(stall_warning, bool):
        raise TypeError(
            f"stall_warning must be a number of seconds, got {type(stall_warning).__name__} ({stall_warning!r})"
        )
    if stall_warning < 0:
        raise ValueError("stall_warning option should be non-negative (conveyor: 0 turns the warning off)")


def check_reads_in_flight(reads_in_flight: Any, dataset: Any = None) -> None:
    if not is_int(reads_in_flight) or reads_in_flight < 1:
        raise ValueError(
            f"reads_in_flight must be a positive int (samples of a batch read at once), got {reads_in_flight!r}"
        )
    if reads_in_flight > 1 and callable(getattr(dataset, "__getitems__", None)):
        warnings.warn(
            f"reads_in_flight={reads_in_flight} is not used: {type(dataset).__name__} defines __getitems__, which "
            f"reads a whole batch in one call (as torch calls it); read concurrently inside __getitems__, or "
            f"drop it to have conveyor read {reads_in_flight} samples at a time",
            stacklevel=3,
        )


def check_stats(collect_stats: Any, progress: Any) -> None:
    for name, value in (("collect_stats", collect_stats), ("progress", progress)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")
    if progress and not collect_stats:
        raise ValueError(
            "progress=True shows the loader's stats, which collect_stats=False turns off; drop one of them"
        )


def check_dataset(dataset: Any) -> bool:
    if is_iterable_dataset(dataset):
        return True
    if is_map_dataset(dataset):
        return False
    raise TypeError(
        f"dataset must be map-style (with __getitem__ and __len__) or iterable-style (with "
        f"__iter__), got {type(dataset).__name__} which has neither; subclass "
        f"conveyor.Dataset or conveyor.IterableDataset, or wrap your data in a list"
    )


def check_callables(collate_fn: Any, worker_init_fn: Any) -> None:
    for name, fn in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable or None, got {type(fn).__name__}")


def check_seed(seed: Any, generator: Any) -> None:
    if seed is None:
        return
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r})")
    if generator is not None:
        raise ValueError("seed and generator are mutually exclusive: both would decide the shuffle; pass one")


def check_iterable_options(shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
    if shuffle not in {False, None}:
        raise ValueError(
            f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
            f"shuffle={shuffle} (conveyor: an iterable dataset decides its own order; shuffle "
            f"inside its __iter__, e.g. with a buffer)"
        )
    if sampler is not None:
        raise ValueError(
            f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
            f"sampler={sampler} (conveyor: samplers choose indices, which an iterable dataset has not)"
        )
    if batch_sampler is not None:
        raise ValueError(
            f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but got "
            f"batch_sampler={batch_sampler} (conveyor: use batch_size= instead)"
        )


def check_batch_size(batch_size: Any) -> None:
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(
            f"batch_size should be a positive integer value, but got batch_size={batch_size!r} "
            f"(conveyor: pass an int >= 1, or batch_size=None to load single samples)"
        )
