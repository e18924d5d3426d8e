"""Fetching the SICK example's data: downloads checked, atomic, retried.

Every test serves its files from a local HTTP server on 127.0.0.1 (an
ephemeral port) and points ``MXNET_HOME`` at a temporary directory, so
nothing here touches the network or the user's cache.
"""
import hashlib
import http.server
import json
import logging
import socket
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples import data_sources  # noqa: E402
from examples import tree_lstm_sick as script  # noqa: E402
from examples.data_sources import DataUnavailable  # noqa: E402

SHARED = REPO_ROOT.parent / "shared" / "data"


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files`` (URL path -> bytes); a path in
    ``server.break_once`` gets half its body, then a closed connection, the
    first time it is asked for."""

    def do_GET(self):  # noqa: N802 - http.server's name
        server = self.server
        server.requests.append(self.path)
        body = server.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in server.break_once:
            server.break_once.discard(self.path)
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        """Quiet."""


@pytest.fixture
def server():
    """A file server on 127.0.0.1; ``server.url`` is its base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.files, httpd.break_once, httpd.requests = {}, set(), []
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.fixture
def dead_url():
    """The URL of a port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """An empty cache and no local copies; fast retries."""
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxnet"))
    monkeypatch.setenv(data_sources.LOCAL_DATA_ENV, "")
    monkeypatch.delenv(data_sources.DATA_URL_ENV, raising=False)
    monkeypatch.setattr(data_sources, "RETRY_PAUSE", 0.01)
    return tmp_path / "mxnet"


def sha1(data):
    return hashlib.sha1(data).hexdigest()


def files_under(path):
    return sorted(p for p in Path(path).rglob("*") if p.is_file())


def test_good_download_is_checked_and_in_place(server, tmp_path):
    body = b"the quick brown fox\n" * 1000
    server.files["/x/a.txt"] = body
    dest = tmp_path / "cache" / "a.txt"
    assert data_sources.download(f"{server.url}/x/a.txt", dest,
                                 sha1(body)) == dest
    assert dest.read_bytes() == body
    assert files_under(tmp_path / "cache") == [dest]


def test_corrupt_file_names_both_hashes_and_leaves_nothing(server,
                                                           tmp_path):
    body = b"a b c\n" * 100
    server.files["/x/a.toks"] = body
    dest = tmp_path / "cache" / "a.toks"
    expected = sha1(b"something else")
    with pytest.raises(DataUnavailable) as info:
        data_sources.download(f"{server.url}/x/a.toks", dest, expected)
    message = str(info.value)
    assert "a.toks" in message and expected in message
    assert sha1(body) in message
    assert files_under(tmp_path / "cache") == []
    assert server.requests == ["/x/a.toks"]  # a wrong file is not retried


def test_interrupted_download_is_tried_again(server, tmp_path, no_data,
                                             caplog):
    body = bytes(range(256)) * 2000
    server.files["/x/big.bin"] = body
    server.break_once.add("/x/big.bin")
    dest = tmp_path / "cache" / "big.bin"
    with caplog.at_level(logging.WARNING):
        data_sources.download(f"{server.url}/x/big.bin", dest, sha1(body))
    assert dest.read_bytes() == body
    assert server.requests == ["/x/big.bin"] * 2
    assert "trying again" in caplog.text and "bytes" in caplog.text
    assert files_under(tmp_path / "cache") == [dest]


def test_server_down_is_a_clear_error(dead_url, tmp_path, no_data):
    dest = tmp_path / "cache" / "a.toks"
    with pytest.raises(DataUnavailable, match="cannot connect"):
        data_sources.download(f"{dead_url}/a.toks", dest, sha1(b""),
                              attempts=2)
    assert files_under(tmp_path / "cache") == []


def test_missing_file_is_not_retried(server, tmp_path):
    with pytest.raises(DataUnavailable, match="HTTP 404"):
        data_sources.download(f"{server.url}/nothing", tmp_path / "f",
                              sha1(b""))
    assert server.requests == ["/nothing"]


def test_urls_default_and_mirror(monkeypatch):
    monkeypatch.delenv(data_sources.DATA_URL_ENV, raising=False)
    monkeypatch.delenv("MXNET_GLUON_REPO", raising=False)
    assert data_sources.sick_url("dev/sim.txt") == (
        "https://raw.githubusercontent.com/castorini/MP-CNN-Torch/"
        "68cb72f677062113f54071fc9b8c05e7b5ff6152/data/sick/dev/sim.txt")
    assert data_sources.glove_url("glove.6B.50d").endswith(
        "/gluon/embeddings/glove/glove.6B.50d.npz")
    monkeypatch.setenv(data_sources.DATA_URL_ENV, "http://mirror/d/")
    assert data_sources.sick_url("dev/sim.txt") == \
        "http://mirror/d/sick/dev/sim.txt"
    assert data_sources.glove_url("glove.840B.300d") == \
        "http://mirror/d/glove/glove.840B.300d.npz"
    names = data_sources.glove_sources()
    assert {"glove.6B.50d", "glove.840B.300d"} <= set(names)


@pytest.mark.skipif(not (SHARED / "sick" / "dev").is_dir(),
                    reason="no local SICK copy")
def test_recorded_sick_hashes_match_the_local_copy():
    for rel, (digest, size) in data_sources.SICK_FILES.items():
        path = SHARED / "sick" / rel
        assert path.stat().st_size == size, rel
        assert data_sources.sha1_of(path) == digest, rel


def serve_sick(server, files):
    """Serve ``files`` (rel -> bytes) as the mirror's ``sick/`` folder."""
    for rel, body in files.items():
        server.files[f"/sick/{rel}"] = body


def fake_sick(monkeypatch):
    """Record two small files as the SICK set; return their contents."""
    files = {"dev/a.toks": b"A man runs\n", "dev/sim.txt": b"3.5\n"}
    monkeypatch.setattr(data_sources, "SICK_FILES", {
        rel: (sha1(body), len(body)) for rel, body in files.items()})
    return files


def test_ensure_sick_fetches_once_then_uses_the_cache(server, no_data,
                                                      monkeypatch):
    files = fake_sick(monkeypatch)
    serve_sick(server, files)
    monkeypatch.setenv(data_sources.DATA_URL_ENV, server.url + "/")
    root = data_sources.ensure_sick()
    assert root == no_data / "datasets" / "sick"
    for rel, body in files.items():
        assert (root / rel).read_bytes() == body
    assert len(server.requests) == 2
    assert data_sources.ensure_sick(offline=True) == root
    (root / "dev" / "sim.txt").write_bytes(b"4.0\n")  # damaged
    assert data_sources.ensure_sick() == root
    assert (root / "dev" / "sim.txt").read_bytes() == b"3.5\n"
    assert server.requests[2:] == ["/sick/dev/sim.txt"]


def test_ensure_sick_offline_never_downloads(server, no_data, monkeypatch):
    serve_sick(server, fake_sick(monkeypatch))
    monkeypatch.setenv(data_sources.DATA_URL_ENV, server.url)
    with pytest.raises(DataUnavailable, match="--offline"):
        data_sources.ensure_sick(offline=True)
    assert server.requests == []


def write_npz(path, tokens, table):
    """A GloVe file as gluonnlp serialises one."""
    np.savez_compressed(path, unknown_token=np.array("<unk>"),
                        idx_to_token=np.array(tokens, dtype="O"),
                        idx_to_vec=table.astype(np.float32))


def test_glove_by_name_is_fetched_and_filtered(server, no_data, tmp_path,
                                               monkeypatch):
    tokens = ["<unk>", "man", "runs", "dog", "man"]
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    write_npz(tmp_path / "g.npz", tokens, table)
    body = (tmp_path / "g.npz").read_bytes()
    monkeypatch.setattr(data_sources, "glove_sources", lambda: {
        "glove.test.4d": ("glove.test.4d.npz", sha1(body))})
    server.files["/glove/glove.test.4d.npz"] = body
    monkeypatch.setenv(data_sources.DATA_URL_ENV, server.url)
    path = data_sources.ensure_glove("glove.test.4d")
    assert path == no_data / "embedding" / "glove" / "glove.test.4d.npz"
    vectors = data_sources.load_vectors(path, ["man", "dog", "cat"])
    assert vectors.dim == 4 and sorted(vectors) == ["dog", "man"]
    np.testing.assert_array_equal(vectors["man"], table[1])  # the first
    np.testing.assert_array_equal(vectors["dog"], table[3])


def test_text_vectors_keep_only_the_tokens_asked_for(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text("the 0.1 0.2 0.3\n"
                    ". . . 9 9 9\n"          # a token with spaces
                    "man 1 2 3\n"
                    ". 4 5 6\n"
                    "man 7 8 9\n", encoding="utf-8")
    vectors = data_sources.load_vectors(path, {"man", ".", "cat"})
    assert vectors.dim == 3 and sorted(vectors) == [".", "man"]
    np.testing.assert_array_equal(vectors["man"], [1, 2, 3])
    np.testing.assert_array_equal(vectors["."], [4, 5, 6])
    path.write_text("man 1 x 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=":1: a value is not a number"):
        data_sources.load_vectors(path, {"man"})


@pytest.mark.skipif(not (SHARED / "glove").is_dir(),
                    reason="no local GloVe copy")
def test_text_loader_agrees_with_gluonnlp():
    import gluonnlp as nlp
    path = SHARED / "glove" / data_sources.LOCAL_GLOVE_NAME
    reference = nlp.embedding.TokenEmbedding.from_file(str(path))
    words = ["man", "the", "guitar", "zzzunknown"]
    vectors = data_sources.load_vectors(path, words)
    assert sorted(vectors) == ["guitar", "man", "the"]
    for word in vectors:
        np.testing.assert_array_equal(vectors[word],
                                      reference[word].asnumpy())


TINY_RUN = ["--max-pairs", "20", "--max-eval-pairs", "30", "--epochs", "1",
            "--batch-size", "10", "--memory", "12", "--hidden", "6",
            "--log-interval", "0"]


def test_example_without_any_source_exits_with_instructions(
        dead_url, no_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(data_sources.DATA_URL_ENV, dead_url)
    code = script.main(TINY_RUN + ["--save-dir", str(tmp_path / "run"),
                                   "--glove", "random"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: the data cannot be had" in err and "cannot connect" in err
    assert "--data-dir DIR" in err and data_sources.DATA_URL_ENV in err
    assert str(no_data / "datasets" / "sick") in err
    assert "Traceback" not in err
    assert files_under(no_data) == []
    assert not (tmp_path / "run" / "summary.json").exists()
    code = script.main(TINY_RUN + ["--save-dir", str(tmp_path / "run"),
                                   "--offline"])
    assert code == 2 and "--offline" in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "sick" / "train").is_dir(),
                    reason="no local SICK copy to serve")
def test_example_fetches_real_sick_from_a_mirror_and_trains(
        server, no_data, tmp_path, monkeypatch, capsys):
    for rel in data_sources.SICK_FILES:
        server.files[f"/sick/{rel}"] = (SHARED / "sick" / rel).read_bytes()
    server.break_once.add("/sick/train/a.toks")
    monkeypatch.setenv(data_sources.DATA_URL_ENV, server.url)
    glove = SHARED / "glove" / data_sources.LOCAL_GLOVE_NAME
    run_dir = tmp_path / "run"
    code = script.main(TINY_RUN + [
        "--save-dir", str(run_dir),
        "--glove", str(glove) if glove.is_file() else "random"])
    assert code == 0
    cache = no_data / "datasets" / "sick"
    assert len(files_under(cache)) == len(data_sources.SICK_FILES)
    for rel, (digest, _) in data_sources.SICK_FILES.items():
        assert data_sources.sha1_of(cache / rel) == digest
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data"] == "sick" and summary["data_dir"] == str(cache)
    assert summary["vocab_size"] > 2000  # the whole training vocabulary
    assert "test (sick): pearson" in capsys.readouterr().out
    requests = len(server.requests)
    assert script.main(TINY_RUN + ["--save-dir", str(tmp_path / "again"),
                                   "--glove", "random", "--offline"]) == 0
    assert len(server.requests) == requests  # the cache, not the network


def test_manual_instructions_give_the_public_glove_address_when_a_mirror_is_set(monkeypatch):
    """The mirror that just failed was given as GloVe's address to download by hand."""
    monkeypatch.setenv(data_sources.DATA_URL_ENV, "http://127.0.0.1:9")
    text = data_sources.manual_instructions()
    assert "127.0.0.1:9/glove" not in text.split("Without a network")[1].split("and copy")[0]
    assert data_sources.glove_url(data_sources.DEFAULT_GLOVE).startswith("http://127.0.0.1:9")


@pytest.mark.parametrize("argv", [["--strategy", "bogus"], ["--max-pairs", "0"],
                                  ["--max-eval-pairs", "-3"]])
def test_bad_flags_are_refused_before_any_data_is_read(argv, capsys):
    """An unknown strategy failed with a traceback after the data had loaded; a
    pair limit of 0 or below trained on nothing or on a slice from the end."""
    with pytest.raises(SystemExit) as info:
        script.parse_args(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err
