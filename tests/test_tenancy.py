"""The clients' credentials and prefix-cache namespaces (:mod:`fastdeploy_mtp.tenancy`): which
keys are accepted and how each refusal reads, which requests share a namespace, and that the
prefix cache's keys follow the namespace (the engine-level check is in
tests/runtime/test_prefix_caching.py, the served one in tests/serving/test_tenants.py)."""

from __future__ import annotations

import os

import pytest

from fastdeploy_mtp import tenancy
from fastdeploy_mtp.credentials import API_KEY_ENV, CredentialError
from fastdeploy_mtp.runtime.block_pool import ROOT_KEY, block_keys, namespace_root


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.delenv(tenancy.METRICS_KEY_ENV, raising=False)


def key_file(tmp_path: os.PathLike[str], text: str, mode: int = 0o600) -> str:
    path = os.path.join(tmp_path, "keys")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def test_keys_come_from_the_flag_the_environment_and_the_file(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tenancy.client_keys(None) == tenancy.ClientKeys()
    monkeypatch.setenv(API_KEY_ENV, " from-env ")
    assert tenancy.client_keys(None).api_keys == ("from-env",)
    assert tenancy.client_keys("flag").api_keys == ("flag",)
    path = key_file(tmp_path, "# tenants\n\ntenant-a\n  tenant-b  \n")
    keys = tenancy.client_keys("flag", path, "scraper", "global")
    assert keys == tenancy.ClientKeys(("flag", "tenant-a", "tenant-b"), "scraper", "global")
    monkeypatch.setenv(tenancy.METRICS_KEY_ENV, "scraper-env")
    assert tenancy.client_keys(None).metrics_key == "scraper-env"


@pytest.mark.parametrize(
    "api_key, text, metrics, scope, message",
    [
        ("  ", None, None, "per-key", "--api-key: the key is empty"),
        ("caf\u00e9", None, None, "per-key", "--api-key: the key holds '\u00e9'; .*visible ASCII"),
        ("a b", None, None, "per-key", "--api-key: the key holds ' '"),
        (None, "a\nb\na\n", None, "per-key", "line 3: the same key as an earlier line"),
        (None, "# only a comment\n", None, "per-key", "no key in the file"),
        (None, "ok\nbad\tkey\n", None, "per-key", r"line 2: the key holds '\\t'"),
        ("same", "same\n", None, "per-key", "holds the --api-key key too"),
        ("k", None, "k", "per-key", "--metrics-api-key: the same key as a client's"),
        ("k", None, None, "tenant", "--prefix-cache-scope: 'tenant' is not one of"),
    ],
)
def test_bad_keys_are_refused_naming_the_option_or_line(
    tmp_path, api_key, text, metrics, scope, message
) -> None:
    path = None if text is None else key_file(tmp_path, text)
    with pytest.raises(CredentialError, match=message):
        tenancy.client_keys(api_key, path, metrics, scope)


def test_a_key_file_others_can_read_or_that_is_not_ascii_is_refused(tmp_path) -> None:
    with pytest.raises(CredentialError, match="mode 0644 lets other users read it"):
        tenancy.client_keys(None, key_file(tmp_path, "k\n", 0o644))
    with open(key_file(tmp_path, ""), "wb") as f:
        f.write(b"ok\n\xc3\xa9\n")
    with pytest.raises(CredentialError, match="byte 3 is not ASCII"):
        tenancy.client_keys(None, os.path.join(tmp_path, "keys"))


def test_tenants_are_digests_of_their_keys_unless_the_scope_is_global() -> None:
    per_key = tenancy.ClientKeys(("key-a", "key-b"))
    a, b = per_key.tenant(0), per_key.tenant(1)
    assert a is not None and b is not None and a != b and len(a) == 32
    assert b"key-a" not in a
    assert per_key.tenant(None) is None
    assert tenancy.ClientKeys(("key-a", "key-b"), scope="global").tenant(0) is None


def test_namespaces_separate_every_tenant_and_salt_pair() -> None:
    ta, tb = b"a" * 32, b"b" * 32
    pairs = [(None, None), (ta, None), (tb, None), (None, "s"), (ta, "s"), (tb, "s"), (ta, "t")]
    spaces = [tenancy.cache_namespace(t, s) for t, s in pairs]
    assert spaces[0] == b""
    assert len(set(spaces)) == len(spaces)
    assert all(len(ns) == 32 for ns in spaces[1:])
    assert tenancy.cache_namespace(ta, "s") == tenancy.cache_namespace(ta, "s")
    assert tenancy.cache_namespace(None, "") != tenancy.cache_namespace(None, None)


@pytest.mark.parametrize(
    "salt, problem",
    [(None, None), ("x", None), ("", "non-empty"), (3, "non-empty string"), ("x" * 1025, "longer")],
)
def test_salts_are_non_empty_bounded_strings(salt, problem) -> None:
    got = tenancy.check_salt(salt)
    assert (got is None) if problem is None else (problem in got)


def test_block_keys_chain_from_the_namespace_root() -> None:
    tokens = list(range(40))
    plain = block_keys(tokens, 8, True)
    assert block_keys(tokens, 8, True, b"") == plain
    assert namespace_root(b"") == ROOT_KEY
    ns_a, ns_b = tenancy.cache_namespace(b"a" * 32, None), tenancy.cache_namespace(None, "s")
    keyed_a, keyed_b = block_keys(tokens, 8, True, ns_a), block_keys(tokens, 8, True, ns_b)
    assert len(plain) == len(keyed_a) == len(keyed_b) == 4
    assert not set(plain) & set(keyed_a) and not set(keyed_a) & set(keyed_b)
    assert block_keys(tokens, 8, True, ns_a) == keyed_a
