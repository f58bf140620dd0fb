"""TokenFiles: a corpus written by ``TokenFiles.write`` reads back document by
document (uint16 and uint32, empty documents kept), its lengths come from the
index alone, it reads through the DataLoader on 0 workers, fork and spawn
processes and threads, and pickles; every damage to the folder (a truncated
or changed token file, another corpus's index, an edited or hostile offset, a
planted version) is a TokenFilesError at construction naming what disagrees;
every bad document is an error naming its number; a write that fails midway
leaves no corpus and no temporary file."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib

import numpy as np
import pytest

import conveyor
from conveyor.text import TokenFilesError

pytestmark = pytest.mark.timeout(60)

DOCS = [[5, 6, 7], [], [8], list(range(100, 140)), [0, 65535]]


def documents(n: int = 37, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, size=int(rng.integers(0, 30))) for _ in range(n)]


@pytest.fixture
def corpus(tmp_path):
    """The folder of a corpus of 37 documents, and the documents. (The test opens it:
    a dataset kept by a fixture would keep its maps' file descriptors past the test.)"""
    docs = documents()
    conveyor.TokenFiles.write(tmp_path / "corpus", iter(docs))
    return str(tmp_path / "corpus"), docs


# -- round trip ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint16", "uint32", np.uint16, np.dtype("uint32")])
def test_round_trip(tmp_path, dtype):
    docs = DOCS + [[2**32 - 1]] if np.dtype(dtype) == np.uint32 else DOCS
    written = conveyor.TokenFiles.write(tmp_path / "c", docs, dtype=dtype)
    for dataset in (written, conveyor.TokenFiles(tmp_path / "c", verify=True)):
        assert len(dataset) == len(docs)
        assert dataset.dtype == np.dtype(dtype)
        assert [dataset[d].tolist() for d in range(len(docs))] == docs
        assert all(dataset[d].dtype == np.dtype(dtype) and dataset[d].ndim == 1 for d in range(len(docs)))
        assert dataset.lengths.tolist() == [len(doc) for doc in docs]
        assert dataset.num_tokens == sum(map(len, docs))
        assert dataset[-1].tolist() == docs[-1]
    assert os.path.getsize(tmp_path / "c" / "tokens.bin") == dataset.num_tokens * np.dtype(dtype).itemsize


def test_empty_documents_and_an_empty_corpus_are_kept(tmp_path):
    dataset = conveyor.TokenFiles.write(tmp_path / "c", [[], [], []])
    assert len(dataset) == 3 and dataset.num_tokens == 0 and dataset[1].shape == (0,)
    empty = conveyor.TokenFiles.write(tmp_path / "none", [])
    assert len(empty) == 0 and empty.lengths.tolist() == []


def test_lengths_read_no_token(corpus, tmp_path):
    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    fresh = conveyor.TokenFiles(dataset.folder)
    assert fresh.lengths.tolist() == [len(doc) for doc in docs]
    assert fresh._token_map is None  # (tokens.bin was never mapped)
    assert fresh.offsets[-1] == fresh.num_tokens


def test_items_are_read_only_views_and_indices_are_checked(corpus):
    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    with pytest.raises(ValueError, match="read-only"):
        dataset[3][0] = 1
    with pytest.raises(IndexError, match="document 37 is out of range"):
        dataset[37]
    with pytest.raises(TypeError, match="indices are ints"):
        dataset[1.0]
    assert dataset[np.int64(3)].tolist() == docs[3].tolist()


def test_vocab_size_is_recorded(tmp_path):
    dataset = conveyor.TokenFiles.write(tmp_path / "c", [[1, 2], [3]], vocab_size=4)
    assert conveyor.TokenFiles(tmp_path / "c").vocab_size == 4 and dataset.vocab_size == 4


def test_pickles_without_its_maps(corpus):
    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    dataset[0]
    data = pickle.dumps(dataset)
    assert len(data) < 2000
    again = pickle.loads(data)
    assert [again[d].tolist() for d in range(len(docs))] == [doc.tolist() for doc in docs]


def test_torch_flavour_gives_int64_tensors(corpus, tmp_path):
    torch = pytest.importorskip("torch")
    import conveyor.torch as ct

    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    flavoured = ct.TokenFiles(dataset.folder)
    assert isinstance(flavoured, torch.utils.data.Dataset)
    assert flavoured[3].dtype == torch.int64 and flavoured[3].tolist() == docs[3].tolist()
    assert flavoured.dtype == np.uint16
    batches = list(ct.DataLoader(flavoured, batch_size=None))
    assert [b.tolist() for b in batches] == [doc.tolist() for doc in docs]
    written = ct.TokenFiles.write(tmp_path / "from-tensors", [torch.tensor([3, 4]), torch.arange(5, dtype=torch.int32)])
    assert isinstance(written, ct.TokenFiles) and written[1].tolist() == [0, 1, 2, 3, 4]


# -- through the loader --------------------------------------------------------


@pytest.mark.parametrize(
    "workers",
    [
        (0, "multiprocessing", None),
        (2, "multiprocessing", "fork"),
        (2, "multiprocessing", "spawn"),
        (2, "thread", None),
    ],
    ids=["main", "fork", "spawn", "threads"],
)
def test_reads_through_the_loader(corpus, workers):
    num_workers, method, context = workers
    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    loader = conveyor.DataLoader(
        dataset,
        batch_size=None,
        shuffle=True,
        seed=3,
        num_workers=num_workers,
        worker_method=method,
        multiprocessing_context=context,
    )
    order = list(conveyor.DataLoader(range(len(docs)), batch_size=None, shuffle=True, seed=3))
    assert [t.tolist() for t in loader] == [docs[int(d)].tolist() for d in order]


def test_padded_batches_through_forked_workers(corpus):
    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    loader = conveyor.DataLoader(
        dataset, batch_size=4, collate_fn=conveyor.PadCollate(0), num_workers=2, multiprocessing_context="fork"
    )
    batches = list(loader)
    assert sum(len(b.lengths) for b in batches) == len(docs)
    first = batches[0]
    assert first.lengths.tolist() == [len(doc) for doc in docs[:4]]
    assert first.values[0, : len(docs[0])].tolist() == docs[0].tolist()


# -- a damaged folder is refused at construction -------------------------------


def _rewrite_offsets(folder, offsets, crc=True):
    """Write hostile offsets, with a matching CRC-32 in index.json (an index edited as a whole)."""
    data = struct.pack(f"<{len(offsets)}q", *offsets)
    (folder / "offsets.bin").write_bytes(data)
    if crc:
        record = json.loads((folder / "index.json").read_text())
        record["offsets_crc32"] = zlib.crc32(data)
        (folder / "index.json").write_text(json.dumps(record))


def test_truncated_token_file(corpus):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    folder = dataset.folder
    size = os.path.getsize(os.path.join(folder, "tokens.bin"))
    os.truncate(os.path.join(folder, "tokens.bin"), size - 2)
    with pytest.raises(
        TokenFilesError, match=rf"tokens.bin is {size - 2} bytes but index.json records {size} \(truncated"
    ):
        conveyor.TokenFiles(folder)


def test_token_file_shrunk_after_opening_is_refused_at_the_next_process_read(corpus):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    os.truncate(os.path.join(dataset.folder, "tokens.bin"), 4)
    again = pickle.loads(pickle.dumps(dataset))  # (as a spawn worker gets it)
    with pytest.raises(TokenFilesError, match="truncated"):
        again[0]


def test_another_corpus_index(corpus, tmp_path):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    other = conveyor.TokenFiles.write(tmp_path / "other", documents(50, seed=1))
    for name in ("index.json", "offsets.bin"):
        (tmp_path / "corpus" / name).write_bytes((tmp_path / "other" / name).read_bytes())
    with pytest.raises(
        TokenFilesError, match="tokens.bin is .* bytes but index.json records .*index of another corpus"
    ):
        conveyor.TokenFiles(dataset.folder)
    assert len(other) == 50


def test_another_corpus_index_json_alone(corpus, tmp_path):
    folder, docs = corpus
    dataset = conveyor.TokenFiles(folder)
    conveyor.TokenFiles.write(tmp_path / "other", [doc + 1 for doc in docs[::-1]])  # same sizes, other offsets
    (tmp_path / "corpus" / "index.json").write_bytes((tmp_path / "other" / "index.json").read_bytes())
    with pytest.raises(TokenFilesError, match="offsets.bin has CRC-32 .* but index.json records"):
        conveyor.TokenFiles(dataset.folder)


def test_a_changed_token_file_of_the_same_size_is_caught_by_verify(corpus):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    path = os.path.join(dataset.folder, "tokens.bin")
    with open(path, "r+b") as file:
        file.seek(10)
        byte = file.read(1)[0]
        file.seek(10)
        file.write(bytes([byte ^ 0xFF]))
    conveyor.TokenFiles(dataset.folder)  # (the cheap checks: sizes and the index)
    with pytest.raises(TokenFilesError, match=r"tokens.bin has CRC-32 .* \(its contents changed"):
        conveyor.TokenFiles(dataset.folder, verify=True)


def test_an_edited_offset(corpus, tmp_path):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    offsets = dataset.offsets.tolist()
    offsets[5] += 1
    _rewrite_offsets(tmp_path / "corpus", offsets, crc=False)
    with pytest.raises(TokenFilesError, match="offsets.bin has CRC-32"):
        conveyor.TokenFiles(dataset.folder)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda o: o.__setitem__(3, o[2] - 1), r"document 2 ends at \d+, before it starts at \d+"),
        (lambda o: o.__setitem__(3, -4), "document 3 starts at -4 .negative."),
        (lambda o: o.__setitem__(3, 10**9), "document 2 ends at 1000000000, past the"),
        (lambda o: o.__setitem__(0, 1), "document 0 starts at 1, not 0"),
        (lambda o: o.__setitem__(-1, o[-1] - 1), "the last document ends at"),
    ],
    ids=["decreasing", "negative", "past-the-end", "first-not-0", "last-short"],
)
def test_a_hostile_index_with_its_crc(corpus, tmp_path, edit, message):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    offsets = dataset.offsets.tolist()
    edit(offsets)
    _rewrite_offsets(tmp_path / "corpus", offsets)
    with pytest.raises(TokenFilesError, match=f"not a document index: {message}"):
        conveyor.TokenFiles(dataset.folder)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("version", 99, "format version 99; this conveyor reads version 1 .a newer version: upgrade conveyor"),
        ("version", None, "format version None"),
        ("format", "other", "not the index of conveyor token files"),
        ("dtype", "int8", "records dtype 'int8'; token files hold uint16 or uint32"),
        ("documents", -1, "documents should be a non-negative int"),
        ("tokens", 3, "disagrees with itself"),
    ],
)
def test_a_planted_header(corpus, tmp_path, key, value, message):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    path = tmp_path / "corpus" / "index.json"
    record = json.loads(path.read_text())
    record[key] = value
    path.write_text(json.dumps(record))
    with pytest.raises(TokenFilesError, match=message):
        conveyor.TokenFiles(dataset.folder)


def test_an_index_that_is_not_json_or_is_missing(corpus, tmp_path):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    (tmp_path / "corpus" / "index.json").write_text("{not json")
    with pytest.raises(TokenFilesError, match="index.json is not JSON"):
        conveyor.TokenFiles(dataset.folder)
    os.remove(tmp_path / "corpus" / "index.json")
    with pytest.raises(TokenFilesError, match="no index.json: a write that did not finish"):
        conveyor.TokenFiles(dataset.folder)
    with pytest.raises(FileNotFoundError, match="the folder does not exist"):
        conveyor.TokenFiles(tmp_path / "nowhere")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FileNotFoundError, match="the folder is a file, not a folder"):
        conveyor.TokenFiles(tmp_path / "a-file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no token files in .*TokenFiles.write"):
        conveyor.TokenFiles(tmp_path / "empty")


# -- bad documents and arguments are refused by the write -----------------------


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ([1, -2], ValueError, "document 2 has token id -2 at position 1: token ids are ≥ 0"),
        ([65536], ValueError, "document 2 has token id 65536 at position 0, which does not fit uint16.*dtype='uint32'"),
        (np.array([1.0, 2.0]), TypeError, "document 2 holds float64 values, not integers"),
        ([True, False], TypeError, "document 2 holds bool values"),
        (np.zeros((2, 3), np.int64), TypeError, r"document 2 is 2-D \(shape \(2, 3\)\)"),
        (7, TypeError, "document 2 is a int scalar"),
        ("hello", TypeError, "document 2 is a str, not token ids: tokenize it first"),
        ([[1], [2, 3]], TypeError, "document 2 is not a sequence of token ids"),
    ],
)
def test_bad_documents_are_refused_naming_them(tmp_path, bad, error, message):
    with pytest.raises(error, match=message):
        conveyor.TokenFiles.write(tmp_path / "c", [[1], [2], bad, [3]])
    assert not os.path.exists(tmp_path / "c")  # (the folder it made is removed)


def test_ids_at_or_past_vocab_size_are_refused(tmp_path):
    with pytest.raises(ValueError, match="document 1 has token id 10 at position 2, not below vocab_size 10"):
        conveyor.TokenFiles.write(tmp_path / "c", [[9], [0, 1, 10]], vocab_size=10)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"dtype": "int32"}, TypeError, "dtype should be 'uint16'.* or 'uint32', got 'int32'"),
        ({"dtype": "uint8"}, TypeError, "dtype should be"),
        ({"vocab_size": 70_000}, ValueError, "vocab_size 70000 does not fit uint16.*dtype='uint32'"),
        ({"vocab_size": 0}, ValueError, "vocab_size should be > 0"),
        ({"vocab_size": 5.0}, TypeError, "vocab_size should be an int or None"),
        ({"overwrite": "yes"}, TypeError, "overwrite should be True or False"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        conveyor.TokenFiles.write(tmp_path / "c", [[1]], **kwargs)


def test_documents_must_be_iterable(tmp_path):
    with pytest.raises(TypeError, match="documents should be an iterable of documents"):
        conveyor.TokenFiles.write(tmp_path / "c", 5)


# -- the write is atomic ---------------------------------------------------------


def test_a_folder_with_token_files_is_refused_unless_overwrite(corpus):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    with pytest.raises(FileExistsError, match="already holds token files .*overwrite=True"):
        conveyor.TokenFiles.write(dataset.folder, [[1]])
    replaced = conveyor.TokenFiles.write(dataset.folder, [[1], [2, 3]], overwrite=True)
    assert [replaced[d].tolist() for d in range(2)] == [[1], [2, 3]]
    assert sorted(os.listdir(dataset.folder)) == ["index.json", "offsets.bin", "tokens.bin"]


def test_an_overwrite_leaves_readers_of_the_old_corpus_reading_it(corpus):
    folder, docs = corpus
    reader = conveyor.TokenFiles(folder)
    assert reader[0].tolist() == docs[0].tolist()  # (tokens.bin mapped)
    conveyor.TokenFiles.write(folder, [[1]] * 200, overwrite=True)
    assert [reader[d].tolist() for d in range(len(docs))] == [doc.tolist() for doc in docs]
    assert conveyor.TokenFiles(folder)[199].tolist() == [1]


def test_a_write_that_fails_midway_leaves_no_corpus_and_no_temporary_file(tmp_path):
    def stream():
        yield from documents(10)
        raise RuntimeError("the tokenizer died")

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("kept")
    with pytest.raises(RuntimeError, match="the tokenizer died"):
        conveyor.TokenFiles.write(tmp_path / "c", stream())
    assert os.listdir(tmp_path / "c") == ["notes.txt"]


def test_a_failed_overwrite_leaves_no_corpus_that_opens(corpus):
    folder, _ = corpus
    dataset = conveyor.TokenFiles(folder)
    with pytest.raises(ValueError, match="document 1"):
        conveyor.TokenFiles.write(dataset.folder, [[1], [-1]], overwrite=True)
    assert not any(name.endswith(".tmp") for name in os.listdir(dataset.folder))
    conveyor.TokenFiles(dataset.folder)  # (the old corpus: the write failed before its renames)


@pytest.mark.parametrize("method", ["concat", "ffd"])
def test_pack_reads_the_lengths_from_the_index_and_packs_every_token(corpus, method):
    files = conveyor.TokenFiles(corpus[0])
    pack = conveyor.Pack(files, seq_len=16, method=method, seed=1, drop_last=False)
    assert pack.lengths_source == "docs.lengths"
    tokens = np.concatenate([pack[k]["tokens"][pack[k]["segment_ids"] > 0] for k in range(len(pack))])
    assert sorted(tokens.tolist()) == sorted(np.concatenate([files[d] for d in range(len(files))]).tolist())
