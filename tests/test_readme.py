"""The README's "Try it" runs as a newcomer runs it, and says what it does.

The README's first code block is the newcomer's path: ``pip install .`` (the base install, no
extras), ``fastdeploy-mtp serve &``, wait for ``/health``, one ``curl``. This test runs that
block's serve line through the installed console script, as a shell does, from a directory
holding a ``fastdeploy_mtp/`` folder that cannot be imported: the README is followed from a
clone's root, whose source tree (without its native build) must not shadow the installed
package in any process ``serve`` starts. The rest of the block runs in bash as written, only
the address replaced by the test server's; the curl's answer must be a completion within the
block's ``max_tokens``. The README's python block (the ``openai`` client) then runs against the
same server. ``pip install .`` itself is not rerun here (the suite runs on the installed
package); that the base install carries every import the package makes is
``test_the_package_imports_only_what_the_base_install_carries``.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.support.servers import ServerProcess, stopped_cleanly

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ADDRESS = "127.0.0.1:8000"


def fenced_blocks() -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of the README, in order."""
    text = README.read_text()
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)


def logical_lines(code: str) -> list[str]:
    """The block's commands: backslash continuations joined, blank lines dropped."""
    return [line for line in code.replace("\\\n", " ").splitlines() if line.strip()]


def try_it() -> tuple[list[str], list[str], str]:
    """``(the pip line's words, serve's arguments, the commands after serve)`` of the README's
    first code block, checked to have the shape the README promises."""
    language, code = fenced_blocks()[0]
    assert language == "bash", "the README's first code block is not the bash of 'Try it'"
    lines = logical_lines(code)
    pip = shlex.split(lines[0], comments=True)
    serve = shlex.split(lines[1], comments=True)
    assert serve[:2] == ["fastdeploy-mtp", "serve"] and serve[-1] == "&", lines[1]
    return pip, serve[2:-1], "\n".join(lines[2:])


def test_try_it_installs_the_base_package_only():
    pip, _, _ = try_it()
    assert pip == ["pip", "install", "."], f"the first step is not the base install: {pip}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _, args, _ = try_it()
    here = tmp_path_factory.mktemp("clone-root")
    shadow = here / "fastdeploy_mtp"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ImportError('a source tree in the working directory shadowed the package')\n"
    )
    script = Path(sys.executable).with_name("fastdeploy-mtp")
    assert script.exists(), f"no console script next to {sys.executable}"
    srv = ServerProcess(args, slots=None, cli=[str(script)], cwd=str(here))
    try:
        yield srv, here
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)


def test_try_it_answers_a_completion(server):
    srv, here = server
    _, _, rest = try_it()
    assert ADDRESS in rest, "the block no longer talks to the default address"
    script = "set -euo pipefail\n" + rest.replace(ADDRESS, f"127.0.0.1:{srv.port}")
    done = subprocess.run(
        ["bash", "-c", script], cwd=here, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    asked = json.loads(re.search(r"-d '(\{.*?\})'", rest)[1])
    assert body["object"] == "text_completion", body
    (choice,) = body["choices"]
    assert choice["finish_reason"] in ("stop", "length"), body
    assert 1 <= body["usage"]["completion_tokens"] <= asked["max_tokens"], body
    assert choice["text"], body
    assert "Traceback" not in srv.output(), srv.output()


def test_the_readme_client_example_runs(server):
    srv, here = server
    (code,) = [c for lang, c in fenced_blocks() if lang == "python"][:1]
    assert f"http://{ADDRESS}/v1" in code
    code = code.replace(f"http://{ADDRESS}/v1", f"{srv.base_url}/v1")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"\b(stop|length)$", done.stdout, flags=re.M), done.stdout


def third_party_imports() -> dict[str, set[str]]:
    """``{top-level module: {package files importing it}}`` of every import in
    ``fastdeploy_mtp/`` that is neither the standard library nor the package itself, lazy
    imports inside functions included."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "fastdeploy_mtp").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "fastdeploy_mtp":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


#: modules the package imports only where an extra is installed, each behind an error that
#: names the extra: the reference `check-drafts` compares with (`test`) and the Mooncake
#: transfer engine (`pd`)
EXTRA_ONLY = {"torch": "test", "transformers": "test", "mooncake": "pd"}


def test_the_package_imports_only_what_the_base_install_carries():
    base = {
        re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")
        for req in metadata.requires("fastdeploy_mtp") or []
        if "extra ==" not in req
    }
    providers = metadata.packages_distributions()
    missing = {}
    for module, files in sorted(third_party_imports().items()):
        if module in EXTRA_ONLY:
            for file in files:  # where it is missing, the error says which extra brings it
                assert f".[{EXTRA_ONLY[module]}]" in (ROOT / file).read_text(), (module, file)
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not dists & base:
            missing[module] = sorted(files)
    assert not missing, f"imported, but not in the base install's dependencies: {missing}"
