"""Reading a stream in the block order: one worker's windows of shards, each
window's samples in its keyed permutation.

    WindowReader(stream)  ──▶ this worker's windows this epoch (ShardStream.windows)
    next(reader)          ──▶ entering a window: its shards fetched (from a store: the window's
                              shards and the next ``prefetch`` after them, in the background)
                          ──▶ the window's next positions (READ_POSITIONS at a time) located:
                              (shard, sample) by the block order (sampler/block_order.py)
                          ──▶ each sample read from its shard's file or local copy, checked as
                              ShardDataset[i] checks it, decoded and transformed
                          ──▶ leaving a window: its shards let go (their open files, local copies)

The reader saves where it stands, in a few integers: the epoch and the
fingerprint of this worker's shards (their count and CRC-32), to check that
a state fits (without shuffled shards, each epoch has the same windows, but
their samples in another order), the window it is in and the next position
in it; a resumed reader goes on from the sample after the last one delivered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, Sequence, Sized

from ..sampler.arguments import is_int
from ..sampler.block_order import BlockEpoch
from ..sampler.fingerprint import values_crc32

if TYPE_CHECKING:
    from ..store import Store

#: Positions of a window located at once (one vectorized step of the block order).
READ_POSITIONS = 256


class _WindowShards(Protocol):
    """What a WindowReader reads of its dataset (ShardDataset provides it; stream.py's Shards names it all)."""

    @property
    def paths(self) -> Sequence[str]: ...

    @property
    def indexes(self) -> Sequence[Sized]: ...

    @property
    def store(self) -> Optional[Store]: ...

    def raws(self, shard: int, start: int, stop: int) -> list[dict]: ...

    def prepare(self, sample: dict) -> Any: ...

    def open_shard(self, shard: int) -> str: ...

    def close_shard(self, shard: int) -> None: ...


class _Windowed(Protocol):
    """What a WindowReader reads of its stream (a ShardStream with ``shards_per_window``)."""

    @property
    def dataset(self) -> Any: ...

    @property
    def prefetch(self) -> int: ...

    @property
    def shards_per_window(self) -> Optional[int]: ...

    def epoch_order(self) -> BlockEpoch: ...

    def windows(self) -> list[int]: ...

    def shards(self) -> list[int]: ...


class WindowReader:
    """One pass of a windowed ShardStream in one worker (see the module)."""

    def __init__(self, stream: _Windowed):
        self._stream = stream
        self._dataset: _WindowShards = stream.dataset
        self._order = stream.epoch_order()
        self._windows = stream.windows()
        self._shards = stream.shards()
        self._shards_crc32 = values_crc32(self._shards)
        self._position = 0  # in self._windows
        self._sample = 0  # in that window: the next one to deliver
        self._entered: Optional[int] = None  # the window whose shards are open
        self._ahead: list[tuple[int, int]] = []  # located, not yet delivered: (shard, sample), reversed

    def __iter__(self) -> WindowReader:
        return self

    def __next__(self) -> Any:
        ds = self._dataset
        while self._position < len(self._windows):
            window = self._windows[self._position]
            span = self._order.window_span(window)
            if self._sample < len(span):
                if self._entered != window:
                    self._enter(window)
                if not self._ahead:
                    stop = min(len(span), self._sample + READ_POSITIONS)
                    shards, samples = self._order.locate(range(span.start + self._sample, span.start + stop))
                    self._ahead = list(zip(shards.tolist(), samples.tolist()))[::-1]
                shard, sample = self._ahead.pop()
                self._sample += 1
                ds.open_shard(shard)  # (its local copy, fetched whole: never a ranged read per sample)
                return ds.prepare(ds.raws(shard, sample, sample + 1)[0])
            self._leave(window)
            self._position, self._sample = self._position + 1, 0
        raise StopIteration

    def _enter(self, window: int) -> None:
        """Start fetching the window's shards, and the next ``prefetch`` shards of this worker's after them."""
        ds = self._dataset
        if self._entered is not None:
            self._leave(self._entered)
        if ds.store is not None:  # (this worker's shards: its windows' in turn, K each but the epoch's last)
            at = self._position * int(self._stream.shards_per_window or 1)
            ahead = len(self._order.window_shards(window)) + max(0, int(self._stream.prefetch))
            # (a shard without samples is never read: not fetched)
            ds.store.prefetch([ds.paths[k] for k in self._shards[at : at + ahead] if len(ds.indexes[k])])
        self._entered = window

    def _leave(self, window: int) -> None:
        for shard in self._order.window_shards(window).tolist():
            self._dataset.close_shard(shard)
        self._entered, self._ahead = None, []

    def state_dict(self) -> dict:
        return {
            "shards_per_window": self._stream.shards_per_window,
            "epoch": self._order.epoch,
            "num_shards": len(self._shards),
            "shards_crc32": self._shards_crc32,
            "position": self._position,
            "sample": self._sample,
        }

    def load_state_dict(self, state: dict) -> None:
        check_window(state, self._stream.shards_per_window)
        mine = {"num_shards": len(self._shards), "shards_crc32": self._shards_crc32}
        saved = {key: state.get(key) for key in mine}
        if state.get("epoch", self._order.epoch) != self._order.epoch:  # (a state saved before it was recorded: none)
            raise ValueError(
                f"ShardStream.load_state_dict: the state was saved in epoch {state['epoch']} and this stream is in "
                f"epoch {self._order.epoch}, whose windows hold their samples in another order; call "
                f"stream.set_epoch({state['epoch']}) before iter(stream) to resume it"
            )
        if saved != mine:
            raise ValueError(
                f"ShardStream.load_state_dict: the state was saved by a reader of other shards ({saved}; this "
                f"worker's: {mine}): another shuffle seed, epoch, number of workers or ranks; resume with the "
                f"settings that saved it"
            )
        position: Any = state.get("position")
        sample: Any = state.get("sample")
        count = len(self._windows)
        if not (is_int(position) and is_int(sample) and 0 <= position <= count and 0 <= sample) or sample > (
            len(self._order.window_span(self._windows[position])) if position < count else 0
        ):  # (a sample outside its window's span would read another window's shards: another worker's)
            raise ValueError(
                f"ShardStream.load_state_dict: the state's window {position!r} and sample {sample!r} are outside "
                f"this worker's {count} windows; pass a state its state_dict() returned"
            )
        if self._entered is not None:
            self._leave(self._entered)
        self._position, self._sample = int(position), int(sample)


def check_window(state: Mapping[str, Any], shards_per_window: Optional[int]) -> None:
    """Raise ValueError when a stream reader's saved ``state`` was saved with other windows (or none)."""
    saved_window = state.get("shards_per_window")
    if saved_window != shards_per_window:
        raise ValueError(
            f"ShardStream.load_state_dict: the state was saved by a stream with shards_per_window={saved_window}, "
            f"this one has {shards_per_window}; resume with the settings that saved it"
        )


def check_reader_state(state: Mapping[str, Any], shards: list[int]) -> None:
    """Raise ValueError when a shard-by-shard reader's saved ``state`` was
    not saved by a reader of these ``shards`` (this worker's, in order)."""
    check_window(state, None)
    if list(state["shards"]) != shards:
        raise ValueError(
            f"ShardStream.load_state_dict: the state's shards {list(state['shards'])[:8]} are not this worker's "
            f"{shards[:8]} (another shuffle seed, epoch, number of workers or ranks); resume with the "
            f"settings that saved it"
        )


__all__ = ["WindowReader", "check_reader_state", "READ_POSITIONS"]
