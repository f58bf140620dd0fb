"""A TensorBoard writer handed to ``loader.on_stats`` as it is: the scalars
it writes are read back from the event file with TensorBoard's own
EventAccumulator, and agree with the loader's stats."""

from __future__ import annotations

import pytest

import conveyor

pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[dev]')")
pytest.importorskip("torch")


def _read_back(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_summary_writer_given_to_on_stats_gets_the_loader_s_figures(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    loader = conveyor.DataLoader(list(range(60)), batch_size=6, num_workers=1)
    writer = SummaryWriter(str(tmp_path))
    remove = loader.on_stats(writer, every_s=3600)  # (written at the end of each pass)
    for _ in range(2):
        for _ in loader:
            pass
    remove()
    writer.close()
    stats = loader.stats()
    scalars = _read_back(tmp_path)
    assert [step for step, _ in scalars["conveyor/samples_per_s"]] == [10, 20]  # stepped by batches delivered
    assert {"conveyor/data_wait_fraction", "conveyor/workers_busy_fraction", "conveyor/stage_s/fetch"} <= set(scalars)
    assert all(0.0 <= value <= 1.0 for _, value in scalars["conveyor/data_wait_fraction"])
    # Each call writes the interval since the one before: the two passes' waits add up to the total.
    total_wait = sum(value for _, value in scalars["conveyor/stage_s/wait"])
    assert total_wait == pytest.approx(stats.stages["wait"].total_s, rel=1e-4)


def test_any_object_with_add_scalar_is_a_stats_writer_and_other_objects_are_refused():
    written = []

    class Recorder:
        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

    loader = conveyor.DataLoader(list(range(8)), batch_size=4)
    loader.on_stats(Recorder(), every_s=3600)
    list(loader)
    assert ("conveyor/samples_per_s", loader.stats().samples_per_s, 2) in [
        (t, pytest.approx(v), s) for t, v, s in written
    ]
    with pytest.raises(TypeError, match="add_scalar"):
        loader.on_stats(object())
