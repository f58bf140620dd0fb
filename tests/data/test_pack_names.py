"""Every name a folder can hold either packs and reads back exactly, or
is refused by ``conveyor pack`` with one line naming it.

"Reads back exactly": the set of (key, field) -> bytes that ShardDataset
gives (``raw``) and the one the ``webdataset`` package gives are both the
set the folder's layout promises: sample i is the i-th file of the class
folders (classes by name, files by name within each), its bytes under its
extension (lowercased; ``bin`` when it has none) and its class number
under ``cls``. "Refused": exit status 2, exactly one line on stderr that
names the file (its path as given, or ``repr`` of it when it cannot be
shown on one line), no traceback, and no shard written. Names are written
as bytes (``os.fsencode``), so names that are not UTF-8 are among them.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conveyor.cli import main as cli
from conveyor.cli.pack import verify
from conveyor.shards import ShardDataset

wds = pytest.importorskip("webdataset")

pytestmark = pytest.mark.timeout(120)

#: Names that pack, as bytes relative to SRC (each a file with bytes of its own, most not UTF-8 text), and links
#: that stay inside SRC (name -> the file it leads to, relative to the link's folder).
PACKS = [
    b"cat/a.jpg",
    b"cat/a.JPG",
    b"cat/A.jpg",
    b"cat/a.b.jpg",
    b"cat/a.b.JPG",
    b"cat/x.",
    b"cat/noext",
    b"cat/.hidden",
    b"cat/..dots",
    b"cat/_under.png",
    b"cat/./dot-slash.png",
    b"cat/ sp ace .jpg",
    b"cat/new\nline.jpg",
    b"cat/ext.j\npg",
    b"cat/tab\tname.png",
    b"cat/caf\xc3\xa9.jpg",
    b"cat/\xff\xfe.jpg",
    b"cat/" + b"l" * 240 + b".jpg",
    b"cat/a.txt",
    b"cat/a.json",
    b"cat/a.idx",
    b"cat/a.npy",
    b"cat/a.tar.gz",
    b"cat/-dash.jpg",
    b"cat/a.JP\xc3\x89",
    b"cat/a._single",
    b"Cat/same-but-case.jpg",
    b"dog house/a.jpg",
    b".hidden-class/a.png",
    b"\xff class/a.jpg",
    b"caf\xc3\xa9/a.jpg",
    b"new\nline class/a.jpg",
    b"_x/a.jpg",
    b"a.b/a.jpg",
    b"empty-class",
]
LINKS_INSIDE = {b"dog house/link.jpg": b"../cat/a.jpg", b"cat/zz-link-same-folder.png": b"_under.png"}


def make_tree(root: bytes, names: list[bytes], links: dict[bytes, bytes]) -> None:
    for n, name in enumerate(names):
        path = os.path.join(root, name)
        if name == b"empty-class":
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"bytes of %d: \xff\x00 %s" % (n, name))
    for name, target in links.items():
        os.symlink(target, os.path.join(root, name))


def promised(root: bytes) -> dict[tuple[str, str], bytes]:
    """(key, field) -> bytes as the layout promises them, from the tree itself; fails on any entry the
    layout has no place for (a test only asks this of a folder that packed)."""
    expected, i = {}, 0
    for label, cls in enumerate(sorted(os.listdir(os.fsdecode(root)))):
        folder = os.path.join(os.fsdecode(root), cls)
        assert os.path.isdir(folder), f"{folder!r} is no class folder, yet the folder packed"
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            assert os.path.isfile(path), f"{path!r} is no regular file (a folder, a link to nothing...), yet it packed"
            field = os.path.splitext(name)[1].lower().lstrip(".") or "bin"
            assert field != "cls" and not field.startswith("__"), f"{path!r} would clash, yet the folder packed"
            with open(path, "rb") as f:
                expected[(f"{i:09d}", field)] = f.read()
            expected[(f"{i:09d}", "cls")] = str(label).encode()
            i += 1
    return expected


def read_back(out: str) -> tuple[dict, dict]:
    """(key, field) -> bytes as ShardDataset reads the shards, and as the webdataset package does."""
    dataset = ShardDataset(out)
    ours = {
        (s["__key__"], f): bytes(v)
        for s in map(dataset.raw, range(len(dataset)))
        for f, v in s.items()
        if f != "__key__"
    }
    tars = sorted(os.path.join(out, name) for name in os.listdir(out) if name.endswith(".tar"))
    theirs = {
        (s["__key__"], f): v
        for s in wds.WebDataset(tars, shardshuffle=False)
        for f, v in s.items()
        if not f.startswith("__")
    }
    return ours, theirs


def pack(src: str, out: str, capsys) -> tuple[int, str]:
    code = cli(["pack", src, out, "--max-samples", "7", "--workers", "1"])
    return code, capsys.readouterr().err


def shown_in(line: str, path: str) -> bool:
    return path in line or repr(path) in line


def assert_refused(code: int, err: str, path: str, out: str, because: str = "") -> None:
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("conveyor pack: error: "), err
    assert shown_in(lines[0], path), (lines, path)
    assert because in lines[0], lines
    assert "Traceback" not in err
    assert not os.path.exists(out) or not [n for n in os.listdir(out) if n.startswith("shard-")]


def assert_reads_back(src: bytes, out: str) -> None:
    ours, theirs = read_back(out)
    expected = promised(src)
    assert ours == expected
    assert theirs == expected
    assert verify(out) == []  # (and --verify, which reads every tar's headers anew, agrees)


# ------------------------------------------------------------ one name at a time
def _file(path: bytes) -> None:
    with open(path, "wb") as f:
        f.write(b"offending bytes")


def _deep(path: bytes) -> None:
    os.makedirs(os.path.join(path, b"deeper"))
    _file(os.path.join(path, b"deeper", b"x.jpg"))


def _loop(path: bytes) -> None:
    os.symlink(os.path.basename(path) + b"-2", path)
    os.symlink(os.path.basename(path), path + b"-2")


#: What is refused: the entry the line names, how it is made, a word the line says.
REFUSED = [
    (b"cat/label.cls", _file, "'cls'"),  # its bytes would take the field of the class number
    (b"cat/a.CLS", _file, "'cls'"),
    (b"cat/meta.__key__", _file, "__"),  # ShardDataset and webdataset keep __key__ for the sample's key
    (b"cat/meta.__url__", _file, "__"),
    (b"cat/a.__init", _file, "__"),
    (b"cat/long." + b"e" * 61, _file, "bytes"),  # a field too long for a tar header beside its key
    (b"cat/long." + "\u00e9".encode() * 31, _file, "bytes"),
    (b"cat/a.\xff\xfe", _file, "UTF-8"),
    (b"cat/sub", _deep, "inside a class folder"),
    (b"cat/sub\ndir", _deep, "inside a class folder"),
    (b"cat/link-to-a-class", lambda p: os.symlink(b"../dog house", p), "inside a class folder"),
    (b"README.md", _file, "no class"),
    (b"cat/fifo.jpg", os.mkfifo, "not a regular file"),
    (b"cat/dangling.jpg", lambda p: os.symlink(b"nothing-here.jpg", p), "link to nothing"),
    (b"dangling-class", lambda p: os.symlink(b"no-such-folder", p), "link to nothing"),
    (b"cat/loop.jpg", _loop, "loop"),
]


def _remove(path: bytes) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


@pytest.mark.parametrize("name, make, because", REFUSED, ids=[repr(r[0])[2:-1][:40] for r in REFUSED])
def test_a_name_that_cannot_pack_is_refused_on_one_line_and_the_rest_packs_once_it_is_gone(
    tmp_path, capsys, name, make, because
):
    src = os.fsencode(tmp_path / "src")
    make_tree(src, PACKS, LINKS_INSIDE)
    offender = os.path.join(src, name)
    make(offender)
    out = str(tmp_path / "out")
    code, err = pack(os.fsdecode(src), out, capsys)
    assert_refused(code, err, os.fsdecode(offender), out, because)
    # Mended as the line says (the entry gone), the same folder packs and reads back exactly, by both readers.
    _remove(offender)
    _remove(offender + b"-2")
    code, err = pack(os.fsdecode(src), out, capsys)
    assert code == 0, err
    assert_reads_back(src, out)


# ------------------------------------------------------------ factories
#: The sample make_fields' dataset repeats (set by each test before it packs).
FIELDS: dict = {}


def make_fields() -> list:
    return [dict(FIELDS) for _ in range(3)]


#: Fields that pack: a sample's own __key__ is not stored (keys are sample numbers); webdataset lowercases
#: every extension when it reads (its default), so it reads "JPG" as "jpg".
FACTORY_PACKS = {
    "__key__": "my.own key",
    "seg.png": b"seg",
    "a__b": b"ab",
    "JPG": b"upper",
    ".dot": b"dot",
    "x.": b"trail",
    "sp ace": b"space",
    "caf\u00e9": b"cafe",
    "cls": 3,
    "txt": "text \u00e9",
}
#: One field more than FACTORY_PACKS, which cannot pack; a word the line says.
FACTORY_REFUSED = [
    ({"jpg": b"lower"}, "'JPG'"),  # one field with "JPG" to webdataset
    ({"Seg.PNG": b"upper"}, "'seg.png'"),
    ({"a/b": b"slash"}, "'a/b'"),
    ({"": b"empty"}, "''"),
    ({"\u00e9" * 50: b"long"}, "bytes"),  # 50 characters, 100 bytes of UTF-8
    ({"bad\udcff": b"surrogate"}, "UTF-8"),
    ({"nul\x00": b"nul"}, "'nul\\x00'"),
]


@pytest.mark.parametrize("extra, because", FACTORY_REFUSED, ids=[repr(next(iter(f)))[:30] for f, _ in FACTORY_REFUSED])
def test_a_factory_field_that_cannot_pack_is_one_line_and_dotted_fields_read_back(tmp_path, capsys, extra, because):
    FIELDS.clear()
    FIELDS.update({**FACTORY_PACKS, **extra})
    out = str(tmp_path / "out")
    code, err = pack(f"{__file__}:make_fields", out, capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("conveyor pack: error: "), err
    assert "sample 0" in lines[0] and because in lines[0], lines
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    # Without that field, the samples pack and read back under their names (lowercased by webdataset).
    FIELDS.clear()
    FIELDS.update(FACTORY_PACKS)
    code, err = pack(f"{__file__}:make_fields", out, capsys)
    assert code == 0, err
    ours, theirs = read_back(out)
    stored = {f: (v if isinstance(v, bytes) else str(v).encode()) for f, v in FACTORY_PACKS.items() if f != "__key__"}
    assert ours == {(f"{i:09d}", f): v for i in range(3) for f, v in stored.items()}
    assert theirs == {(f"{i:09d}", f.lower()): v for i in range(3) for f, v in stored.items()}


# ------------------------------------------------------------ any tree
#: Pieces of names: plain, case, dots, spaces, control characters, UTF-8 and bytes that are not UTF-8.
_PIECES = [
    b"a",
    b"B",
    b"jpg",
    b"JPG",
    b"cls",
    b"txt",
    b".",
    b"..",
    b" ",
    b"\n",
    b"_",
    b"__",
    b"-",
    b"\xc3\xa9",
    b"\xff",
    b"\xe2\x80\x8b",
    b"e" * 70,
]
_name = (
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=5)
    .map(b"".join)
    .filter(lambda n: n not in (b".", b"..") and len(n) <= 255)
)
_KINDS = ["file"] * 12 + ["link-inside"] * 2 + ["folder", "dangling"]


@st.composite
def _trees(draw) -> list:
    """(where: a class folder's name, or b"" for SRC itself; the entry's name; what it is) per entry."""
    classes = draw(st.lists(_name, min_size=1, max_size=3, unique=True))
    return [
        (draw(st.sampled_from(classes * 8 + [b""])), draw(_name), draw(st.sampled_from(_KINDS)))
        for _ in range(draw(st.integers(1, 8)))
    ]


def _build(root: bytes, entries: list) -> None:
    os.makedirs(root)
    files = []
    for n, (where, name, kind) in enumerate(entries):
        folder = os.path.join(root, where)
        path = os.path.join(folder, name)
        if os.path.lexists(path) or (where and os.path.lexists(folder) and not os.path.isdir(folder)):
            continue
        os.makedirs(folder, exist_ok=True)
        if kind == "file" or (kind == "link-inside" and not files):
            with open(path, "wb") as f:
                f.write(b"%d \xff %s" % (n, name))
            files.append(path)
        elif kind == "folder":
            os.makedirs(os.path.join(path, b"inner"))
            with open(os.path.join(path, b"inner", b"x.jpg"), "wb") as f:
                f.write(b"deep")
        elif kind == "dangling":
            os.symlink(b"not-there", path)
        else:
            os.symlink(os.path.relpath(files[n % len(files)], folder), path)


def _entries_of(root: str) -> set[str]:
    found = set()
    for folder, dirs, names in os.walk(root):
        found.update(os.path.join(folder, name) for name in dirs + names)
    return found


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=_trees())
def test_any_tree_of_names_packs_exactly_or_is_refused_naming_one_entry(capsys, entries):
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(os.fsencode(tmp), b"src")
        _build(src, entries)
        out = os.path.join(tmp, "out")
        code, err = pack(os.fsdecode(src), out, capsys)
        event("packed" if code == 0 else "refused")
        if code == 0:
            assert "Traceback" not in err
            assert_reads_back(src, out)
        else:
            named = [path for path in _entries_of(os.fsdecode(src)) if shown_in(err, path)]
            assert named or "no class folders" in err or "no files under" in err, err
            assert_refused(code, err, named[0] if named else "", out)
