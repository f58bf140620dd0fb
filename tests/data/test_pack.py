"""conveyor.Pack: documents packed into fixed-length sequences (concat and
ffd), checked token by token against a reference written simply here.

(The test_pack_*.py files beside this one are about the `conveyor pack`
command, which writes shards.)
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor
from conveyor import DataLoader, Pack

WORKERS = [
    pytest.param(dict(num_workers=0), id="inline"),
    pytest.param(dict(num_workers=2, multiprocessing_context="fork"), id="fork"),
    pytest.param(dict(num_workers=2, worker_method="thread"), id="threads"),
]


def corpus(lengths: list[int]) -> list[np.ndarray]:
    """Documents whose tokens are all distinct: token = 1000 * (document + 1) + position."""
    return [1000 * (d + 1) + np.arange(n) for d, n in enumerate(lengths)]


def where(token: int) -> tuple[int, int]:
    """(document, position) of a token of ``corpus``."""
    return token // 1000 - 1, token % 1000


def check_sequence(item: dict, docs: list[np.ndarray], seq_len: int, pad_id: int = 0) -> list[tuple[int, int, int]]:
    """Check one sequence against what its tokens say (each names its document
    and position); its segments as (document, start, stop)."""
    assert set(item) == {"tokens", "segment_ids", "positions", "labels", "cu_seqlens", "num_segments"}
    for key in ("tokens", "segment_ids", "positions", "labels"):
        assert item[key].shape == (seq_len,), key
    real = int((item["segment_ids"] > 0).sum())
    segments: list[list[int]] = []  # [document, start, stop]
    for slot in range(real):
        doc, pos = where(int(item["tokens"][slot]))
        if segments and segments[-1][0] == doc and segments[-1][2] == pos:
            segments[-1][2] = pos + 1
        else:
            segments.append([doc, pos, pos + 1])
        assert item["segment_ids"][slot] == len(segments)
        assert item["positions"][slot] == pos
        following = docs[doc][pos + 1] if pos + 1 < len(docs[doc]) else -100
        assert item["labels"][slot] == following
    # padding only at the end
    assert (item["segment_ids"][real:] == 0).all() and (item["tokens"][real:] == pad_id).all()
    assert (item["labels"][real:] == -100).all() and (item["positions"][real:] == 0).all()
    n = len(segments)
    assert int(item["num_segments"]) == n
    cu = item["cu_seqlens"]
    assert cu.dtype == np.int32
    expected = [0] + list(np.cumsum([stop - start for _, start, stop in segments]))
    assert cu[: n + 1].tolist() == expected and (cu[n + 1 :] == real).all()
    return [tuple(s) for s in segments]


def all_segments(pack: Pack, docs: list[np.ndarray]) -> list[list[tuple[int, int, int]]]:
    return [check_sequence(pack[k], docs, pack.seq_len, pack.pad_id) for k in range(len(pack))]


lengths_strategy = st.lists(st.integers(0, 25), min_size=0, max_size=14)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, seq_len=st.integers(1, 12), drop_last=st.booleans(), shuffle=st.booleans())
def test_concat_cuts_the_documents_laid_end_to_end(lengths, seq_len, drop_last, shuffle):
    docs = corpus(lengths)
    pack = Pack(docs, seq_len, "concat", seed=3, shuffle=shuffle, drop_last=drop_last)
    sequences = all_segments(pack, docs)
    total = sum(lengths)
    assert len(pack) == (total // seq_len if drop_last else -(-total // seq_len))
    assert pack.tokens_dropped == (total % seq_len if drop_last else 0)
    # every sequence but a last padded one is full
    assert all(sum(b - a for _, a, b in s) == seq_len for s in sequences[: total // seq_len])
    # the sequences read one after another are whole documents in an order, then a prefix of one
    stream = [tuple(piece) for s in sequences for piece in s]
    runs: list[list[int]] = []
    for doc, start, stop in stream:
        if runs and runs[-1][0] == doc:
            assert runs[-1][2] == start
            runs[-1][2] = stop
        else:
            assert start == 0, "a document starts at its first token"
            runs.append([doc, start, stop])
    whole = [doc for doc, _, stop in runs if stop == lengths[doc]]
    assert all(stop == lengths[doc] for doc, _, stop in runs[:-1])
    assert len(set(doc for doc, _, _ in runs)) == len(runs)
    if drop_last:
        assert sum(stop - start for _, start, stop in runs) == total - total % seq_len
    else:  # every token exactly once
        assert sorted(whole) == [d for d, n in enumerate(lengths) if n]
    if not shuffle:
        assert [doc for doc, _, _ in runs] == [d for d, n in enumerate(lengths) if n][: len(runs)]


def starting_at_documents(lengths: list[int], seq_len: int, drop_last: bool) -> list[list[tuple[int, int, int]]]:
    """The reference for continue_documents=False: fill each sequence with the next documents; the one cut at
    its end loses its rest, and the next sequence starts with the document after it."""
    sequences, doc = [], 0
    while True:
        sequence, room = [], seq_len
        while doc < len(lengths) and room > 0:
            take = min(room, lengths[doc])
            if take:
                sequence.append((doc, 0, take))
            room, doc = room - take, doc + 1
        if not sequence or (room > 0 and drop_last):
            return sequences
        sequences.append(sequence)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, seq_len=st.integers(1, 12), drop_last=st.booleans())
def test_concat_can_start_every_sequence_at_a_document(lengths, seq_len, drop_last):
    docs = corpus(lengths)
    pack = Pack(docs, seq_len, "concat", shuffle=False, drop_last=drop_last, continue_documents=False)
    expected = starting_at_documents(lengths, seq_len, drop_last)
    assert all_segments(pack, docs) == expected
    assert pack.tokens_dropped == sum(lengths) - sum(b - a for s in expected for _, a, b in s)
    shuffled = Pack(docs, seq_len, "concat", seed=2, drop_last=drop_last, continue_documents=False)
    assert all(segments[0][1] == 0 for segments in all_segments(shuffled, docs))


def test_concat_example_by_hand():
    pack = Pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], seq_len=4, shuffle=False)
    assert len(pack) == 2 and pack.tokens_dropped == 1
    first, second = pack[0], pack[1]
    assert first["tokens"].tolist() == [1, 2, 3, 4] and first["labels"].tolist() == [2, 3, -100, 5]
    assert second["tokens"].tolist() == [5, 6, 7, 8] and second["segment_ids"].tolist() == [1, 2, 2, 2]
    assert second["positions"].tolist() == [1, 0, 1, 2]  # document 1 continues from the first sequence
    assert second["labels"].tolist() == [-100, 7, 8, 9]  # 9: the next token, though it is dropped
    assert second["cu_seqlens"][:3].tolist() == [0, 1, 4] and int(second["num_segments"]) == 2


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, seq_len=st.integers(1, 12), window=st.integers(1, 6), shuffle=st.booleans())
def test_ffd_never_splits_a_document_that_fits(lengths, seq_len, window, shuffle):
    docs = corpus(lengths)
    pack = Pack(docs, seq_len, "ffd", seed=1, window=window, shuffle=shuffle, pad_id=-1)
    pieces: dict[int, list[tuple[int, int]]] = {}
    for segments in all_segments(pack, docs):
        for doc, start, stop in segments:
            pieces.setdefault(doc, []).append((start, stop))
    assert sorted(pieces) == [d for d, n in enumerate(lengths) if n]
    for doc, got in pieces.items():
        n = lengths[doc]
        if n <= seq_len:
            assert got == [(0, n)]
        else:  # pieces of seq_len, and the rest
            assert sorted(got) == [(a, min(a + seq_len, n)) for a in range(0, n, seq_len)]
    assert pack.tokens_dropped == 0
    assert pack.fill_rate == pytest.approx(sum(lengths) / (len(pack) * seq_len) if len(pack) else 1.0)


def first_fit_decreasing(lengths: list[int], seq_len: int, window: int) -> list[list[tuple[int, int, int]]]:
    """The reference: each window's items (pieces of seq_len of a long document, and the rest), the longest
    first (ties in document order), each into the first bin with room, as a list."""
    bins: list[list[tuple[int, int, int]]] = []
    for first in range(0, len(lengths), window):
        items = []
        for doc in range(first, min(first + window, len(lengths))):
            items += [(doc, a, min(a + seq_len, lengths[doc])) for a in range(0, lengths[doc], seq_len)]
        items.sort(key=lambda item: -(item[2] - item[1]))
        these: list[list[tuple[int, int, int]]] = []
        for item in items:
            room = [b for b in these if sum(stop - start for _, start, stop in b) + item[2] - item[1] <= seq_len]
            if room:
                room[0].append(item)
            else:
                these.append([item])
        bins += these
    return bins


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, seq_len=st.integers(1, 12), window=st.integers(1, 6))
def test_ffd_packs_as_first_fit_decreasing_does(lengths, seq_len, window):
    docs = corpus(lengths)
    pack = Pack(docs, seq_len, "ffd", window=window, shuffle=False)
    expected = first_fit_decreasing(lengths, seq_len, window)
    assert sorted(all_segments(pack, docs)) == sorted(expected)


def test_ffd_packs_by_hand():
    pack = Pack([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], seq_len=4, method="ffd", shuffle=False)
    assert [pack[k]["tokens"].tolist() for k in range(len(pack))] == [[6, 7, 8, 9], [1, 2, 3, 10], [4, 5, 0, 0]]
    assert pack[1]["segment_ids"].tolist() == [1, 1, 1, 2] and pack[1]["labels"].tolist() == [2, 3, -100, -100]
    assert pack[2]["cu_seqlens"][:3].tolist() == [0, 2, 2] and int(pack[2]["num_segments"]) == 1


class LengthsOnly:
    """A corpus known by its lengths: reading a document fails."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        raise AssertionError(f"document {i} was read")


def test_ffd_fills_sequences_of_log_normal_documents_from_the_lengths_alone():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(5.0, 1.0, size=20_000).astype(np.int64) + 1, 8192)
    pack = Pack(LengthsOnly(lengths), 2048, "ffd", window=1000)
    assert pack.lengths_source == "docs.lengths"
    assert pack.fill_rate >= 0.9
    assert len(pack) * 2048 * pack.fill_rate == pytest.approx(lengths.sum())


class Counted:
    def __init__(self, docs):
        self.docs, self.read = docs, []

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        self.read.append(i)
        return self.docs[i]


@pytest.mark.parametrize("method", ["concat", "ffd"])
def test_a_sequence_reads_only_its_own_documents(method):
    lengths = [5, 9, 2, 30, 7, 1, 12, 8, 3, 6] * 5
    docs = Counted(corpus(lengths))
    pack = Pack(docs, 16, method, lengths=lengths, window=7)
    assert pack.lengths_source == "lengths=" and docs.read == []
    k = len(pack) - 2
    item = pack[k]
    assert sorted(set(docs.read)) == sorted({doc for doc, _, _ in pack.pieces(k).tolist()})
    check_sequence(item, docs.docs, 16)


def test_lengths_are_read_once_without_lengths_or_docs_lengths():
    docs = Counted(corpus([3, 4, 5]))
    pack = Pack(docs, 4)
    assert pack.lengths_source == "read" and docs.read == [0, 1, 2]
    assert pack.doc_lengths.tolist() == [3, 4, 5]


@pytest.mark.parametrize("method", ["concat", "ffd"])
def test_the_order_is_keyed_by_seed_and_epoch(method):
    docs = corpus([4, 7, 1, 9, 3, 6, 2, 8] * 4)

    def tokens(pack):
        return [pack[k]["tokens"].tolist() for k in range(len(pack))]

    pack = Pack(docs, 8, method, seed=0, window=10)
    first = tokens(pack)
    assert tokens(Pack(docs, 8, method, seed=0, window=10)) == first
    assert tokens(Pack(docs, 8, method, seed=1, window=10)) != first
    pack.set_epoch(1)
    assert pack.epoch == 1 and tokens(pack) != first
    assert tokens(Pack(docs, 8, method, seed=0, window=10, epoch=1)) == tokens(pack)
    pack.set_epoch(0)
    assert tokens(pack) == first


@pytest.mark.parametrize("method", ["concat", "ffd"])
def test_pickles_with_or_without_its_plan(method):
    docs = corpus([4, 7, 1, 9, 3, 6, 2, 8] * 3)
    pack = Pack(docs, 8, method, seed=2, window=5)
    fresh = pickle.loads(pickle.dumps(pack))
    expected = [pack[k] for k in range(len(pack))]
    planned = pickle.loads(pickle.dumps(pack))
    for copy in (fresh, planned):
        assert len(copy) == len(pack)
        for k, want in enumerate(expected):
            got = copy[k]
            assert all(np.array_equal(got[key], want[key]) for key in want)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("method", ["concat", "ffd"])
def test_same_sequences_for_any_workers(method, workers):
    docs = corpus([int(n) for n in np.random.default_rng(1).integers(1, 40, size=60)])
    pack = Pack(docs, 32, method, seed=4, window=16)
    loader = DataLoader(pack, batch_size=4, shuffle=True, seed=9, **workers)
    order = [list(b) for b in DataLoader(range(len(pack)), batch_size=4, shuffle=True, seed=9)]
    batches = list(loader)
    assert len(batches) == len(order)
    for batch, indices in zip(batches, order):
        for key in ("tokens", "segment_ids", "positions", "labels", "cu_seqlens", "num_segments"):
            assert np.array_equal(batch[key], np.stack([pack[int(k)][key] for k in indices])), key


def test_a_loader_state_resumes_and_refuses_another_packing():
    docs = corpus([5, 9, 2, 30, 7, 1, 12, 8, 3, 6] * 3)
    pack = Pack(docs, 16, "ffd", seed=0, window=8)
    expected = [b["tokens"].tolist() for b in DataLoader(pack, batch_size=2, shuffle=True, seed=1)]
    loader = DataLoader(pack, batch_size=2, shuffle=True, seed=1)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    again = DataLoader(Pack(docs, 16, "ffd", seed=0, window=8), batch_size=2, shuffle=True, seed=1)
    again.load_state_dict(state)
    assert [b["tokens"].tolist() for b in again] == expected[2:]
    other = DataLoader(Pack(docs, 16, "ffd", seed=5, window=8), batch_size=2, shuffle=True, seed=1)
    with pytest.raises(ValueError, match="pack_seed"):
        other.load_state_dict(state)


def test_through_conveyor_torch_a_batch_is_a_dict_of_tensors():
    torch = pytest.importorskip("torch")
    import conveyor.torch as data

    docs = corpus([5, 9, 2, 30, 7, 1, 12, 8])
    for pack in (data.Pack(docs, 16, "ffd"), conveyor.Pack(docs, 16)):
        batch = next(iter(data.DataLoader(pack, batch_size=2)))
        assert {key: type(value) for key, value in batch.items()} == dict.fromkeys(batch, torch.Tensor)
        assert batch["tokens"].shape == (2, 16) and batch["tokens"].dtype == torch.int64
        assert batch["cu_seqlens"].shape == (2, 17) and batch["cu_seqlens"].dtype == torch.int32
        assert batch["num_segments"].shape == (2,)
    assert isinstance(data.Pack(docs, 16), torch.utils.data.Dataset)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(seq_len=0), ValueError, "seq_len must be at least 1"),
        (dict(seq_len=-3), ValueError, "seq_len must be at least 1"),
        (dict(seq_len=True), TypeError, "seq_len must be an int"),
        (dict(seq_len=2.0), TypeError, "seq_len must be an int"),
        (dict(method="greedy"), ValueError, "method must be one of"),
        (dict(method="ffd", window=0), ValueError, "window must be at least 1"),
        (dict(method="ffd", too_long="drop"), ValueError, "too_long must be one of"),
        (dict(lengths=[3, 4]), ValueError, "lengths= has 2 lengths but docs has 3 documents"),
        (dict(lengths=[3, -4, 5]), ValueError, "document 1 the length -4"),
        (dict(lengths=[3.0, 4.0, 5.0]), TypeError, "sequence of ints"),
        (dict(lengths=[True, False, True]), TypeError, "sequence of ints"),
        (dict(method="ffd", too_long="error", seq_len=4), ValueError, "document 2 has 5 tokens, more than seq_len=4"),
        (dict(shuffle=1), TypeError, "shuffle must be True or False"),
        (dict(max_segments=0), ValueError, "max_segments must be at least 1"),
        (dict(method="ffd", continue_documents=False), ValueError, "continue_documents=False is for method='concat'"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, error, words):
    arguments = {"docs": corpus([3, 4, 5]), "seq_len": 8, **kwargs}
    with pytest.raises(error, match=words):
        Pack(**arguments)


def test_bad_documents_are_clear_errors_naming_them():
    with pytest.raises(TypeError, match="not a map-style dataset"):
        Pack(iter([[1, 2]]), 4)
    with pytest.raises(ValueError, match="document 1 has 4 tokens, but its length is recorded as 2"):
        Pack(corpus([3, 4]), 4, lengths=[3, 2], shuffle=False)[0]
    with pytest.raises(TypeError, match="document 0 is not a 1-D array of token ids"):
        Pack([np.zeros((2, 2), dtype=np.int64)], 2, lengths=[2])[0]
    with pytest.raises(ValueError, match="document 0 holds the token id 1002, outside"):
        Pack(corpus([3]), 2, vocab_size=1002)[0]
    with pytest.raises(ValueError, match="sequence 0 holds 3 documents, more than max_segments=2"):
        Pack([[1], [2], [3]], 3, shuffle=False, max_segments=2)[0]
    with pytest.raises(IndexError, match="index 5 is out of range for 2 sequences"):
        Pack(corpus([4, 4]), 4)[5]
