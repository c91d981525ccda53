"""Docs that cannot rot: every relative link and image in README.md and docs/ resolves, and every fedapp /
`python -m simulation` / `deploy/run_local.py` command in their bash blocks passes `--dry-run` (the whole
configuration checked, data included, nothing started). Commands on data under ../shared/data are skipped
when it is absent; commands on a user's own files that are not on this machine have their configuration
checked without the data."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedapp.config.run import parse_run_config
from fedapp.datasets import DATASETS, has_placeholder, is_source_spec, resolve_data_dir, source_path
from fedapp.datasets.common import OnDisk

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img[^>]+src=\"([^\"]+)\"")
FENCE = re.compile(r"^```(\w*)\s*$")
PREFIXES = {
    "fedapp": "fedapp",
    ".venv/bin/fedapp": "fedapp",
    "python -m simulation": "fedapp",
    ".venv/bin/python -m simulation": "fedapp",
    "python deploy/run_local.py": "deploy",
    ".venv/bin/python deploy/run_local.py": "deploy",
}
CHECKED = ("run", "experiment", "deploy")  # commands with --dry-run; the others are parsed only


@dataclass(frozen=True)
class Command:
    source: str  # file:line
    argv: tuple[str, ...]  # after the prefix, e.g. ("run", "--method", ...)

    def __str__(self) -> str:
        return f"{self.source}: {' '.join(self.argv)}"


def _links() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in LINK.finditer(line):
                target = match.group(1) or match.group(2)
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue  # web addresses and anchors within the page
                found.append((f"{doc.relative_to(ROOT)}:{number}", target))
    return found


def _commands() -> list[Command]:
    commands = []
    for doc in DOCS:
        in_fence, in_bash, pending, start = False, False, "", 0
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            fence = FENCE.match(line.strip())
            if fence:  # an opening fence says its language; the closing one ends any block
                in_fence = not in_fence
                in_bash = in_fence and fence.group(1) in ("bash", "sh", "")
                continue
            if not in_bash:
                continue
            if not pending:
                start = number
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            text, pending = pending.strip(), ""
            for prefix, kind in sorted(PREFIXES.items(), key=lambda item: -len(item[0])):
                if text.startswith(prefix + " "):
                    words = shlex.split(text[len(prefix) :], comments=True)
                    argv = ("deploy", *words) if kind == "deploy" else tuple(words)
                    commands.append(Command(f"{doc.relative_to(ROOT)}:{start}", argv))
                    break
    return commands


@pytest.mark.parametrize(("where", "target"), _links(), ids=lambda value: str(value)[:60])
def test_every_relative_link_and_image_resolves(where: str, target: str) -> None:
    doc = ROOT / where.rsplit(":", 1)[0]
    path = (doc.parent / target.split("#", 1)[0]).resolve()
    assert path.exists(), f"{where}: {target} does not exist"


def test_the_docs_hold_commands_to_check() -> None:
    commands = _commands()
    assert len(commands) >= 20 and any(c.argv[0] == "deploy" for c in commands)
    assert any(c.argv[0] == "run" for c in commands) and any(c.argv[0] == "predict" for c in commands)


def _option(argv: tuple[str, ...], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _missing_own_file(spec: str | None) -> bool:
    if spec is None or not is_source_spec(spec):
        return False
    partition = 0 if has_placeholder(spec) else None
    return not source_path(spec, partition).exists()


def _needs_shared_data(argv: tuple[str, ...]) -> bool:
    if resolve_data_dir(None) is not None:
        return False
    dataset = _option(argv, "--dataset") or ""
    if argv[0] == "experiment" or dataset.startswith("mat:"):
        return True
    return isinstance(DATASETS.get(dataset), OnDisk) or any(isinstance(DATASETS.get(w), OnDisk) for w in argv)


def _needs_gpu(argv: tuple[str, ...]) -> bool:
    from fedapp.launch.options import cuda_device_count

    wants = _option(argv, "--device") == "cuda" or float(_option(argv, "--gpus-per-client") or 0) > 0
    return wants and cuda_device_count() == 0


def _elsewhere(argv: tuple[str, ...], folder: Path) -> tuple[str, ...]:
    """The command with an `--out` that exists here (a developer ran the documented command: a dry run
    refuses to overwrite it) moved to `folder`; the rest as written."""
    out = _option(argv, "--out")
    if out is None or not (ROOT / out).exists():
        return argv
    moved, words = str(folder / Path(out).name), list(argv)
    for i, word in enumerate(words):
        if word == "--out":
            words[i + 1] = moved
        elif word.startswith("--out="):
            words[i] = f"--out={moved}"
    return tuple(words)


def _without_machine_options(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A command without what names other machines: `deploy --containers` as the same deployment of
    processes (no engine, images or site files), `run --ray-address` on a Ray of its own (no cluster)."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--superlink-image", "--supernode-image", "--ray-address"):
            skip = True
        elif word != "--containers":
            kept.append(word)
    return tuple(kept)


@pytest.mark.parametrize("command", _commands(), ids=str)
def test_every_documented_command_passes_a_dry_run(
    command: Command, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from deploy.run_local import main as deploy_main
    from fedapp.launch.options import parse_set_options
    from fedapp.launch.resolve import build_overrides
    from simulation.__main__ import _parser, main

    monkeypatch.chdir(ROOT)
    argv = _elsewhere(command.argv, tmp_path)
    if _needs_shared_data(argv):
        pytest.skip("needs ../shared/data")
    if _needs_gpu(argv):
        pytest.skip("needs a CUDA GPU")
    if argv[0] not in CHECKED:
        _parser().parse_args(list(argv))  # predict, datasets, methods, stop-local-superlink: they parse
        return
    spec = _option(argv, "--node-data") or _option(argv, "--dataset")
    if "--containers" in argv or "--ray-address" in argv:  # what is not on this machine: the rest checked
        argv = _without_machine_options(argv)
    if _missing_own_file(spec):  # a user's file that is not here: the configuration alone
        if argv[0] == "deploy":
            code = deploy_main([*argv[1:], "--dry-run"]) if _option(argv, "--node-data") else 2
            assert code == 0, f"{command}\n{capsys.readouterr().err}"
            return
        args = _parser().parse_args(list(argv))
        base = {"method": args.method, "dataset": args.dataset, **parse_set_options(args.set)}
        if args.clients:
            base["num-clients"] = args.clients
        parse_run_config(build_overrides(base, args.out))
        return
    code = main([*argv, "--dry-run"])
    err = capsys.readouterr().err
    if code == 2 and "no CUDA GPU is visible" in err:  # a GPU preset
        pytest.skip("needs a CUDA GPU")
    if code == 2 and "no data directory was found" in err and resolve_data_dir(None) is None:
        pytest.skip("needs ../shared/data (a preset's dataset)")
    assert code == 0, f"{command}\n{err}"
