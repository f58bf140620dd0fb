"""Loading a checked state (a ``_records.LoaderState``) into a
loader's parts (its sampler, its generator, its dataset), undone if one of
them refuses, and the small helpers the tracker (_tracker.py) shares with it.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .._engine.errors import add_note
from .._engine.loading.copies import Copies
from ..sampler.replay import replay_point, restore_replay_point
from ._records import LoaderState
from ._settings import generator_source
from ._stateful import is_stateful

if TYPE_CHECKING:
    from ..loader._plan import Plan


def generator_state(plan: Plan) -> Any:
    source = generator_source(plan)
    return None if source is None else source.get_state()


def restore_generator(plan: Plan, generator_state: Any) -> None:
    source = generator_source(plan)
    if source is not None and generator_state is not None:
        source.set_state(generator_state)


def warn_fast_forward(plan: Plan, epoch: int, copies: Optional[Copies]) -> None:
    """Say so when copies without state will read their items again."""
    batches = 0 if copies is None else copies.reads_again
    if batches:
        warnings.warn(
            f"{type(plan.loading.dataset).__name__} (and its iterator) has no state_dict/load_state_dict: to resume "
            f"epoch {epoch}, the next iteration reads again, without collating or sending them, the items of "
            f"the {batches} batches already served. Give the dataset or its iterator "
            f"state_dict/load_state_dict to resume without re-reading.",
            stacklevel=5,
        )


def apply_parts(plan: Plan, state: LoaderState, replays: bool) -> None:
    """Load the state's parts into the sampler, the generator and the
    dataset. An iterable dataset's index sampler repeats one placeholder
    batch: where it stood changes nothing, so nothing is loaded into it
    (its saved position is kept for the next save; see ResumePoint)."""
    sampler = plan.sampling.index_sampler
    if not plan.iterable:
        if state.sampler is not None and is_stateful(sampler):
            sampler.load_state_dict(state.sampler)
        if replays and state.replay is not None:
            restore_replay_point(sampler, state.replay.to_dict(), plan.sampling.flavor)
    restore_generator(plan, state.generator_state)
    if state.dataset_state is not None and is_stateful(plan.loading.dataset):
        try:
            plan.loading.dataset.load_state_dict(state.dataset_state)
        except Exception as exc:
            add_note(
                exc,
                f"(conveyor: raised by {type(plan.loading.dataset).__name__}.load_state_dict, loading the state's "
                f"'dataset_state' given to DataLoader.load_state_dict; the loader is left as it was)",
            )
            raise


@contextlib.contextmanager
def undone_on_failure(plan: Plan, loads_dataset: bool) -> Iterator[None]:
    """Put the sampler, the generator and (when ``loads_dataset``) the
    dataset back as they were if the block raises (a sampler or dataset
    refusing its part of the state)."""
    sampler, dataset = plan.sampling.index_sampler, plan.loading.dataset
    sampler_before = replay_point(sampler, plan.sampling.flavor)
    generator_before = generator_state(plan)
    dataset_before = dataset.state_dict() if loads_dataset and is_stateful(dataset) else None
    try:
        yield
    except BaseException:
        restore_replay_point(sampler, sampler_before, plan.sampling.flavor)
        restore_generator(plan, generator_before)
        if dataset_before is not None:
            dataset.load_state_dict(dataset_before)
        raise
