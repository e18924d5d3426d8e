"""Stanford Sentiment Treebank (SST) trees: parsing, loading and vocabulary.

The data are binarised constituency trees, one bracketed tree per line, with
a sentiment label 0-4 on every node, e.g.::

    (3 (2 The) (4 (3 good) (2 film)))

A pre-terminal such as ``(2 The)`` has exactly one child, its word; it is
represented here by a single :class:`SSTTree` whose ``word`` is set and whose
``children`` list is empty. Internal nodes have ``word = None`` and one or
more subtree children (two in the binarised SST files).

The data are never copied into the repository; :func:`default_sst_dir`
finds them at ``../shared/data/sst`` relative to the repository root (or at
the directory named by the ``GLUON_DYNBATCH_SST_DIR`` environment variable).
"""
import logging
import os
import re

logger = logging.getLogger(__name__)

UNK = "<unk>"
"""The token that stands for every word missing from the vocabulary."""

SPLITS = ("train", "dev", "test")
NUM_CLASSES = 5
ENV_VAR = "GLUON_DYNBATCH_SST_DIR"

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SSTFormatError(ValueError):
    """A line of an SST file is not a well-formed labelled tree."""


class SSTTree:
    """One node of an SST tree (and, through ``children``, its subtree).

    Parameters
    ----------
    label : int
        Sentiment label of the node, 0 (very negative) to 4 (very positive).
    word : str or None
        The word of a pre-terminal node; None for an internal node.
    children : list of SSTTree, optional
        Subtrees of an internal node; empty for a pre-terminal.
    word_id : int or None, optional
        Vocabulary id of ``word``, set by :func:`assign_ids`.
    """

    __slots__ = ("label", "word", "word_id", "children")

    def __init__(self, label, word=None, children=None, word_id=None):
        self.label = label
        self.word = word
        self.word_id = word_id
        self.children = children if children is not None else []

    @property
    def is_preterminal(self):
        """bool: True when the node carries a word (and has no children)."""
        return self.word is not None

    def postorder(self):
        """Return the nodes of the subtree in post-order.

        Children come before their parent, the left subtree before the right
        one. Every returned node is a non-terminal (a pre-terminal or an
        internal node), so this is also the order of the per-node losses.

        Returns
        -------
        list of SSTTree
        """
        out, stack = [], [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded or node.is_preterminal:
                out.append(node)
                continue
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))
        return out

    def words(self):
        """Return the words of the sentence, left to right.

        Returns
        -------
        list of str
        """
        return [node.word for node in self.postorder() if node.is_preterminal]

    def depth(self):
        """Return the number of nodes on the longest root-to-word path.

        Returns
        -------
        int
        """
        if self.is_preterminal:
            return 1
        return 1 + max(child.depth() for child in self.children)

    def is_binary(self):
        """Return True when every internal node has exactly two children.

        Returns
        -------
        bool
        """
        return all(node.is_preterminal or len(node.children) == 2
                   for node in self.postorder())

    def to_string(self):
        """Return the tree in the bracketed format it was parsed from.

        Returns
        -------
        str
        """
        if self.is_preterminal:
            return "(%d %s)" % (self.label, self.word)
        inner = " ".join(child.to_string() for child in self.children)
        return "(%d %s)" % (self.label, inner)

    def __repr__(self):
        return "SSTTree(%s)" % self.to_string()


_TOKEN = re.compile(r"[()]|[^()\x20\t\r\n\f\v]+")


def _tokenize(line):
    """Split a bracketed line into '(', ')' and atom tokens.

    Only ASCII whitespace separates tokens: SST has words with a
    no-break space inside (``8\u00a01\\/2``).
    """
    return _TOKEN.findall(line)


def _parse_label(token, source):
    """Return the integer label ``token`` or raise SSTFormatError."""
    try:
        label = int(token)
    except ValueError:
        raise SSTFormatError("%s: expected a label 0-%d after '(', got %r"
                             % (source, NUM_CLASSES - 1, token)) from None
    if not 0 <= label < NUM_CLASSES:
        raise SSTFormatError("%s: label %d outside 0-%d"
                             % (source, label, NUM_CLASSES - 1))
    return label


def _close_node(frame, source):
    """Turn an open-node frame [label, word, children] into an SSTTree."""
    label, word, children = frame
    if word is None and not children:
        raise SSTFormatError("%s: node with label %d has no word and no "
                             "children" % (source, label))
    if word is not None:
        return SSTTree(label, word=word)
    return SSTTree(label, children=children)


def _add_word(frame, word, source):
    """Attach ``word`` to the open node ``frame``."""
    if frame[1] is not None or frame[2]:
        raise SSTFormatError("%s: node with label %d has more than one "
                             "child where one is a word (%r)"
                             % (source, frame[0], word))
    frame[1] = word


def _add_child(frame, child, source):
    """Attach the subtree ``child`` to the open node ``frame``."""
    if frame[1] is not None:
        raise SSTFormatError("%s: node with label %d mixes the word %r with "
                             "subtrees" % (source, frame[0], frame[1]))
    frame[2].append(child)


def parse_sst_line(line, source="<string>"):
    """Parse one bracketed SST tree.

    Parameters
    ----------
    line : str
        One tree such as ``"(3 (2 The) (4 (3 good) (2 film)))"``.
    source : str, optional
        Where the line comes from (e.g. ``"train.txt:12"``); every error
        message starts with it.

    Returns
    -------
    SSTTree
        The root node; ``word_id`` is not set (see :func:`assign_ids`).

    Raises
    ------
    SSTFormatError
        If the brackets are unbalanced, a label is missing or not 0-4, a node
        is empty, a node mixes a word with subtrees, or text follows the tree.
    """
    tokens = _tokenize(line)
    if not tokens:
        raise SSTFormatError("%s: empty line, expected a tree" % source)
    if tokens[0] != "(":
        raise SSTFormatError("%s: a tree must start with '(', got %r"
                             % (source, tokens[0]))
    stack, root, pos = [], None, 0
    while pos < len(tokens):
        token = tokens[pos]
        if root is not None:
            raise SSTFormatError("%s: unexpected %r after the end of the "
                                 "tree (too many ')' or a second tree)"
                                 % (source, token))
        if token == "(":
            if pos + 1 >= len(tokens):
                raise SSTFormatError("%s: line ends after '('" % source)
            stack.append([_parse_label(tokens[pos + 1], source), None, []])
            pos += 2
            continue
        if not stack:
            raise SSTFormatError("%s: unexpected %r outside any node"
                                 % (source, token))
        if token == ")":
            node = _close_node(stack.pop(), source)
            if stack:
                _add_child(stack[-1], node, source)
            else:
                root = node
        else:
            _add_word(stack[-1], token, source)
        pos += 1
    if stack:
        raise SSTFormatError("%s: unbalanced brackets, %d node(s) not closed "
                             "(missing ')')" % (source, len(stack)))
    return root


def _split_path(data_dir, split):
    """Return the path of ``split`` in ``data_dir`` or raise a clear error."""
    if split not in SPLITS:
        raise ValueError("unknown SST split %r, expected one of %s"
                         % (split, ", ".join(SPLITS)))
    path = os.path.join(data_dir, split + ".txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            "SST file %s not found; point data_dir at the folder holding "
            "train.txt/dev.txt/test.txt (in this project: ../shared/data/sst "
            "from the repository root, or set %s)" % (path, ENV_VAR))
    return path


def load_sst_file(path):
    """Parse every non-blank line of a bracketed-tree file.

    Parameters
    ----------
    path : str
        A text file with one tree per line.

    Returns
    -------
    list of SSTTree

    Raises
    ------
    SSTFormatError
        On the first malformed line; the message names the file and line.
    """
    trees = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if line.strip():
                trees.append(parse_sst_line(line, "%s:%d" % (path, lineno)))
    logger.debug("read %d trees from %s", len(trees), path)
    return trees


def load_sst(data_dir, split):
    """Load one split of the SST trees.

    Parameters
    ----------
    data_dir : str
        Folder holding ``train.txt``, ``dev.txt`` and ``test.txt``.
    split : {'train', 'dev', 'test'}
        Which file to read.

    Returns
    -------
    list of SSTTree
        Trees in file order, without word ids (see :func:`assign_ids`).

    Raises
    ------
    ValueError
        If ``split`` is not one of the three names.
    FileNotFoundError
        If the file is absent.
    SSTFormatError
        If a line is malformed (the message names file and line).
    """
    return load_sst_file(_split_path(data_dir, split))


def build_vocab(trees):
    """Build a word -> id mapping from the words of ``trees``.

    Parameters
    ----------
    trees : iterable of SSTTree
        Usually the training trees.

    Returns
    -------
    dict
        ``UNK`` has id 0; the other words (case kept) follow in sorted order,
        so the mapping does not depend on the order of the trees.
    """
    words = set()
    for tree in trees:
        words.update(tree.words())
    words.discard(UNK)
    vocab = {UNK: 0}
    for word in sorted(words):
        vocab[word] = len(vocab)
    return vocab


def assign_ids(trees, vocab):
    """Set ``word_id`` on every pre-terminal of ``trees``.

    Parameters
    ----------
    trees : list of SSTTree
        Trees to annotate in place.
    vocab : dict
        Mapping from word to id that contains ``UNK``.

    Returns
    -------
    list of SSTTree
        The same ``trees``, for chaining. Words missing from ``vocab`` get
        the id of ``UNK``.
    """
    unk_id = vocab[UNK]
    unknown = total = 0
    for tree in trees:
        for node in tree.postorder():
            if node.is_preterminal:
                node.word_id = vocab.get(node.word, unk_id)
                unknown += node.word_id == unk_id
                total += 1
    logger.debug("assigned ids to %d words, %d unknown", total, unknown)
    return trees


def default_sst_dir():
    """Return the folder of the SST trees, or None when it is absent.

    Looks at the ``GLUON_DYNBATCH_SST_DIR`` environment variable first, then
    at ``../shared/data/sst`` relative to the repository root.

    Returns
    -------
    str or None
    """
    env_dir = os.environ.get(ENV_VAR)
    if env_dir:
        if os.path.isfile(os.path.join(env_dir, "train.txt")):
            return os.path.normpath(env_dir)
        logger.warning("%s=%s holds no train.txt; ignoring it", ENV_VAR,
                       env_dir)
    path = os.path.join(_REPO_ROOT, "..", "shared", "data", "sst")
    if os.path.isfile(os.path.join(path, "train.txt")):
        return os.path.normpath(path)
    return None
