"""A batch whose samples differ in shape fails with an error that names the
samples by their dataset indices, as its header does ("sample indices [8,
9, 10, 11]" → "dataset[9] has shape (4,)"), and shows the PadCollate line
that pads them; where no index is known (an iterable dataset, a direct call
of default_collate), by their places in the batch."""

from __future__ import annotations

import re

import numpy as np
import pytest

import conveyor
import conveyor.torch as ct

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]

WORKERS = [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, worker_method="thread")]
WORKER_IDS = ["in-process", "processes", "threads"]


class Tokens:
    """Sample ``i`` is ``{"tokens": i's tokens, "label": i}``: three tokens,
    four for the indices in ``long``; the indices in ``bad`` raise OSError."""

    def __init__(self, n=12, long=(9,), bad=()):
        self.n, self.long, self.bad = n, set(long), set(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise OSError(f"truncated file for sample {i}")
        return {"tokens": np.full(4 if i in self.long else 3, i, np.int64), "label": i}


class TokenStream:
    """The same samples, as an iterable dataset (no indices to name)."""

    def __iter__(self):
        return (Tokens()[i] for i in range(12))


def collate_error(loader) -> str:
    with pytest.raises(RuntimeError) as caught:
        for _ in loader:
            pass
    return str(caught.value)


@pytest.mark.parametrize("kind", WORKERS, ids=WORKER_IDS)
def test_the_error_names_the_dataset_indices_of_the_samples_that_differ(kind):
    loader = conveyor.DataLoader(Tokens(), batch_size=4, **kind)
    text = collate_error(loader)
    assert 'cannot stack batch["tokens"]: dataset[8] has shape (3,) but dataset[9] has shape (4,)' in text, text
    if kind["num_workers"]:
        assert "sample indices [8, 9, 10, 11]" in text, text  # the header, in the same terms


@pytest.mark.parametrize("kind", WORKERS, ids=WORKER_IDS)
def test_the_indices_follow_the_sampler_s_order(kind):
    loader = conveyor.DataLoader(Tokens(long=(9, 7)), batch_sampler=[[5, 9, 2, 7, 0]], **kind)
    text = collate_error(loader)
    assert "dataset[5] has shape (3,) but dataset[9] has shape (4,)" in text, text
    assert "(2 of 5 samples differ from dataset[5]: dataset[9], dataset[7])" in text, text


@pytest.mark.parametrize("kind", WORKERS, ids=WORKER_IDS)
def test_a_skipped_sample_does_not_shift_the_names(kind):
    """With skip_bad_samples, the batch [8, 9, 10, 11] loses sample 8: the
    samples that differ are still named by their own indices."""
    loader = conveyor.DataLoader(Tokens(bad=(8,)), batch_size=4, skip_bad_samples=1, **kind)
    text = collate_error(loader)
    assert "dataset[9] has shape (4,) but dataset[10] has shape (3,)" in text, text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_torch_facade_names_them_too(num_workers):
    text = collate_error(ct.DataLoader(Tokens(), batch_size=4, num_workers=num_workers))
    assert "dataset[8] has shape (3,) but dataset[9] has shape (4,)" in text, text


@pytest.mark.parametrize("kind", WORKERS, ids=WORKER_IDS)
def test_the_error_shows_the_padcollate_line_and_that_line_works(kind):
    text = collate_error(conveyor.DataLoader(Tokens(), batch_size=4, **kind))
    suggested = re.search(r"collate_fn=(PadCollate\(.*?\))\)", text)
    assert suggested, text
    assert suggested.group(1) == 'PadCollate({"tokens": 0}, return_mask=True)'
    collate_fn = eval(suggested.group(1), {"PadCollate": conveyor.PadCollate})
    batches = list(conveyor.DataLoader(Tokens(), batch_size=4, collate_fn=collate_fn, **kind))
    padded = batches[2]["tokens"]
    assert padded.values.tolist() == [[8, 8, 8, 0], [9, 9, 9, 9], [10, 10, 10, 0], [11, 11, 11, 0]]
    assert padded.lengths.tolist() == [3, 4, 3, 3]
    assert padded.mask.sum(axis=1).tolist() == [3, 4, 3, 3]
    assert batches[2]["label"].tolist() == [8, 9, 10, 11]


def test_lists_of_numbers_get_a_padcollate_line_for_their_key():
    with pytest.raises(RuntimeError) as caught:
        conveyor.default_collate([{"ids": [1, 2, 3]}, {"ids": [4]}])
    text = str(caught.value)
    assert "sample 0 has length 3 but sample 1 has length 1" in text, text
    assert 'collate_fn=PadCollate({"ids": 0}, return_mask=True)' in text, text
    padded = conveyor.PadCollate({"ids": 0}, return_mask=True)([{"ids": [1, 2, 3]}, {"ids": [4]}])
    assert padded["ids"].values.tolist() == [[1, 2, 3], [4, 0, 0]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_indices_the_samples_are_named_by_their_place_in_the_batch(num_workers):
    text = collate_error(conveyor.DataLoader(TokenStream(), batch_size=4, num_workers=num_workers))
    # (With workers, each holds a whole copy of the stream: the same third batch fails.)
    assert "sample 0 has shape (3,) but sample 1 has shape (4,)" in text, text
    assert "dataset[" not in text, text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_numpy_indices_are_named_as_plain_numbers(num_workers):
    """A batch sampler that yields numpy arrays of indices: dataset[9], not dataset[np.int64(9)]."""
    loader = conveyor.DataLoader(Tokens(), batch_sampler=[np.array([5, 9, 2])], num_workers=num_workers)
    text = collate_error(loader)
    assert "dataset[5] has shape (3,) but dataset[9] has shape (4,)" in text, text
