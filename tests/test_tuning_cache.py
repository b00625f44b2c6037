"""The matmul autotuner's disk cache (kernels/tuning_cache.py, issue 22): a hit, a miss, a stale or
corrupt entry (ignored and rewritten, never a crash or a wrong tile), and a change of key or environment."""

import json

import pytest
import torch

from diyflash.kernels import tuning_cache as tc
from diyflash.kernels.matmul_configs import HALF_CANDIDATES, MatmulConfig

KEY = (torch.float16, False, (False, True), 1024, 2048, 512)
CFG, OTHER = HALF_CANDIDATES[0], HALF_CANDIDATES[3]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tc.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv(tc.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tc.cache_dir() == tmp_path / "diyflash"
    monkeypatch.setenv(tc.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert tc.cache_dir() == tmp_path / "mine"


def test_hit_and_miss(cache):
    env = tc.environment(torch.device("cpu"))
    assert tc.load(env, KEY, HALF_CANDIDATES) is None  # nothing stored yet
    tc.store(env, KEY, CFG, 0.5)
    assert tc.load(env, KEY, HALF_CANDIDATES) == (CFG, 0.5)
    other_key = (*KEY[:-1], 1024)
    assert tc.load(env, other_key, HALF_CANDIDATES) is None
    tc.store(env, other_key, OTHER, 0.25)  # a second entry keeps the first
    assert tc.load(env, KEY, HALF_CANDIDATES) == (CFG, 0.5)
    assert tc.load(env, other_key, HALF_CANDIDATES) == (OTHER, 0.25)
    assert [p.name for p in cache.iterdir()] == [tc.cache_file(env).name]  # no temporary file left


@pytest.mark.parametrize("change", ["gpu", "torch", "triton", "diyflash"])
def test_an_environment_change_misses(cache, change):
    env = tc.environment(torch.device("cpu"))
    tc.store(env, KEY, CFG, 0.5)
    changed = {**env, change: "something else"}
    assert tc.cache_file(changed) != tc.cache_file(env)
    assert tc.load(changed, KEY, HALF_CANDIDATES) is None


def test_stale_entry_is_ignored_and_rewritten(cache):
    """A config the tuner would not try today (a changed candidate list, a hand edit) is not used."""
    env = tc.environment(torch.device("cpu"))
    tc.store(env, KEY, CFG, 0.5)
    assert tc.load(env, KEY, [OTHER]) is None
    tc.store(env, KEY, OTHER, 0.7)
    assert tc.load(env, KEY, [OTHER]) == (OTHER, 0.7)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"environment": {}, "entries": {}}', "",
                                     "ENTRY_WITHOUT_MS", "ENTRY_WITH_BAD_FIELD"])
def test_corrupt_file_or_entry_is_ignored_and_rewritten(cache, content):
    env = tc.environment(torch.device("cpu"))
    path = tc.cache_file(env)
    path.parent.mkdir(parents=True)
    if content.startswith("ENTRY_"):
        entry = {"config": CFG.as_dict()}
        if content == "ENTRY_WITH_BAD_FIELD":
            entry = {"config": {**CFG.as_dict(), "block_m": "wide"}, "ms": 1.0}
        content = json.dumps({"environment": env, "entries": {tc.key_text(KEY): entry}})
    path.write_text(content)
    assert tc.load(env, KEY, HALF_CANDIDATES) is None
    tc.store(env, KEY, CFG, 0.5)
    assert tc.load(env, KEY, HALF_CANDIDATES) == (CFG, 0.5)


def test_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(tc.CACHE_DIR_ENV, str(blocker / "cache"))  # a directory under a file: cannot exist
    env = tc.environment(torch.device("cpu"))
    tc.store(env, KEY, CFG, 0.5)  # no exception
    assert tc.load(env, KEY, HALF_CANDIDATES) is None


def test_a_second_process_tunes_nothing(cache, monkeypatch):
    """select_config through the disk cache: the first "process" tunes and stores, a second one (the
    in-process choices cleared) reads the choice back and times nothing. The kernel launcher is made to
    look compiled so that the tuner's path runs on CPU tensors; _tune itself is replaced by a counter."""
    from diyflash.kernels import matmul as km

    tuned = []

    def fake_tune(a, b, allow_tf32):
        tuned.append(km.tuning_key(a, b, allow_tf32))
        return km.candidates(a.dtype, a.shape[0], b.shape[1], a.shape[1], a.device)[-1], 0.125

    monkeypatch.setattr(km._KERNEL, "interpreted", False)
    monkeypatch.setattr(km, "_tune", fake_tune)
    monkeypatch.setattr(km, "_TUNED", {})
    a, b = torch.randn(300, 200, dtype=torch.float16), torch.randn(200, 500, dtype=torch.float16)
    first = km.select_config(a, b, False, True)
    assert len(tuned) == 1
    monkeypatch.setattr(km, "_TUNED", {})  # a new process
    assert km.select_config(a, b, False, True) == first and len(tuned) == 1
    assert km.tuning_cache()[next(iter(km.tuning_cache()))]["ms"] == 0.125
    # another bucket is tuned, and a corrupt file makes the next process tune again
    km.select_config(torch.randn(3000, 200, dtype=torch.float16), b, False, True)
    assert len(tuned) == 2
    tc.cache_file(tc.environment(a.device)).write_text("garbage")
    monkeypatch.setattr(km, "_TUNED", {})
    assert km.select_config(a, b, False, True) == first and len(tuned) == 3
    monkeypatch.setattr(km, "_TUNED", {})
    km.select_config(a, b, False, True)
    assert len(tuned) == 3  # rewritten by the tuning above
    assert MatmulConfig(**json.loads(tc.cache_file(tc.environment(a.device)).read_text())["entries"][
        tc.key_text(tuned[0][1:])]["config"]) == first


def test_float_tile_fields_are_not_returned(cache):
    """A hand edit (or another writer) that stores 256.0 for 256: equal as numbers, refused by the kernel
    on every call if returned; ignored instead, and the key tuned again."""
    env = tc.environment(torch.device("cpu"))
    tc.store(env, KEY, CFG, 0.5)
    path = tc.cache_file(env)
    data = json.loads(path.read_text())
    entry = next(iter(data["entries"].values()))
    entry["config"]["block_m"] = float(entry["config"]["block_m"])
    path.write_text(json.dumps(data))
    assert tc.load(env, KEY, HALF_CANDIDATES) is None
    entry["config"]["block_m"] = CFG.block_m
    entry["config"]["use_tma"] = int(entry["config"]["use_tma"])  # 1 for True: the same refusal
    path.write_text(json.dumps(data))
    assert tc.load(env, KEY, HALF_CANDIDATES) is None


def test_deeply_nested_file_reads_as_empty(cache):
    env = tc.environment(torch.device("cpu"))
    path = tc.cache_file(env)
    path.parent.mkdir(parents=True)
    path.write_text("[" * 100000 + "]" * 100000)
    assert tc.load(env, KEY, HALF_CANDIDATES) is None
    tc.store(env, KEY, CFG, 0.5)  # rewritten
    assert tc.load(env, KEY, HALF_CANDIDATES) == (CFG, 0.5)


def test_cache_dir_expands_home_and_ignores_a_relative_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(tc.CACHE_DIR_ENV, "~/x")
    assert tc.cache_dir() == tmp_path / "x"
    monkeypatch.delenv(tc.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert tc.cache_dir() == tmp_path / ".cache" / "diyflash"


def test_a_directory_on_the_file_path_leaves_no_temporary_files(cache):
    env = tc.environment(torch.device("cpu"))
    tc.cache_file(env).mkdir(parents=True)  # a directory where the file goes
    for _ in range(3):
        tc.store(env, KEY, CFG, 0.5)  # cannot replace a directory: skipped, as the docstring says
    assert [p.name for p in cache.iterdir()] == [tc.cache_file(env).name]
    assert tc.load(env, KEY, HALF_CANDIDATES) is None
