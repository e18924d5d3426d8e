"""SICK semantic-relatedness data: dependency trees, loading and targets.

The layout is the one produced by the preprocessing of Tai, Socher & Manning
(2015): each split directory (``train/``, ``dev/``, ``test/``) holds

* ``a.toks`` / ``b.toks``: one tokenised sentence a line (space separated);
* ``a.parents`` / ``b.parents``: one line per sentence, the 1-based index of
  each token's dependency head, ``0`` for the root;
* ``sim.txt``: the gold relatedness score (a real number in [1, 5]).

Line ``k`` of every file belongs to the same sentence pair.
"""
import collections
import logging
import random
from pathlib import Path

import numpy as np

LOG = logging.getLogger(__name__)

#: Files every split directory must contain.
SPLIT_FILES = ("a.toks", "b.toks", "a.parents", "b.parents", "sim.txt")

#: Relatedness scores range over [1, NUM_CLASSES].
NUM_CLASSES = 5


class SickDataError(ValueError):
    """A SICK data file is missing or malformed.

    Parameters
    ----------
    message : str
        What is wrong.
    path : str or os.PathLike, optional
        The offending file.
    lineno : int, optional
        1-based line number in ``path``.
    """

    def __init__(self, message, path=None, lineno=None):
        self.path = None if path is None else str(path)
        self.lineno = lineno
        self.reason = message
        where = ""
        if self.path is not None:
            where = self.path if lineno is None else f"{self.path}:{lineno}"
            where += ": "
        super().__init__(where + message)


class Tree:
    """A node of a dependency tree (and the subtree below it).

    Parameters
    ----------
    index : int
        0-based position of the node's token in its sentence.
    word : int, optional
        Vocabulary id of the token; ``None`` until assigned.
    children : list of Tree, optional
        Dependents of this node, in sentence order.
    """

    __slots__ = ("index", "word", "children")

    def __init__(self, index, word=None, children=None):
        self.index = index
        self.word = word
        self.children = [] if children is None else list(children)

    def __iter__(self):
        """Iterate over all nodes of the subtree in pre-order."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def postorder(self):
        """Return the nodes of the subtree, every child before its parent.

        Returns
        -------
        list of Tree
        """
        return list(_reverse_preorder(self))[::-1]

    def size(self):
        """Return the number of nodes in the subtree.

        Returns
        -------
        int
        """
        return sum(1 for _ in self)

    def height(self):
        """Return the height of the subtree; a leaf has height 1.

        Returns
        -------
        int
        """
        heights = {}
        for node in self.postorder():
            below = [heights[id(c)] for c in node.children]
            heights[id(node)] = 1 + max(below, default=0)
        return heights[id(self)]

    def is_leaf(self):
        """Return True when the node has no children."""
        return not self.children

    def __repr__(self):
        return (f"Tree(index={self.index}, word={self.word}, "
                f"children={len(self.children)})")


def _reverse_preorder(root):
    """Yield nodes root first, children right to left (postorder reversed)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


SickPair = collections.namedtuple(
    "SickPair", ["a_tokens", "b_tokens", "a_tree", "b_tree", "score"])
SickPair.__doc__ = """One sentence pair of SICK.

Attributes
----------
a_tokens, b_tokens : list of str
    Tokens of the two sentences.
a_tree, b_tree : Tree
    Their dependency trees (``word`` is None until vocab ids are assigned).
score : float
    Gold relatedness in [1, 5].
"""


def _source_error(message, source):
    """Build a SickDataError from a ``(path, lineno)`` pair or None."""
    path, lineno = source if source is not None else (None, None)
    return SickDataError(message, path, lineno)


def parse_parents(parents, source=None, n_tokens=None):
    """Build a dependency tree from 1-based head indices.

    Parameters
    ----------
    parents : sequence of int
        ``parents[i]`` is the 1-based index of token ``i``'s head, 0 for the
        root.
    source : tuple of (str, int), optional
        ``(file, lineno)`` named in error messages.
    n_tokens : int, optional
        Number of tokens of the sentence; checked against ``len(parents)``.

    Returns
    -------
    Tree
        The root node; every node's ``index`` is its 0-based token position.

    Raises
    ------
    SickDataError
        Wrong length, not exactly one root, a head out of range, or a cycle.
    """
    parents = list(parents)
    _check_parents(parents, source, n_tokens)
    _check_acyclic(parents, source)
    nodes = [Tree(i) for i in range(len(parents))]
    root = None
    for i, head in enumerate(parents):
        if head == 0:
            root = nodes[i]
        else:
            nodes[head - 1].children.append(nodes[i])
    return root


def _check_parents(parents, source, n_tokens):
    """Validate length, range and the single root of a parents list."""
    n = len(parents)
    if n == 0:
        raise _source_error("empty parents line", source)
    if n_tokens is not None and n != n_tokens:
        raise _source_error(
            f"parents line has {n} entries but the sentence has "
            f"{n_tokens} tokens", source)
    for i, head in enumerate(parents):
        if isinstance(head, bool) or not isinstance(head, (int, np.integer)):
            raise _source_error(
                f"head of token {i + 1} is not an integer: {head!r}", source)
        if not 0 <= head <= n:
            raise _source_error(
                f"head of token {i + 1} is {head}, outside 0..{n}", source)
        if head == i + 1:
            raise _source_error(
                f"cycle: token {i + 1} is its own head", source)
    roots = [i + 1 for i, head in enumerate(parents) if head == 0]
    if len(roots) != 1:
        raise _source_error(
            f"expected exactly one root (head 0), found {len(roots)}"
            + (f" at tokens {roots}" if roots else ""), source)


def _check_acyclic(parents, source):
    """Check that following heads from every token reaches the root."""
    state = [0] * len(parents)  # 0 unknown, 1 on current path, 2 reaches root
    for start in range(len(parents)):
        path = []
        node = start
        while node >= 0 and state[node] == 0:
            state[node] = 1
            path.append(node)
            node = parents[node] - 1
        if node >= 0 and state[node] == 1:
            raise _source_error(
                f"cycle in heads through token {node + 1}", source)
        for visited in path:
            state[visited] = 2


def attach_words(tree, word_ids):
    """Set ``node.word = word_ids[node.index]`` on every node of a tree.

    Parameters
    ----------
    tree : Tree
        Root of the tree; modified in place.
    word_ids : sequence of int
        Vocabulary id of each token of the sentence.

    Returns
    -------
    Tree
        The same ``tree``.
    """
    for node in tree:
        node.word = int(word_ids[node.index])
    return tree


def tree_parents(tree):
    """Return the ``.parents`` encoding of a tree (inverse of parse_parents).

    Parameters
    ----------
    tree : Tree
        Root of a tree whose indices are 0..n-1.

    Returns
    -------
    list of int
        1-based head of each token, 0 for the root.
    """
    nodes = list(tree)
    parents = [None] * len(nodes)
    parents[tree.index] = 0
    for node in nodes:
        for child in node.children:
            parents[child.index] = node.index + 1
    if any(p is None for p in parents):
        raise ValueError("tree indices are not 0..n-1")
    return parents


def write_split(pairs, data_dir, split):
    """Write pairs in the SICK split layout (the inverse of load_split).

    Parameters
    ----------
    pairs : list of SickPair
    data_dir : str or os.PathLike
        Parent directory; ``data_dir/split`` is created.
    split : str
        Split name, e.g. ``"train"``.

    Returns
    -------
    pathlib.Path
        The split directory.
    """
    split_dir = Path(data_dir) / split
    split_dir.mkdir(parents=True, exist_ok=True)
    columns = {
        "a.toks": [" ".join(p.a_tokens) for p in pairs],
        "b.toks": [" ".join(p.b_tokens) for p in pairs],
        "a.parents": [" ".join(map(str, tree_parents(p.a_tree)))
                      for p in pairs],
        "b.parents": [" ".join(map(str, tree_parents(p.b_tree)))
                      for p in pairs],
        "sim.txt": [f"{p.score:g}" for p in pairs],
    }
    for name, lines in columns.items():
        with open(split_dir / name, "w", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
    return split_dir


def _read_lines(path):
    """Return the lines of a UTF-8 text file without line terminators."""
    with open(path, encoding="utf-8") as handle:
        return handle.read().splitlines()


def _read_split_files(split_dir):
    """Read all files of a split; check they exist and have equal lengths."""
    missing = [name for name in SPLIT_FILES
               if not (split_dir / name).is_file()]
    if missing:
        raise SickDataError(
            f"missing file(s) {', '.join(missing)} in split directory",
            split_dir)
    lines = {name: _read_lines(split_dir / name) for name in SPLIT_FILES}
    ref = SPLIT_FILES[0]
    n_ref = len(lines[ref])
    for name in SPLIT_FILES[1:]:
        n = len(lines[name])
        if n < n_ref:
            raise SickDataError(
                f"line missing: file has {n} lines but {ref} has {n_ref}",
                split_dir / name, n + 1)
        if n > n_ref:
            raise SickDataError(
                f"extra line: file has {n} lines but {ref} has {n_ref}",
                split_dir / name, n_ref + 1)
    return lines


def _parse_tokens(line, source):
    """Split a tokens line; an empty sentence is an error."""
    tokens = line.split()
    if not tokens:
        raise _source_error("empty sentence", source)
    return tokens


def _parse_ints(line, source):
    """Parse a whitespace-separated line of integers."""
    try:
        return [int(field) for field in line.split()]
    except ValueError:
        raise _source_error(
            f"parents line is not all integers: {line.strip()[:60]!r}",
            source) from None


def _parse_score(line, source, num_classes=NUM_CLASSES):
    """Parse a relatedness score and check it lies in [1, num_classes]."""
    try:
        score = float(line.strip())
    except ValueError:
        raise _source_error(f"score is not a number: {line.strip()!r}",
                            source) from None
    if not 1.0 <= score <= num_classes:
        raise _source_error(
            f"score {score} outside [1, {num_classes}]", source)
    return score


def _parse_sentence(lines, split_dir, side, k):
    """Parse tokens and tree of sentence ``side`` ('a' or 'b') on line k."""
    tok_name, par_name = f"{side}.toks", f"{side}.parents"
    tokens = _parse_tokens(lines[tok_name][k], (split_dir / tok_name, k + 1))
    par_src = (split_dir / par_name, k + 1)
    parents = _parse_ints(lines[par_name][k], par_src)
    tree = parse_parents(parents, source=par_src, n_tokens=len(tokens))
    return tokens, tree


def load_split(data_dir, split):
    """Load one split of SICK.

    Parameters
    ----------
    data_dir : str or os.PathLike
        Directory holding the ``train/``, ``dev/`` and ``test/`` folders.
    split : str
        Name of the split folder, e.g. ``"dev"``.

    Returns
    -------
    list of SickPair

    Raises
    ------
    SickDataError
        A file is missing, line counts differ, or a line is malformed; the
        message names the file and the 1-based line.
    """
    split_dir = Path(data_dir) / split
    if not split_dir.is_dir():
        raise SickDataError("split directory not found", split_dir)
    lines = _read_split_files(split_dir)
    pairs = []
    for k in range(len(lines["a.toks"])):
        a_tokens, a_tree = _parse_sentence(lines, split_dir, "a", k)
        b_tokens, b_tree = _parse_sentence(lines, split_dir, "b", k)
        score = _parse_score(lines["sim.txt"][k],
                             (split_dir / "sim.txt", k + 1))
        pairs.append(SickPair(a_tokens, b_tokens, a_tree, b_tree, score))
    LOG.debug("loaded %d pairs from %s", len(pairs), split_dir)
    return pairs


def default_data_dir():
    """Return the SICK directory to use when none is given, if any.

    The local copy (``../shared/data/sick`` beside the repository, or
    ``$GLUON_DYNBATCH_LOCAL_DATA/sick``), else the cache
    (``$MXNET_HOME/datasets/sick``) when it holds every file.  Nothing is
    downloaded: :func:`examples.data_sources.ensure_sick` does that.

    Returns
    -------
    pathlib.Path or None
    """
    from examples import data_sources
    local = data_sources.local_sick_dir()
    if local is not None:
        return local
    cache = data_sources.sick_cache_dir()
    if all((cache / rel).is_file() for rel in data_sources.SICK_FILES):
        return cache
    return None


def random_parents(n, rng):
    """Draw a random dependency structure over ``n`` tokens.

    Parameters
    ----------
    n : int
        Sentence length, at least 1.
    rng : random.Random
        Source of randomness.

    Returns
    -------
    list of int
        1-based heads, 0 for the root, as in a ``.parents`` line.
    """
    order = list(range(n))
    rng.shuffle(order)
    parents = [0] * n
    for pos in range(1, n):
        head = order[rng.randrange(pos)]
        parents[order[pos]] = head + 1
    return parents


def _random_sentence(rng, vocab, min_len, max_len):
    """Return random tokens of length in [min_len, max_len]."""
    return [rng.choice(vocab) for _ in range(rng.randint(min_len, max_len))]


def _perturb(tokens, rng, vocab):
    """Replace a random fraction of tokens; return new tokens and overlap."""
    keep_prob = rng.random()
    out = [t if rng.random() < keep_prob else rng.choice(vocab)
           for t in tokens]
    same = sum(a == b for a, b in zip(tokens, out))
    return out, same / len(tokens)


def random_corpus(n_pairs, seed=0, vocab_size=200, min_len=3, max_len=12):
    """Generate random sentence pairs standing in for SICK.

    Sentence b is sentence a with a random fraction of its tokens replaced,
    and the score is ``1 + 4 * overlap``, so there is something to learn, but
    the scores say nothing about language.

    Parameters
    ----------
    n_pairs : int
        Number of pairs.
    seed : int, optional
        Seed; the same seed gives the same corpus.
    vocab_size : int, optional
        Number of distinct synthetic tokens (``w0``, ``w1``, ...).
    min_len, max_len : int, optional
        Range of sentence lengths.

    Returns
    -------
    list of SickPair
    """
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocab_size)]
    pairs = []
    for _ in range(n_pairs):
        a_tokens = _random_sentence(rng, vocab, min_len, max_len)
        b_tokens, overlap = _perturb(a_tokens, rng, vocab)
        a_tree = parse_parents(random_parents(len(a_tokens), rng))
        b_tree = parse_parents(random_parents(len(b_tokens), rng))
        score = round(1.0 + (NUM_CLASSES - 1) * overlap, 2)
        pairs.append(SickPair(a_tokens, b_tokens, a_tree, b_tree, score))
    return pairs


def target_distribution(score, num_classes=NUM_CLASSES):
    """Sparse target distribution of a relatedness score (Tai et al. 2015).

    With classes ``r = 1..K`` and ``f = floor(y)``: ``p_f = f - y + 1``,
    ``p_{f+1} = y - f``, all other entries 0; so ``r^T p = y``.

    Parameters
    ----------
    score : float or array_like
        Score(s) in [1, num_classes].
    num_classes : int, optional
        Number of classes K.

    Returns
    -------
    numpy.ndarray
        Shape ``score.shape + (num_classes,)``, float32, rows sum to 1.

    Raises
    ------
    ValueError
        A score lies outside [1, num_classes].
    """
    scores = np.asarray(score, dtype=np.float64)
    if np.any(scores < 1) or np.any(scores > num_classes):
        raise ValueError(f"scores must lie in [1, {num_classes}]")
    flat = scores.reshape(-1)
    probs = np.zeros((flat.size, num_classes), dtype=np.float64)
    floor = np.floor(flat).astype(np.int64)
    frac = flat - floor
    rows = np.arange(flat.size)
    probs[rows, floor - 1] = 1.0 - frac
    upper = floor < num_classes  # at y == K the upper class does not exist
    probs[rows[upper], floor[upper]] = frac[upper]
    return probs.reshape(scores.shape + (num_classes,)).astype(np.float32)


def expected_score(probs):
    """Expected score ``r^T p`` of class distributions over ``r = 1..K``.

    Parameters
    ----------
    probs : array_like
        Shape ``(..., K)``; each row a distribution over the K classes.

    Returns
    -------
    numpy.ndarray or float
        Shape ``probs.shape[:-1]``.
    """
    probs = np.asarray(probs, dtype=np.float64)
    classes = np.arange(1, probs.shape[-1] + 1, dtype=np.float64)
    return probs @ classes


def sentence_lengths(pairs):
    """Return the lengths of all sentences of a list of pairs.

    Parameters
    ----------
    pairs : list of SickPair

    Returns
    -------
    numpy.ndarray of int
    """
    return np.array([len(p.a_tokens) for p in pairs]
                    + [len(p.b_tokens) for p in pairs], dtype=np.int64)
