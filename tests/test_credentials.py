"""The deployment's credentials (:mod:`fastdeploy_mtp.credentials`): where the splitwise secret
comes from and what file is refused, the bearer check, signatures, the dropped counts."""

from __future__ import annotations

import os
import stat

import pytest

from fastdeploy_mtp import credentials as cred


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> str:
    """No secret in the environment, the per-user default under a fresh config folder."""
    monkeypatch.delenv(cred.SECRET_ENV, raising=False)
    monkeypatch.delenv(cred.API_KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return str(tmp_path)


def write(path: str, data: bytes, mode: int = 0o600) -> str:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return path


def test_the_default_secret_is_created_once_private_and_random(no_env: str) -> None:
    path = cred.default_secret_path()
    assert str(path).startswith(no_env) and not path.exists()
    first = cred.splitwise_secret()
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(first) == 64 and cred.splitwise_secret() == first  # read back, not drawn again
    os.unlink(path)
    assert cred.splitwise_secret() != first  # a new default is a new random secret


def test_the_environment_wins_then_the_file(no_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(os.path.join(no_env, "s"), b"  file-secret-of-some-length \n")
    assert cred.splitwise_secret(path) == b"file-secret-of-some-length"
    monkeypatch.setenv(cred.SECRET_ENV, "env-secret-0123456789")
    assert cred.splitwise_secret(path) == b"env-secret-0123456789"
    monkeypatch.setenv(cred.SECRET_ENV, "short")
    with pytest.raises(
        cred.CredentialError, match=f"environment variable {cred.SECRET_ENV}: .* at least 16 bytes"
    ):
        cred.splitwise_secret()


@pytest.mark.parametrize(
    ("mode", "data", "message"),
    [
        (0o644, b"x" * 32, r"mode 0644 lets other users read it; `chmod 600` it"),
        (0o640, b"x" * 32, r"mode 0640"),
        (0o600, b"x" * 15, r"at least 16 bytes, got 15"),
        (0o600, b"x" * 5000, r"too long \(more than 4096 bytes\)"),
    ],
)
def test_a_secret_file_others_may_read_or_of_a_bad_size_is_refused(
    no_env: str, mode: int, data: bytes, message: str
) -> None:
    path = write(os.path.join(no_env, "s"), data, mode)
    with pytest.raises(cred.CredentialError, match=f"splitwise secret file {path}: .*{message}"):
        cred.splitwise_secret(path)


def test_a_secret_file_of_another_user_a_link_or_a_folder_is_refused(no_env: str) -> None:
    theirs = write(os.path.join(no_env, "theirs"), b"y" * 32)
    os.chown(theirs, 65534, 65534)  # nobody's (the tests run as root)
    with pytest.raises(cred.CredentialError, match=r"owned by uid 65534, not by this user"):
        cred.splitwise_secret(theirs)
    ours = write(os.path.join(no_env, "ours"), b"z" * 32)
    link = os.path.join(no_env, "link")
    os.symlink(ours, link)
    with pytest.raises(cred.CredentialError, match=f"splitwise secret file {link}: "):
        cred.splitwise_secret(link)
    with pytest.raises(cred.CredentialError, match="not a regular file"):
        cred.splitwise_secret(no_env)
    with pytest.raises(cred.CredentialError, match="No such file"):
        cred.splitwise_secret(os.path.join(no_env, "missing"))


def test_matching_key_names_the_exact_key_it_matched() -> None:
    keys = [b"k1-abcdef", b"k2-ghijkl"]
    assert cred.matching_key(b"Bearer k1-abcdef", keys) == 0
    assert cred.matching_key(b"bearer k2-ghijkl", keys) == 1
    for header in (
        None,
        b"",
        b"k1-abcdef",
        b"Basic k1-abcdef",
        b"Bearer k1-abcde",
        b"Bearer k1-abcdefg",
        b"Bearer \xff",
    ):
        assert cred.matching_key(header, keys) is None, header
    assert cred.matching_key(b"Bearer k1-abcdef", []) is None


def test_signatures_cover_every_byte_and_derived_keys_differ() -> None:
    secret = b"s" * 32
    keys = {p: cred.derive(secret, p) for p in ("http", "handoff", "kv")}
    assert len(set(keys.values())) == 3 and cred.derive(b"t" * 32, "kv") != keys["kv"]
    obj = {"b": [1, 2, {"c": "d"}], "a": 1.5}
    sig = cred.sign(keys["handoff"], obj)
    assert cred.signature_matches(
        keys["handoff"], {"a": 1.5, "b": [1, 2, {"c": "d"}]}, sig
    )  # key order is free
    for other in ({**obj, "a": 1.25}, {**obj, "b": [1, 2, {"c": "e"}]}, {**obj, "x": None}):
        assert not cred.signature_matches(keys["handoff"], other, sig)
    assert not cred.signature_matches(keys["kv"], obj, sig)
    for bad in (None, 5, sig[:-1], sig.upper()):
        assert not cred.signature_matches(keys["handoff"], obj, bad)
    assert not cred.signature_matches(
        keys["handoff"], {"a": float("nan")}, sig
    )  # not JSON: never matches


def test_dropped_counts_per_channel() -> None:
    dropped = cred.DroppedMessages()
    dropped.add("kv")
    dropped.add("kv", 2)
    dropped.add("http")
    assert dropped.counts() == {"worker": 0, "kv": 3, "http": 1, "handoff": 0}
    with pytest.raises(ValueError, match="unknown channel 'tcp'"):
        dropped.add("tcp")


def test_a_signature_of_any_characters_is_refused_not_raised() -> None:
    """A peer chooses the characters of what it sends; ``hmac.compare_digest`` raises on a
    non-ASCII str, so every comparison of a peer's string goes through ``strings_equal``."""
    key = b"k" * 32
    good = cred.sign(key, {"a": 1})
    assert cred.signature_matches(key, {"a": 1}, good)
    for forged in ("é" * len(good), "\udcff", good + "é", 7, None):
        assert not cred.signature_matches(key, {"a": 1}, forged), forged
        assert not cred.strings_equal(forged, good)
    from fastdeploy_mtp.splitwise.kv_mac import check_answer

    assert "does not hold" in (check_answer(key, "check", "r", "t", 0, {"mac": "é"}) or "")
