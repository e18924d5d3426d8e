"""Tests of the SICK data loader, trees and target distributions."""
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.sick_data import (SickDataError, Tree, attach_words,  # noqa: E402
                                default_data_dir, expected_score, load_split,
                                parse_parents, random_corpus, random_parents,
                                target_distribution, tree_parents,
                                write_split)

SICK_DIR = REPO_ROOT.parent / "shared" / "data" / "sick"

# "The young boys are playing outdoors and the man is smiling nearby"
DEV_LINE_1 = [3, 3, 5, 5, 11, 5, 6, 9, 6, 11, 0, 11]

GOOD = {
    "a.toks": ["a dog runs", "two cats sleep here", "it rains"],
    "b.toks": ["a dog walks", "cats nap", "rain falls"],
    "a.parents": ["2 3 0", "2 3 0 3", "2 0"],
    "b.parents": ["2 3 0", "2 0", "2 0"],
    "sim.txt": ["4.5", "3.2", "1"],
}


def write_files(root, split="dev", **overrides):
    """Write the GOOD split with some files' lines replaced."""
    split_dir = root / split
    split_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in {**GOOD, **overrides}.items():
        (split_dir / name).write_text("".join(f"{x}\n" for x in lines))
    return split_dir


def children_indices(node):
    return [c.index for c in node.children]


def test_parse_parents_builds_expected_tree():
    root = parse_parents(DEV_LINE_1)
    assert root.index == 10
    assert children_indices(root) == [4, 9, 11]
    playing = root.children[0]
    assert children_indices(playing) == [2, 3, 5]
    assert root.size() == 12
    assert sorted(n.index for n in root) == list(range(12))
    # smiling -> playing -> outdoors -> man -> the
    assert root.height() == 5
    assert all(n.word is None for n in root)


def test_tree_helpers():
    leaf = Tree(0, word=7)
    assert leaf.size() == 1 and leaf.height() == 1 and leaf.is_leaf()
    root = Tree(1, children=[Tree(0), Tree(2, children=[Tree(3)])])
    assert [n.index for n in root] == [1, 0, 2, 3]
    assert [n.index for n in root.postorder()] == [0, 3, 2, 1]
    assert root.height() == 3
    assert tree_parents(root) == [2, 0, 2, 3]
    attach_words(root, [10, 11, 12, 13])
    assert {n.index: n.word for n in root} == {0: 10, 1: 11, 2: 12, 3: 13}


def test_deep_chain_has_no_recursion_limit():
    n = 5000
    root = parse_parents([0] + list(range(1, n)))
    assert root.size() == n
    assert root.height() == n


@pytest.mark.parametrize("parents, match", [
    ([2, 0, 0], "exactly one root"),
    ([2, 3, 1], "exactly one root"),
    ([0, 3, 2], "cycle"),
    ([0, 3, 4, 2], "cycle"),
    ([0, 2], "cycle"),
    ([0, 4, 1], "outside 0..3"),
    ([0, -1], "outside"),
    ([], "empty"),
])
def test_parse_parents_rejects(parents, match):
    with pytest.raises(SickDataError, match=match) as info:
        parse_parents(parents, source=("x/a.parents", 17))
    assert str(info.value).startswith("x/a.parents:17: ")
    assert info.value.lineno == 17


def test_parse_parents_checks_length():
    with pytest.raises(SickDataError, match="3 entries .* 4 tokens"):
        parse_parents([2, 0, 2], n_tokens=4)


def test_load_split_good(tmp_path):
    write_files(tmp_path)
    pairs = load_split(tmp_path, "dev")
    assert len(pairs) == 3
    first = pairs[0]
    assert first.a_tokens == ["a", "dog", "runs"]
    assert first.score == 4.5
    assert first.a_tree.index == 2 and children_indices(first.a_tree) == [1]
    assert pairs[1].a_tree.size() == 4
    assert children_indices(pairs[1].a_tree) == [1, 3]
    assert pairs[2].score == 1.0


def test_write_split_round_trip(tmp_path):
    pairs = random_corpus(20, seed=3)
    write_split(pairs, tmp_path, "train")
    loaded = load_split(tmp_path, "train")
    assert [p.a_tokens for p in loaded] == [p.a_tokens for p in pairs]
    assert [tree_parents(p.b_tree) for p in loaded] == \
        [tree_parents(p.b_tree) for p in pairs]
    np.testing.assert_allclose([p.score for p in loaded],
                               [p.score for p in pairs])


def expect_error(tmp_path, file_name, lineno, match, **overrides):
    split_dir = write_files(tmp_path, **overrides)
    with pytest.raises(SickDataError, match=match) as info:
        load_split(tmp_path, "dev")
    assert info.value.path == str(split_dir / file_name)
    assert info.value.lineno == lineno
    assert f"{split_dir / file_name}:{lineno}:" in str(info.value)


def test_missing_line(tmp_path):
    expect_error(tmp_path, "sim.txt", 3, "line missing",
                 **{"sim.txt": ["4.5", "3.2"]})


def test_extra_line(tmp_path):
    expect_error(tmp_path, "b.toks", 4, "extra line",
                 **{"b.toks": GOOD["b.toks"] + ["one more"]})


def test_parents_wrong_length(tmp_path):
    expect_error(tmp_path, "a.parents", 2, "3 entries .* 4 tokens",
                 **{"a.parents": ["2 3 0", "2 3 0", "2 0"]})


def test_no_root(tmp_path):
    expect_error(tmp_path, "b.parents", 3,
                 r"exactly one root \(head 0\), found 0",
                 **{"b.parents": ["2 3 0", "2 0", "2 1"]})


def test_two_roots(tmp_path):
    expect_error(tmp_path, "a.parents", 1, "found 2",
                 **{"a.parents": ["0 3 0", "2 3 0 3", "2 0"]})


def test_cycle(tmp_path):
    expect_error(tmp_path, "a.parents", 2, "cycle",
                 **{"a.parents": ["2 3 0", "2 4 0 1", "2 0"]})


def test_not_integers(tmp_path):
    expect_error(tmp_path, "b.parents", 1, "not all integers",
                 **{"b.parents": ["2 x 0", "2 0", "2 0"]})


def test_bad_score(tmp_path):
    expect_error(tmp_path, "sim.txt", 2, "outside",
                 **{"sim.txt": ["4.5", "5.5", "1"]})
    expect_error(tmp_path, "sim.txt", 1, "not a number",
                 **{"sim.txt": ["high", "3", "1"]})


def test_empty_sentence(tmp_path):
    expect_error(tmp_path, "a.toks", 3, "empty sentence",
                 **{"a.toks": ["a dog runs", "two cats sleep here", ""]})


def test_missing_file(tmp_path):
    split_dir = write_files(tmp_path)
    (split_dir / "b.parents").unlink()
    with pytest.raises(SickDataError, match="b.parents") as info:
        load_split(tmp_path, "dev")
    assert info.value.path == str(split_dir)
    with pytest.raises(SickDataError, match="split directory not found"):
        load_split(tmp_path, "test")


def test_real_dev_split():
    if not (SICK_DIR / "dev").is_dir():
        pytest.skip(f"SICK not found at {SICK_DIR}")
    pairs = load_split(SICK_DIR, "dev")
    assert len(pairs) == 500
    assert pairs[0].a_tokens[:3] == ["The", "young", "boys"]
    assert tree_parents(pairs[0].a_tree) == DEV_LINE_1
    assert pairs[0].score == pytest.approx(3.6)
    for pair in pairs:
        assert pair.a_tree.size() == len(pair.a_tokens)
        assert pair.b_tree.size() == len(pair.b_tokens)
        assert 1.0 <= pair.score <= 5.0
    assert default_data_dir().resolve() == SICK_DIR.resolve()


def test_random_corpus_is_valid_and_seeded():
    pairs = random_corpus(50, seed=1)
    assert len(pairs) == 50
    for pair in pairs:
        assert pair.a_tree.size() == len(pair.a_tokens)
        assert pair.b_tree.size() == len(pair.b_tokens)
        assert 1.0 <= pair.score <= 5.0
    again = random_corpus(50, seed=1)
    assert [p.b_tokens for p in again] == [p.b_tokens for p in pairs]
    other = random_corpus(50, seed=2)
    assert [p.a_tokens for p in other] != [p.a_tokens for p in pairs]
    assert len({p.score for p in pairs}) > 5


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.randoms(use_true_random=False))
def test_random_parents_parse(n, rng):
    parents = random_parents(n, rng)
    assert tree_parents(parse_parents(parents)) == parents


@pytest.mark.parametrize("score, expected", [
    (3.6, [0, 0, 0.4, 0.6, 0]),
    (1.0, [1, 0, 0, 0, 0]),
    (5.0, [0, 0, 0, 0, 1]),
    (4.25, [0, 0, 0, 0.75, 0.25]),
])
def test_target_distribution_values(score, expected):
    np.testing.assert_allclose(target_distribution(score), expected,
                               atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.floats(1.0, 5.0))
def test_target_round_trip(score):
    probs = target_distribution(score)
    assert probs.shape == (5,)
    assert (probs >= 0).all()
    assert probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert np.count_nonzero(probs) <= 2
    assert expected_score(probs) == pytest.approx(score, abs=1e-5)


def test_target_batched_and_range():
    scores = np.array([1.0, 2.5, 4.9])
    probs = target_distribution(scores)
    assert probs.shape == (3, 5)
    np.testing.assert_allclose(expected_score(probs), scores, rtol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert target_distribution(2.0, num_classes=3).tolist() == [0, 1, 0]
    for bad in (0.5, 5.01):
        with pytest.raises(ValueError):
            target_distribution(bad)
